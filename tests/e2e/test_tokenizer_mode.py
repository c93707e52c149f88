"""vLLM's own rule for a Mistral checkpoint's tokenizer mode, run on the layouts the sidecar decides alike.

vLLM 0.32.0 tokenizes and renders a checkpoint with ``consolidated*.safetensors`` beside ``tekken.json`` or
``tokenizer.model.v*`` with mistral_common (``resolve_tokenizer_args``, ``tokenizers/registry.py``), not with
its ``tokenizer.json`` and Jinja template, so the sidecar's counts there are near, not exact
(:mod:`sidecar.admission.tokenizer_mode`, whose table is in ``tests/unit/test_tokenizer_mode.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sidecar.admission.tokenizer_mode import resolved_mode

pytestmark = pytest.mark.e2e

LAYOUTS: dict[str, list[str]] = {
    "consolidated weights and tekken.json": ["consolidated.safetensors", "tekken.json"],
    "sharded consolidated weights and a v3 tokenizer": ["consolidated-00001-of-00002.safetensors", "tokenizer.model.v3"],
    "tekken.json beside HF weights": ["tekken.json", "model.safetensors"],
    "consolidated weights and an HF tokenizer": ["consolidated.safetensors", "tokenizer.json"],
    "an HF checkpoint": ["model.safetensors", "tokenizer.json"],
}  # fmt: skip

PROBE = """
import json, sys
from vllm.tokenizers.registry import resolve_tokenizer_args
print(json.dumps({path: resolve_tokenizer_args(path, tokenizer_mode="auto")[0] for path in sys.argv[1:]}))
"""


def test_the_mistral_rule_is_vllms(vllm_env: Path, tmp_path: Path) -> None:
    folders = {}
    for name, files in LAYOUTS.items():
        folder = tmp_path / str(len(folders))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
        for file in files:
            (folder / file).write_text("{}")
        folders[name] = folder
    result = subprocess.run(
        [str(vllm_env), "-c", PROBE, *map(str, folders.values())],
        capture_output=True, text=True, check=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    vllms = json.loads(result.stdout.strip().splitlines()[-1])
    ours = {
        str(folder): resolved_mode(
            "auto", {"architectures": ["MistralForCausalLM"]}, [p.name for p in folder.iterdir()]
        )
        for folder in folders.values()
    }
    assert ours == vllms
    assert sorted(vllms.values()) == ["hf", "hf", "hf", "mistral", "mistral"]
