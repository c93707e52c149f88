"""KV cache groups: a hybrid model's request holds blocks in every group, a sliding one up to its window's cap."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sidecar.admission.capacity import CapacityLedger, Demand
from sidecar.admission.geometry import (
    SINGLE_GROUP,
    GroupLayout,
    PoolView,
    engine_blocks_per_request,
    resolve_layout,
)
from sidecar.admission.prefix_cache import prompt_hashes
from sidecar.admission.rates import Steps
from sidecar.budget.architecture import Architecture, LayerKind, architecture_from_config
from sidecar.budget.catalog import resolve_model
from sidecar.budget.kv_groups import KvGroups, kv_groups, sliding_window_blocks
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.pool import admission_pool
from sidecar.signals import parse_vllm_metrics
from sidecar.units import GIB
from tests.fake_vllm import substitute_label

DATA = Path(__file__).parents[1] / "data" / "vllm"
HYBRID_PAGE = DATA / "vllm-0.32.0-cpu-tiny-hybrid.prom"  # 16 blocks, kv_cache_max_concurrency 1.33
HYBRID_CONFIG = DATA / "tiny-hybrid-config.json"  # one full and one 128-token sliding layer
FULL, SLIDING, NONE = LayerKind.FULL, LayerKind.SLIDING, LayerKind.NONE


@pytest.mark.parametrize(
    ("kinds", "groups"),
    [
        ((FULL,) * 32, KvGroups(1, 0, 32)),  # Llama: one group
        ((SLIDING,) * 32, KvGroups(0, 1, 32)),  # Mistral v0.1: every layer windowed, one group
        ((SLIDING, FULL) * 12, KvGroups(1, 1, 12)),  # gpt-oss-20b: one group of each
        ((FULL, SLIDING), KvGroups(1, 1, 1)),  # the tiny hybrid model (the real server logs "(128, 128)")
        (
            ((SLIDING,) * 5 + (FULL,)) * 10 + (SLIDING,) * 2,
            KvGroups(1, 6, 10),
        ),  # Gemma 3 27B: 52 + 10, padded
        ((SLIDING,) * 12 + (FULL,) * 13, KvGroups(1, 1, 13)),  # gpt-oss-20b + EAGLE: padded to 13 + 13
        ((FULL, NONE, NONE, NONE) * 4, KvGroups(1, 0, 4)),  # linear-attention layers hold no KV blocks
    ],
)
def test_groups_are_formed_as_vllm_forms_them(kinds: tuple[LayerKind, ...], groups: KvGroups) -> None:
    assert kv_groups(kinds) == groups


@pytest.mark.parametrize(
    ("window", "in_flight", "max_model_len", "block_size", "blocks"),
    [
        (128, 256, 1024, 128, 4),  # the real CPU server: 12 blocks per request = 8 full + 4 sliding
        (128, 512, 1024, 128, 6),  # two batches in flight (async scheduling)
        (4096, 8192, 8192, 16, 513),  # the window plus a batch reaches max_model_len: all of it, plus one
        (4, 1, 100, 4, 2),  # vLLM's own example: a 4-token window needs [XXCD][EF]
    ],
)
def test_a_sliding_window_holds_its_window_and_the_tokens_in_flight(
    window: int, in_flight: int, max_model_len: int, block_size: int, blocks: int
) -> None:
    assert sliding_window_blocks(window, in_flight, max_model_len, block_size) == blocks


@pytest.mark.parametrize(
    ("layout", "tokens", "blocks"),
    [
        (SINGLE_GROUP, 129, 2),
        (GroupLayout(1, 1, 4), 100, 2),  # short: the window holds all of it too
        (GroupLayout(1, 1, 4), 830, 7 + 4),  # long: the sliding group stops at its cap
        (GroupLayout(1, 6, 2), 1000, 8 + 6 * 2),
        (GroupLayout(0, 1, 3), 1000, 3),
        (GroupLayout(1, 0, 0, 3, 8), 1000, 8 + 3 * 8),  # Llama 4 at max_model_len = chunk: every block
        (GroupLayout(1, 0, 0, 3, 4), 1000, 8 + 3 * 4),  # chunked groups stop at one chunk + in flight
        (
            GroupLayout(1, state=3, state_blocks=2),
            1000,
            8 + 3 * 2,
        ),  # Qwen3-Next: two blocks per DeltaNet group
        (GroupLayout(1, state=3, state_blocks=2), 1, 1 + 3 * 2),  # whatever the length
        (GroupLayout(1, state=3, state_blocks=2), 0, 0),  # nothing before the first token
    ],
)
def test_a_sequence_holds_blocks_in_every_group(layout: GroupLayout, tokens: int, blocks: int) -> None:
    assert layout.blocks(tokens, 128) == blocks


@pytest.mark.parametrize(
    ("engine", "groups", "predicted", "layout"),
    [
        (8, None, None, SINGLE_GROUP),  # the engine's figure is one group's
        (None, None, None, SINGLE_GROUP),  # an engine that does not say: one group, as before
        (12, (1, 1, 0), None, GroupLayout(1, 1, 4)),  # the tiny hybrid server: the cap from the engine
        (None, (1, 1, 0), 4, GroupLayout(1, 1, 4)),  # no engine figure: the prediction's cap
        (None, (1, 1, 0), 20, GroupLayout(1, 1, 9)),  # never more than vLLM's: the whole request and one
        (8, (1, 0, 0), None, SINGLE_GROUP),
        (32, (1, 0, 3), None, GroupLayout(1, 0, 0, 3, 8)),  # Llama-4-Scout's four groups of 12 layers
        (20, (1, 0, 3), None, GroupLayout(1, 0, 0, 3, 4)),  # a chunk shorter than the request
        (None, (1, 0, 3), 4, GroupLayout(1, 0, 0, 3, 4)),
        (8 + 3 * 2, (1, 0, 0, 3), None, GroupLayout(1, state=3, state_blocks=2)),  # Qwen3-Next: two per group
        (8 + 2 * 3, (1, 0, 0, 2), None, GroupLayout(1, state=2, state_blocks=3)),  # Mamba2: three per group
        (
            None,
            (1, 0, 0, 3),
            2,
            GroupLayout(1, state=3, state_blocks=2),
        ),  # no engine figure: the prediction's
        (8 + 3 * 2, (1, 0, 0, 3), 2, GroupLayout(1, state=3, state_blocks=2)),
    ],
)
def test_the_layout_is_read_from_the_engine_and_the_layers(
    engine: int | None,
    groups: tuple[int, ...] | None,
    predicted: int | None,
    layout: GroupLayout,
) -> None:
    answer = resolve_layout(
        block_size=128,
        max_model_len=1024,
        engine_blocks=engine,
        groups=groups,  # type: ignore[arg-type] - three or four counts
        predicted_window_cap=predicted,
        predicted_chunk_cap=predicted,
        predicted_state_blocks=predicted,
    )
    assert answer.layout == layout


def test_a_short_context_still_reads_its_state_blocks() -> None:
    """A 272-token block and a 128-token context: one attention block, and two per state group beyond it."""
    answer = resolve_layout(block_size=272, max_model_len=128, engine_blocks=1 + 3 * 2, groups=(1, 0, 0, 3))
    assert answer.layout == GroupLayout(1, state=3, state_blocks=2)


def test_a_pool_of_state_groups_admits_what_vllm_holds() -> None:
    """Qwen3-Next's layout: a 1000-token request holds 8 + 6 blocks, so 28 blocks hold two, not three."""
    pool = PoolView(blocks=28, block_size=128, layout=GroupLayout(1, state=3, state_blocks=2))
    request = Demand(prompts=(500,), choices=1, expected_output=500, output_bound=500, max_model_len=1024)
    assert CapacityLedger().added_blocks(request, pool) == 14
    ledger = CapacityLedger()
    ledger.add(request, Steps(low=0, high=0))
    assert ledger.fits(request, pool, Steps())
    ledger.add(request, Steps(low=0, high=0))
    assert not ledger.fits(request, pool, Steps())
    assert not pool.shares_prefixes  # a prefix hit needs the state too: counted whole


