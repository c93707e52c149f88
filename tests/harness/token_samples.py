"""The texts the token estimator is measured on (``bench/token_estimate.py``, and the tokenizer tests)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[2]


def samples() -> dict[str, str]:
    """The measured samples: prose, logs, the project's own Python sources, a vLLM page."""
    found = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests/data/text").glob("*.txt"))}
    for name in ("units.py", "scan.py", "ledger.py"):
        found[name] = next((ROOT / "sidecar").rglob(name)).read_text(encoding="utf-8")
    found["vllm-metrics.prom"] = (ROOT / "tests/data/vllm/vllm-0.32.0-cpu-tiny-kv-pressure.prom").read_text()[
        :20000
    ]
    return found
