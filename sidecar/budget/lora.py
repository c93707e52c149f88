"""LoRA adapter slots: the memory vLLM sets aside when it serves with ``--enable-lora``.

Theory of operation
-------------------
With ``--enable-lora`` vLLM replaces every layer an adapter could touch by a wrapper that holds
``--max-loras`` adapter *slots* of rank ``--max-lora-rank``, allocated zeroed when the model loads
(``create_lora_weights`` in ``vllm/lora/layers/*.py``; ``load_lora_model`` runs inside the "Model loading
took" measurement of ``v1/worker/gpu_model_runner.py``). They are taken before the profile, so every byte of
them comes out of the KV pool, whatever adapters are later loaded. Each rule below was read in vLLM 0.32.0 as
installed (and the slot shapes compared in the 0.12.0 and 0.20.0 wheels: the same), and the sum was checked on
the real CPU engine for a dense model with and without embedding slots, a fused-QKV (Phi-3), two MoE and an
MLA model (``tests/e2e/test_lora_slots.py``: every buffer of the loaded model, to the byte).

Per slot, with ``r`` the rank, ``H`` the hidden size and ``tp`` the tensor-parallel size (``lora_dtype`` auto:
the model's dtype):

* **Column-parallel projections** (QKV, gate-up, MLA's ``q_b_proj`` / ``kv_b_proj``): ``A`` is ``r x input``
  per *slice* (three for a QKV packed from ``q_proj``, ``k_proj``, ``v_proj``, two for a gate-up, one for a
  projection fused on disk, as Phi-3's), ``B`` is ``output / tp x r`` (KV heads replicated below one per GPU,
  as the base layer does). ``--fully-sharded-loras`` splits ``A``'s rank by ``tp`` instead.
* **Row-parallel projections** (``o_proj``, ``down_proj``): ``A`` is ``r x input / tp``, ``B`` ``H x r``
  (``H / tp`` fully sharded). **Replicated** ones (a MoE router, MLA's ``kv_a_proj_with_mqa``): ``r x
  input`` and ``output x r``; MLA's fused ``q_a`` / ``kv_a`` projection is built without TP (``disable_tp``).
* **MoE routers and shared experts**: the router is replicated (``r x H`` and ``experts x r``), a shared
  expert is a gated MLP as above, and Qwen2-MoE's shared-expert gate a replicated ``H -> 1`` projection.
* **Routed experts** (``FusedMoEWithLoRA``, from 0.12.0): per expert on the GPU, ``w13`` ``A`` two slices of
  ``r x H`` and ``B`` two of ``I_p x r``, ``w2`` ``A`` ``r x I_p`` and ``B`` ``H x r``, ``I_p`` the expert
  width on the GPU. Before 0.12.0 experts had no slots.
* **Embeddings and LM head**, only for the classes that list them in ``embedding_modules``: ``vocab x r`` plus
  ``H x r`` for the token embeddings, ``r x H`` plus ``vocab x r`` for the LM head (vLLM refuses an LM head
  slot for a vocabulary above 258,048). Which classes list them, support LoRA at all, or fuse QKV or gate-up
  on disk is read from vLLM's registry by ``scripts/gen_vllm_model_classes.py`` into
  ``vllm_model_classes.json`` (:mod:`sidecar.budget.vllm_classes`); a class it does not know is planned
  Llama-shaped, without embedding slots.

**CUDA graphs**: with LoRA, vLLM captures every graph twice, with and without adapters
(``cudagraph_specialize_lora``, on by default from 0.12.0; ``CudagraphDispatcher._get_lora_cases``), so the
default CUDA-graph estimate doubles (a measured ``--cuda-graph-memory`` is taken as given).

**``--lora-target-modules``** (vLLM 0.20 on; absent in 0.15.0) keeps slots only in the layers it names:
a layer name's last part that is listed, or a packed layer one of whose parts is (``q_proj`` gives the whole
packed ``qkv_proj`` its slots), as ``is_in_target_modules`` decides with the class's
``packed_modules_mapping`` (read from the registry; what classes add at run time, DeepSeek's
``fused_qkv_a_proj`` and the MoE classes' ``gate_up_proj``, is added here); the embeddings and LM head only
when listed. Checked on the real CPU engine with five families (Llama, Phi-3, OLMo, Qwen2-MoE, DeepSeek-V2)
(``tests/e2e/test_lora_slots.py``).

Not modelled: ``--lora-dtype`` other than the model's (only an fp32 checkpoint would differ), target names
of non-gated MLPs (Falcon's, GPT-2's: their layers keep slots), adapters on a vision tower
(``--enable-tower-connector-lora``), ``--enable-moe-shared-loras``, and the 256 extra vocabulary rows of
releases before 0.12.0 (a few MiB per slot).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from sidecar.budget.architecture import Architecture, MlaSpec
from sidecar.budget.dtypes import FLOAT_DTYPES, serving_dtype, weight_bytes_per_param
from sidecar.budget.parameters import dense_mlp_width
from sidecar.budget.vllm_classes import vllm_class_table, vllm_class_table_version
from sidecar.budget.vllm_release import VllmRelease
from sidecar.errors import UsageError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

LORA_RANKS: Final = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM accepts for ``--max-lora-rank`` (``MaxLoRARanks``, ``vllm/config/lora.py``, 0.20-0.32)."""
DEFAULT_MAX_LORAS: Final = 1
"""vLLM's ``--max-loras`` default: adapters in one batch, each a slot in every wrapped layer."""
DEFAULT_MAX_LORA_RANK: Final = 16
"""vLLM's ``--max-lora-rank`` default."""
MAX_LM_HEAD_VOCAB: Final = 258_048
"""The largest vocabulary vLLM gives an LM head adapter slots (``LogitsProcessorWithLoRA``)."""
TARGET_MODULES_SINCE: Final = 20
"""The first minor release read with ``--lora-target-modules`` (0.20.0; 0.15.0 has none)."""
EXPERT_SLOTS_SINCE: Final = 12
"""The minor release from which routed experts have adapter slots and graphs are captured twice."""
SHARED_EXPERT_GATE_TYPES: Final = frozenset({"qwen2_moe", "qwen3_next"})
"""Model types whose shared expert has a gate of its own (``shared_expert_gate``, a replicated linear)."""
_QKV_SLICES, _GATE_UP_SLICES = 3, 2