def test_sliding_and_chunked_groups_together_must_match_the_prediction() -> None:
    """One engine figure cannot give two caps: only the predicted ones, when they explain it exactly."""

    def resolve(engine: int) -> GroupLayout | None:
        return resolve_layout(
            block_size=128, max_model_len=1024, engine_blocks=engine, groups=(1, 1, 1),
            predicted_window_cap=4, predicted_chunk_cap=6,
        ).layout  # fmt: skip

    assert resolve(8 + 4 + 6) == GroupLayout(1, 1, 4, 1, 6)
    assert resolve(8 + 5 + 6) is None


@pytest.mark.parametrize(
    ("engine", "groups", "why"),
    [
        (12, None, "hybrid KV layout; give the sidecar the model's config (--model)"),
        (
            10,
            (1, 0, 0),
            "1 full-attention, 0 sliding-window, 0 chunked-attention and 0 state KV groups do not explain",
        ),
        (20, (1, 1, 0), "do not explain"),  # 12 left for one sliding group of an 8-block request
        (13, (1, 2, 0), "do not explain"),  # 5 left does not split over two groups
        (35, (1, 0, 3), "do not explain"),  # 27 left over three chunked groups of at most 8
    ],
)
def test_a_layout_the_groups_cannot_explain_is_refused_with_the_reason(
    engine: int, groups: tuple[int, int, int] | None, why: str
) -> None:
    answer = resolve_layout(block_size=128, max_model_len=1024, engine_blocks=engine, groups=groups)
    assert answer.layout is None
    assert why in answer.why
    assert "\n" not in answer.why


