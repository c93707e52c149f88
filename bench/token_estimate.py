"""The token estimator against the real Qwen3 tokenizer on sample texts: error per sample, and speed.

Run: ``.venv/bin/python -m bench.token_estimate`` (fetches the tokenizer with ``scripts/fetch-tokenizer``).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from sidecar.admission.tokens import EstimatingCounter, TokenizerCounter
from tests.harness.token_samples import samples

ROOT = Path(__file__).parent.parent


def main() -> None:
    path = subprocess.run([str(ROOT / "scripts/fetch-tokenizer")], capture_output=True, text=True, check=True)
    exact, estimate = TokenizerCounter(Path(path.stdout.strip())), EstimatingCounter()
    print(f"{'sample':<20}{'exact':>8}{'estimate':>10}{'error':>9}{'exact us':>10}{'estimate us':>13}")
    for name, text in samples().items():
        started = time.perf_counter()
        true_count = exact.count(text)
        exact_us = (time.perf_counter() - started) * 1e6
        started = time.perf_counter()
        guess = estimate.count(text)
        guess_us = (time.perf_counter() - started) * 1e6
        error = (guess - true_count) / true_count
        print(f"{name:<20}{true_count:>8}{guess:>10}{error:>+9.1%}{exact_us:>10.0f}{guess_us:>13.0f}")


if __name__ == "__main__":
    main()