@dataclass(frozen=True, slots=True)
class LoraSlots:
    """vLLM's ``--enable-lora`` settings that size the adapter slots."""

    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    fully_sharded: bool = False  # vLLM --fully-sharded-loras
    target_modules: frozenset[str] | None = None  # vLLM --lora-target-modules (None: every supported one)

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise UsageError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank not in LORA_RANKS:
            raise UsageError(
                f"vLLM refuses --max-lora-rank {self.max_lora_rank}: use one of "
                + ", ".join(map(str, LORA_RANKS))
            )


@dataclass(frozen=True, slots=True)
class ClassFacts:
    """What vLLM's model class declares about LoRA (see the module docstring)."""

    known: bool
    supports_lora: bool = True
    embeddings: tuple[str, ...] = ()
    qkv_slices: int = _QKV_SLICES
    gate_up_slices: int = _GATE_UP_SLICES
    packed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # packed module -> its parts


def lora_table_version() -> str:
    """The vLLM release the class table was read from (:mod:`sidecar.budget.vllm_classes`)."""
    return vllm_class_table_version()


def class_facts(class_name: str | None) -> ClassFacts:
    """The LoRA facts of ``class_name`` (a config's ``architectures[0]``), Llama-shaped when unknown."""
    table = vllm_class_table()
    if class_name in table["without_lora"]:
        return ClassFacts(known=True, supports_lora=False)
    facts = table["with_lora"].get(class_name or "")
    if facts is None:
        return ClassFacts(known=False)
    return ClassFacts(
        known=True,
        embeddings=tuple(facts["embeddings"]),
        qkv_slices=facts.get("qkv_slices", _QKV_SLICES),
        gate_up_slices=facts.get("gate_up_slices", _GATE_UP_SLICES),
        packed={name: tuple(parts) for name, parts in facts.get("packed", {}).items()},
    )


