"""The tables generated from transformers are current: regenerated here with the vLLM environment's transformers.

``sidecar/budget/config_defaults.json`` (the defaults a config leaves out) and
``tests/data/hf-configs/transformers-reference.json`` (how transformers reads each corpus config) are data the
offline tiers use; if either drifted from what transformers says, these fail with the command to refresh it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("script", ["gen_config_defaults.py", "transformers_reference.py"])
def test_generated_from_transformers_and_current(vllm_env: Path, script: str) -> None:
    result = subprocess.run(
        [str(vllm_env), str(ROOT / "scripts" / script), "--check"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