def test_the_engines_blocks_per_request_come_from_its_max_concurrency() -> None:
    config = parse_vllm_metrics(HYBRID_PAGE.read_text()).cache_config
    assert config is not None
    assert engine_blocks_per_request(config.num_gpu_blocks, config.kv_cache_max_concurrency) == 12
    assert engine_blocks_per_request(16, None) is None


def test_a_hybrid_pool_holds_fewer_requests_than_one_group_would() -> None:
    """Two requests growing to 830 tokens: 14 of 15 blocks as one group, 22 as vLLM holds them."""
    single = PoolView(blocks=15, block_size=128)
    hybrid = PoolView(blocks=15, block_size=128, layout=GroupLayout(1, 1, 4))
    request = Demand(prompts=(130,), choices=1, expected_output=700, output_bound=700, max_model_len=1024)
    for pool, fits in ((single, True), (hybrid, False)):
        ledger = CapacityLedger()
        ledger.add(request, Steps(low=0, high=0))
        assert ledger.fits(request, pool, Steps()) is fits
    assert CapacityLedger().added_blocks(request, hybrid) == 11


def test_prefix_blocks_are_not_shared_across_a_hybrid_layout() -> None:
    ids = [[7] * 600]
    assert prompt_hashes(ids, PoolView(blocks=15, block_size=128)) != ((),)
    assert prompt_hashes(ids, PoolView(blocks=15, block_size=128, layout=GroupLayout(1, 1, 4))) == ()


def _monitor(architecture: bool) -> Monitor:
    config = json.loads(HYBRID_CONFIG.read_text())
    inputs = PlanInputs(
        architecture=architecture_from_config(config) if architecture else None,
        model="tiny",
        gpu_memory_bytes=24 * GIB,
        max_model_len=1024,
    )
    monitor = Monitor(inputs, MonitorSettings(), make_logger(io.StringIO()))
    monitor.record_success(parse_vllm_metrics(HYBRID_PAGE.read_text()), now=0.0)
    return monitor


def test_with_the_models_layers_the_real_hybrid_pool_is_planned_over_both_groups() -> None:
    answer = admission_pool(_monitor(architecture=True))
    assert answer.view is not None
    assert (answer.view.blocks, answer.view.layout) == (15, GroupLayout(1, 1, 4))
    assert not answer.view.shares_prefixes


def test_without_them_the_real_hybrid_pool_is_not_planned_as_one_group() -> None:
    answer = admission_pool(_monitor(architecture=False))
    assert answer.view is None
    assert answer.why.startswith("the engine plans 12 blocks for a 1024-token request, not 8")


def test_the_predicted_pool_counts_vllms_blocks_of_one_group_each() -> None:
    """Before the engine reports a pool, the prediction's: one budget block covers both layers, vLLM's one."""
    monitor = Monitor(
        PlanInputs(
            architecture=architecture_from_config(json.loads(HYBRID_CONFIG.read_text())),
            model="tiny",
            gpu_memory_bytes=24 * GIB,
            max_model_len=1024,
            max_num_batched_tokens=256,
            block_size=128,
            num_gpu_blocks_override=16,
            async_scheduling=False,  # vLLM's CPU platform turns it off (vllm/platforms/cpu.py)
        ),
        MonitorSettings(),
        make_logger(io.StringIO()),
    )
    monitor.refresh(0.0)
    assert monitor.ledger is not None
    assert monitor.ledger.max_concurrency == 1.33  # the real server: "Maximum concurrency ...: 1.33x"
    assert monitor.ledger.kv_pool_tokens == 1365  # its "KV cache size: 1,365 tokens" (kv_cache_size_tokens)
    answer = admission_pool(monitor)
    assert answer.view is not None
    assert answer.view.source == "prediction"
    assert answer.view.layout == GroupLayout(1, 1, 4)  # the budget's cap: 127 + 256 tokens in flight
    assert answer.view.blocks == 15  # 16 of vLLM's blocks, one of them null


def _data_parallel_monitor(architecture: Architecture, max_model_len: int, engines: int | None) -> Monitor:
    inputs = PlanInputs(
        architecture=architecture, gpu_memory_bytes=24 * GIB, max_model_len=max_model_len,
        data_parallel_size=engines,
    )  # fmt: skip
    return Monitor(inputs, MonitorSettings(), make_logger(io.StringIO()))


