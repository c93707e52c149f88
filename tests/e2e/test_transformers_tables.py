"""The tables generated from transformers and vLLM are current: regenerated with the vLLM environment.

``sidecar/budget/config_defaults.json`` (the defaults a config leaves out),
``tests/data/hf-configs/transformers-reference.json`` (how transformers reads each corpus config),
``tests/data/transformers-defaults-sweep.json`` (every family vLLM serves, as transformers builds its default
config), ``tests/data/vision-tower-variants.json`` (vision towers built from changed configs) and ``sidecar/budget/vllm_model_classes.json`` (what vLLM's model classes declare about LoRA and EAGLE-3) are data
the offline tiers use; if one drifted from its source, these fail with the command to refresh it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    "script",
    [
        "gen_config_defaults.py",
        "transformers_reference.py",
        "transformers_defaults_sweep.py",
        "vision_tower_variants.py",
        "gen_vllm_model_classes.py",
    ],
)
def test_generated_from_transformers_and_current(vllm_env: Path, script: str) -> None:
    offline = os.environ | {"HF_HUB_OFFLINE": "1"}  # timm's configs ask the Hub and retry for ~45 s offline
    result = subprocess.run(
        [str(vllm_env), str(ROOT / "scripts" / script), "--check"],
        capture_output=True, text=True, timeout=600, check=False, env=offline,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