def check_lora(arch: Architecture, slots: LoraSlots, tensor_parallel_size: int) -> None:
    """Refuse what vLLM refuses to start with LoRA, in one line each."""
    facts = class_facts(arch.class_name)
    if not facts.supports_lora:  # a known class without LoRA: vLLM stops at start-up
        raise UsageError(
            f"vLLM refuses --enable-lora for {arch.class_name}: it does not support LoRA "
            "(vLLM's own error: 'does not support LoRA yet'); serve it without adapters"
        )
    if "lm_head" in facts.embeddings and arch.vocab_size > MAX_LM_HEAD_VOCAB:
        raise UsageError(
            f"vLLM refuses --enable-lora for {arch.class_name}: its vocabulary of {arch.vocab_size:,} is "
            f"above the {MAX_LM_HEAD_VOCAB:,} an LM head adapter allows"
        )
    if slots.fully_sharded and slots.max_lora_rank % tensor_parallel_size:
        raise UsageError(
            f"--fully-sharded-loras splits the rank over the {tensor_parallel_size} GPUs: "
            f"--max-lora-rank {slots.max_lora_rank} must divide by it"
        )


def lora_graph_copies(slots: LoraSlots | None, release: VllmRelease) -> int:
    """How many times vLLM captures each CUDA graph: twice with LoRA from 0.12 (with and without adapters)."""
    return 2 if slots is not None and release.at_least(EXPERT_SLOTS_SINCE) else 1


def _column(rank_a: int, rank: int, inputs: int, outputs_per_gpu: int, slices: int = 1) -> int:
    return slices * rank_a * inputs + outputs_per_gpu * rank


def _row(rank: int, inputs_per_gpu: int, outputs: int) -> int:
    return rank * inputs_per_gpu + outputs * rank