def test_the_predicted_pool_of_data_parallel_engines_is_their_pools_summed() -> None:
    """Each data-parallel engine has a pool of its own, as the engine's page counts them (``engine`` label)."""

    def predicted(data_parallel_size: int) -> PoolView:
        monitor = _data_parallel_monitor(resolve_model("qwen2.5-7b"), 4096, data_parallel_size)
        monitor.refresh(0.0)
        answer = admission_pool(monitor)
        assert answer.view is not None
        return answer.view

    one, three = predicted(1), predicted(3)
    assert three.blocks == 3 * one.blocks  # a dense model: three engines alike


def test_run_plans_as_many_data_parallel_engines_as_the_page_reports() -> None:
    """Without ``--data-parallel-size``, ``run`` takes the engines vLLM's page labels (``engine="0"``, ``"1"``)."""
    page = HYBRID_PAGE.read_text()
    two = page + "\n".join(
        line.replace('engine="0"', 'engine="1"')
        for line in page.splitlines()
        if line.startswith(("vllm:kv_cache_usage_perc", "vllm:num_requests_running"))
    )
    for flag, expected in ((None, 2), (1, 1), (4, 4)):
        monitor = _data_parallel_monitor(
            architecture_from_config(json.loads(HYBRID_CONFIG.read_text())), 1024, flag
        )
        monitor.record_success(parse_vllm_metrics(two + "\n"), now=0.0)
        assert monitor.request is not None
        assert monitor.request.data_parallel_size == expected, flag


def test_padding_layers_of_an_uneven_hybrid_cost_pool_blocks() -> None:
    """Gemma 3 4B: 5 full and 29 sliding layers make 1 + 6 groups of 5 (one layer of padding), as vLLM pads."""
    arch = resolve_model("gemma-3-4b")
    assert kv_groups(arch.layer_kinds) == KvGroups(1, 6, 5)
    request = PlanRequest(arch, 24 * GIB, max_model_len=32768, max_num_batched_tokens=2048, block_size=16)
    ledger = build_ledger(request)
    full, sliding = 32768 // 16, sliding_window_blocks(1024, 2 * 2048, 32768, 16)  # async: two batches
    assert ledger.max_concurrency == round(ledger.kv_pool_blocks / (full + 6 * sliding), 2)
    unpadded = ledger.kv_pool_blocks * 5 / (5 * full + 29 * sliding)  # the layers without the padding
    assert ledger.max_concurrency < unpadded


@pytest.mark.parametrize(("version", "tokens_from"), [("0.19.0", "blocks"), ("0.32.0", "concurrency")])
def test_a_windowed_pool_is_reported_as_the_release_logs_it(version: str, tokens_from: str) -> None:
    request = PlanRequest(
        resolve_model("gemma-3-4b"), 24 * GIB, max_model_len=32768, max_num_batched_tokens=2048,
        block_size=16, vllm_version=version,
    )  # fmt: skip
    ledger = build_ledger(request)
    if tokens_from == "blocks":  # blocks of every layer x block size
        assert ledger.kv_pool_tokens == ledger.kv_pool_bytes // (ledger.kv_bytes_per_token * 16) * 16
    else:  # vLLM's group-aware concurrency x max_model_len
        per_request = 32768 // 16 + 6 * sliding_window_blocks(1024, 2 * 2048, 32768, 16)  # async: two batches
        assert ledger.kv_pool_tokens == int(ledger.kv_pool_blocks / per_request * 32768)


def test_llama4s_chunked_groups_are_planned_from_the_engines_blocks_per_request() -> None:
    """Scout at TP 4 as its vLLM log reports it: 91,495 blocks of 16, 44.68 full-length requests.

    2,048 blocks per 8,192-token request: one full-attention group and three chunked ones of 512 each (the chunk
    is the whole request here). Read as full and sliding groups only, the layout was unexplained, and capacity
    admission fell back to lanes for every Llama 4 model.
    """
    scout = json.loads(
        (DATA.parent / "hf-configs/meta-llama--Llama-4-Scout-17B-16E-Instruct.json").read_text()
    )
    inputs = PlanInputs(
        architecture=architecture_from_config(scout),
        model="scout",
        gpu_memory_bytes=80 * GIB,
        max_model_len=8192,
    )
    text = HYBRID_PAGE.read_text()
    for key, value in (
        ("num_gpu_blocks", "91495"),
        ("block_size", "16"),
        ("kv_cache_max_concurrency", "44.68"),
    ):
        text = substitute_label(text, "vllm:cache_config_info", key, value)
    monitor = Monitor(inputs, MonitorSettings(), make_logger(io.StringIO()))
    monitor.record_success(parse_vllm_metrics(text), now=0.0)
    answer = admission_pool(monitor)
    assert answer.view is not None, answer.why
    assert answer.view.layout == GroupLayout(1, 0, 0, 3, 512)
    assert answer.view.sequence_blocks(8192) == 2048
