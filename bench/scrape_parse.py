"""Scanner vs prometheus_client's parser on the recorded vLLM pages, measured side by side.

Run: ``.venv/bin/python -m bench.scrape_parse`` (``--rounds N``). For each page, the two parsers
alternate in rounds of a fixed number of parses, so machine noise hits both alike; the table
shows the median time per page of each and their ratio. Results go to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sidecar.signals import parse_vllm_metrics

PAGES = Path(__file__).parent.parent / "tests" / "data" / "vllm"
RESULTS = Path(__file__).parent / "results"


def _full_parse(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def _time(fn, text: str, repeat: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for _ in range(repeat):
        fn(text)
    return (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for path in sorted(PAGES.glob("*.prom")):
        text = path.read_text(encoding="utf-8")
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(_time(parse_vllm_metrics, text, args.repeat))
            theirs.append(_time(_full_parse, text, args.repeat))
        row = {
            "page": path.name,
            "bytes": len(text.encode()),
            "scanner_ms": statistics.median(ours) * 1e3,
            "prometheus_client_ms": statistics.median(theirs) * 1e3,
        }
        row["ratio"] = row["prometheus_client_ms"] / row["scanner_ms"]
        rows.append(row)
    print(f"{'page':<42}{'bytes':>8}{'scanner ms':>12}{'prom_client ms':>16}{'ratio':>8}")
    for row in rows:
        print(
            f"{row['page']:<42}{row['bytes']:>8}{row['scanner_ms']:>12.3f}"
            f"{row['prometheus_client_ms']:>16.3f}{row['ratio']:>7.1f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"scrape_parse-{stamp}.json"
    out.write_text(json.dumps({"date": stamp, "machine": platform.platform(), "rows": rows}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
