"""Which of vLLM's two GPU model runners a deployment runs, per release, and what that changes in the plan.

Theory of operation
-------------------
vLLM's V1 engine has had two GPU model runners: V1 (``vllm/v1/worker/gpu_model_runner.py``) and V2
(``vllm/v1/worker/gpu/model_runner.py``; its log says "Using V2 Model Runner", and its lines are tagged
``[model_runner.py:...]`` where V1's are ``[gpu_model_runner.py:...]``). ``VllmConfig.use_v2_model_runner``
(``vllm/config/vllm.py``) picks one at start-up: ``VLLM_USE_V2_MODEL_RUNNER`` when set, else V2 for the
models and settings its release lists, else V1. Read in the release wheels from PyPI (0.21.0-0.34.0; 0.32.0
in the CPU wheel this project installs), on CUDA:

* up to 0.21: V1 (``VLLM_USE_V2_MODEL_RUNNER`` defaults to false, ``vllm/envs.py``);
* 0.22: V2 for ``Qwen3ForCausalLM``, 0.23 also ``LlamaForCausalLM`` and ``MistralForCausalLM``: dense and
  unquantised checkpoints only (``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``,
  ``_is_default_v2_model_runner_model``);
* 0.24: those and three MoE classes (:data:`LISTED_CLASSES_0_24`), quantised or not;
* 0.25-0.26: every dense model without state layers (vLLM's ``is_hybrid``), and the listed MoE classes;
* 0.27-0.28: state-layer models too where their class is listed;
* 0.29-0.33: every generating model ("the first tagged release with this default will be v0.29.0", vLLM's
  migration note on commit 4aab2b0);
* 0.34: V2 only (V1's ``gpu_model_runner.py`` is gone from the wheel).

Before 0.34 a setting V2 lacks sends the engine back to V1 with a warning
(``_get_v2_model_runner_unsupported_features``); of what a plan knows, that is the speculative method
(:func:`v2_takes_speculative_method`). Platforms without Triton run V1 ("Model Runner V2 requires Triton"):
this project's CPU server does, which is why :attr:`PlanRequest.model_runner` can name one.

What the runner changes in the plan: what the start-up profile's sampler stage holds and what the runner
keeps beside it (:mod:`sidecar.budget.sampler_pass`), and how many batches are in flight, which a
sliding-window layer's cap counts (``VllmConfig.max_concurrent_batches``, 0.26.0-0.33.0: with async
scheduling, V2 keeps ``pipeline stages + 1`` batches in flight and V1 two at one stage, else the stages;
0.34.0: ``stages + 1`` with async scheduling).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Final

from sidecar.budget.layer_kinds import vllm_is_hybrid

if TYPE_CHECKING:
    from sidecar.budget.architecture import Architecture
    from sidecar.budget.vllm_release import VllmRelease


class ModelRunner(StrEnum):
    """vLLM's GPU model runner: the spelling of ``VLLM_USE_V2_MODEL_RUNNER`` is ``0`` for V1, ``1`` for V2."""

    V1 = "v1"
    V2 = "v2"


DENSE_CLASSES_BY_RELEASE: Final = {
    22: frozenset({"Qwen3ForCausalLM"}),
    23: frozenset({"Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}),
}
"""0.22 and 0.23: the classes that default to V2, when dense and unquantised."""
LISTED_CLASSES_0_24: Final = frozenset(
    {"Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "DeepseekV2ForCausalLM",
     "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}
)  # fmt: skip
"""0.24's ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``: these default to V2, others to V1."""
LISTED_MOE_CLASSES: Final = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
     "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration", "LongcatFlashNgramForCausalLM",
     "Qwen2MoeForCausalLM"}
)  # fmt: skip
"""0.25-0.28: MoE (and, from 0.27, state-layer) classes that default to V2 (0.28's list, a superset of the
earlier ones; a class not in a release's list is not in the model registry of that release either)."""
V2_SPECULATIVE_METHODS: Final = frozenset(
    {"eagle", "eagle3", "mtp", "dflash", "dspark", "extract_hidden_states"}
)
"""Up to 0.29 the speculative methods V2 runs (0.22: eagle, eagle3, mtp; dflash 0.24+, dspark 0.25+)."""
V1_ONLY_SPECULATIVE_METHODS: Final = {
    30: frozenset(
        {"ngram", "ngram_gpu", "draft_model", "suffix", "medusa", "mlp_speculator", "custom_class"}
    ),
    31: frozenset({"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator", "custom_class"}),
    32: frozenset({"suffix", "medusa", "mlp_speculator", "custom_class"}),
    33: frozenset({"suffix", "custom_class"}),
}
"""0.30-0.33: the speculative methods V2 refuses (so the engine runs V1)."""


def v2_takes_speculative_method(release: VllmRelease, method: str) -> bool:
    """Whether the V2 runner of ``release`` runs speculative decoding by ``method`` (vLLM's spelling)."""
    name = "mtp" if method == "deepseek_mtp" else method
    if release.at_least(34):
        return True
    if release.at_least(30):
        refused = V1_ONLY_SPECULATIVE_METHODS[min(release.minor, 33)]
        return name not in refused
    return name in V2_SPECULATIVE_METHODS


def _release_lists_model(release: VllmRelease, arch: Architecture) -> bool:
    """Whether ``release`` sends this model to V2 by default (before settings that V2 lacks)."""
    name = arch.class_name or ""
    moe = arch.moe is not None
    if release.at_least(29):
        return True
    if release.at_least(25):
        if vllm_is_hybrid(arch.kv_kinds):
            return release.at_least(27) and name in LISTED_MOE_CLASSES
        return not moe or name in LISTED_MOE_CLASSES
    if release.at_least(24):
        return name in LISTED_CLASSES_0_24
    classes = DENSE_CLASSES_BY_RELEASE.get(release.minor, frozenset())
    return release.at_least(22) and name in classes and not moe and arch.quantization is None


def default_model_runner(
    release: VllmRelease, arch: Architecture, speculative_method: str | None
) -> ModelRunner:
    """The runner ``release`` picks on CUDA for this model, when ``VLLM_USE_V2_MODEL_RUNNER`` is unset."""
    if release.at_least(34):
        return ModelRunner.V2
    if not _release_lists_model(release, arch):
        return ModelRunner.V1
    if speculative_method is not None and not v2_takes_speculative_method(release, speculative_method):
        return ModelRunner.V1
    return ModelRunner.V2


def batches_in_flight(
    release: VllmRelease, runner: ModelRunner, *, pipeline_stages: int, async_scheduling: bool
) -> int:
    """Batches scheduled but not yet settled, which a sliding-window layer's cap counts.

    ``VllmConfig.max_concurrent_batches`` from 0.26.0: with async scheduling ``stages + 1`` on V2 and, on V1,
    2 at one stage (V1 does not overlap pipeline stages: ``stages``); without it ``stages``. Before 0.26
    the cap adds one batch (``max_num_batched_tokens``).
    """
    if not release.at_least(26):
        return 1
    if async_scheduling and runner is ModelRunner.V2:
        return pipeline_stages + 1
    if async_scheduling and pipeline_stages == 1:
        return 2
    return pipeline_stages