@dataclass(frozen=True, slots=True)
class _Shapes:
    """The per-slot element counts of one GPU's wrapped layers."""

    arch: Architecture
    slots: LoraSlots
    tp: int
    facts: ClassFacts

    @property
    def rank(self) -> int:
        return self.slots.max_lora_rank

    def _inferred_packing(self) -> dict[str, tuple[str, ...]]:
        """Llama's packing, for what a class leaves out of its declared mapping.

        A class that declares none gets its layers' (``get_packed_modules_mapping``, as OLMo's); Qwen2-MoE and
        Qwen3-MoE add ``gate_up_proj`` at run time when a shared expert or dense layers exist.
        """
        packing: dict[str, tuple[str, ...]] = {}
        if self.facts.qkv_slices > 1:
            packing["qkv_proj"] = ("q_proj", "k_proj", "v_proj")
        if self.facts.gate_up_slices > 1:
            packing["gate_up_proj"] = ("gate_proj", "up_proj")
        return packing

    def wraps(self, module: str) -> bool:
        """Whether vLLM gives ``module`` (a layer name's last part) slots under ``--lora-target-modules``.

        As ``is_in_target_modules`` (``vllm/lora/utils.py``, 0.32.0): the name itself, or a packed module
        one of whose parts is named, or a part whose packed module is named.
        """
        targets = self.slots.target_modules
        if targets is None or module in targets:
            return True
        packed = self._inferred_packing() | dict(self.facts.packed)
        mla = self.arch.mla
        if mla is not None and mla.q_lora_rank:  # DeepseekV2ForCausalLM adds it when it fuses q_a and kv_a
            packed.setdefault("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))
        if any(part in targets for part in packed.get(module, ())):
            return True
        return any(module in parts and name in targets for name, parts in packed.items())

    @property
    def rank_a(self) -> int:  # a column-parallel A's rank: split by TP when fully sharded
        return self.rank // self.tp if self.slots.fully_sharded else self.rank

    @property
    def row_out(self) -> int:  # a row-parallel B's rows: split by TP when fully sharded
        hidden = self.arch.hidden_size
        return hidden // self.tp if self.slots.fully_sharded else hidden

    def attention(self) -> int:
        arch, tp, r = self.arch, self.tp, self.rank
        if arch.mla is not None:
            return self.mla(arch.mla)
        q = arch.num_attention_heads * arch.head_dim
        kv = arch.kv_heads_per_gpu(tp) * arch.head_dim
        qkv = _column(self.rank_a, r, arch.hidden_size, q // tp + 2 * kv, self.facts.qkv_slices)
        return qkv * self.wraps("qkv_proj") + _row(r, q // tp, self.row_out) * self.wraps("o_proj")

    def mla(self, mla: MlaSpec) -> int:
        arch, tp, r = self.arch, self.tp, self.rank
        hidden, heads = arch.hidden_size, arch.num_attention_heads
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        q_out = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) // tp
        if mla.q_lora_rank:  # fused q_a / kv_a (no TP), then q_b from the query latent
            down = _column(r, r, hidden, mla.q_lora_rank + latent, 2) * self.wraps("fused_qkv_a_proj")
            query = _column(self.rank_a, r, mla.q_lora_rank, q_out) * self.wraps("q_b_proj")
        else:  # q_proj column-parallel, kv_a_proj_with_mqa replicated
            down = _column(r, r, hidden, latent) * self.wraps("kv_a_proj_with_mqa")
            query = _column(self.rank_a, r, hidden, q_out) * self.wraps("q_proj")
        kv_out = heads * (mla.qk_nope_head_dim + mla.v_head_dim) // tp
        kv_up = _column(self.rank_a, r, mla.kv_lora_rank, kv_out) * self.wraps("kv_b_proj")
        out = _row(r, heads * mla.v_head_dim // tp, self.row_out) * self.wraps("o_proj")
        return down + query + kv_up + out

    def mlp(self, width: int) -> int:
        gated = self.arch.shape.gated_mlp  # gate and up: two outputs, in one slice when fused on disk (Phi-3)
        slices = self.facts.gate_up_slices if gated else 1
        outputs = (2 if gated else 1) * width // self.tp
        up = _column(self.rank_a, self.rank, self.arch.hidden_size, outputs, slices)
        down = _row(self.rank, width // self.tp, self.row_out)
        if not gated:  # Falcon's, GPT-2's names are not modelled: their MLPs keep their slots
            return up + down
        return up * self.wraps("gate_up_proj") + down * self.wraps("down_proj")

    def moe(self, request: PlanRequest) -> int:
        moe, placement = self.arch.moe, request.experts
        assert moe is not None  # noqa: S101 - only called for MoE layers
        assert placement is not None  # noqa: S101
        hidden, r = self.arch.hidden_size, self.rank
        width = moe.expert_intermediate_size // placement.width_shards
        w13 = 2 * self.rank_a * hidden + 2 * width * r
        w2 = r * width + self.row_out * r
        with_slots = request.release.at_least(EXPERT_SLOTS_SINCE)
        experts = placement.experts_per_gpu * (w13 + w2) * self.wraps("experts") if with_slots else 0
        router = _column(r, r, hidden, moe.num_experts) * self.wraps("gate")
        shared = self.mlp(moe.shared_intermediate_size) if moe.shared_intermediate_size else 0
        if moe.shared_intermediate_size and self.arch.model_type in SHARED_EXPERT_GATE_TYPES:
            shared += _column(r, r, hidden, 1) * self.wraps("shared_expert_gate")  # one output, replicated
        return experts + router + shared

    def embeddings(self) -> int:
        arch, r = self.arch, self.rank
        total = 0
        embed = next((name for name in ("embed_tokens", "wte") if name in self.facts.embeddings), None)
        if embed is not None and self.wraps(embed):
            total += arch.vocab_size * r + arch.hidden_size * r
        if "lm_head" in self.facts.embeddings and self.wraps("lm_head"):
            total += r * arch.hidden_size + arch.vocab_size * r
        return total


def lora_dtype_bytes(request: PlanRequest) -> float:
    """Bytes of one slot element: ``lora_dtype`` auto is the model's dtype (a float weight dtype if asked)."""
    dtype = request.effective_weight_dtype
    if dtype not in FLOAT_DTYPES:
        dtype = serving_dtype(request.architecture.dtype)
    return weight_bytes_per_param(dtype)


def lora_slot_bytes(request: PlanRequest, slots: LoraSlots) -> int:
    """Bytes of adapter slots on one GPU of ``request``'s deployment (every layer, every slot)."""
    arch = request.architecture
    shapes = _Shapes(arch, slots, request.tensor_parallel_size, class_facts(arch.class_name))
    moe = arch.moe
    per_slot = shapes.embeddings()
    for layer in range(arch.num_layers):
        per_slot += shapes.attention()
        if moe is not None and moe.is_moe_layer(layer):
            per_slot += shapes.moe(request)
        else:
            per_slot += shapes.mlp(dense_mlp_width(arch))
    return round(slots.max_loras * per_slot * lora_dtype_bytes(request))
