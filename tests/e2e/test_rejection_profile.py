"""The profile's rejection-sampler pass on the real engine: it holds what the plan adds for it.

With speculative decoding (any method) V1's ``profile_run`` ends with the rejection sampler as well as the
plain sampler, and that pass holds ``12 x R x vocab`` bytes more (``sidecar/budget/sampler_pass.py`` has the
reading of the source). The CPU engine has no allocator statistics and its sampler sorts for top-k/top-p
where the GPU's does not, so its absolute figures are not the GPU's; what it can show is the increment,
which the sort does not change: ``rejection_probe.py`` reads the pass's peak resident memory with n-gram
drafting and without, on a tiny Llama whose 65,536-token vocabulary makes the sampler's tensors dominate.
Measured 2026-12-06, three runs alike: 24.0 and 36.0 ``R x vocab`` bytes, an increment of 12.0, as planned.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.units import GIB
from tests.harness.vllm import probe_runs, run_probe

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("rejection_probe.py")
TOLERANCE = 0.5  # R x vocab bytes: what the pass allocates beside those tensors (indices, small buffers)


def test_the_rejection_pass_adds_what_the_plan_adds(vllm_env: Path, tiny_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny-large-vocab"
    run_probe(vllm_env, PROBE, "make", str(tiny_model), str(model))
    runs = probe_runs(vllm_env, PROBE, "SAMPLER", "measure", str(model))
    rows, vocab = runs["plain"]["rows"], runs["plain"]["vocab"]
    unit = rows * vocab
    measured = (median(runs["ngram"]["peaks"]) - median(runs["plain"]["peaks"])) / unit

    def activation(spec: SpeculativeSettings | None) -> int:
        request = PlanRequest(
            architecture=load_architecture(model), gpu_memory_bytes=24 * GIB, max_model_len=512,
            max_num_seqs=rows, max_num_batched_tokens=2048, speculative=spec,
            model_runner=ModelRunner.V1,  # the CPU engine has no Triton: "using the V1 model runner instead"
        )  # fmt: skip
        return build_ledger(request).profile["activation"]

    planned = (activation(SpeculativeSettings.parse('{"method": "ngram"}')) - activation(None)) / unit
    assert planned == 12
    assert abs(measured - planned) <= TOLERANCE, (measured, runs)
