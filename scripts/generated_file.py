"""Write a generated data file, or with ``--check`` say whether the committed one is current.

Shared by the scripts that generate data from transformers (``gen_config_defaults.py``,
``transformers_reference.py``); run from ``scripts/``, so they import it as a sibling module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write_or_check(out: Path, data: object, script: str) -> int:
    """``data`` as sorted JSON into ``out``; with ``--check`` on the command line, 1 when ``out`` differs."""
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv[1:]:
        if out.read_text(encoding="utf-8") != text:
            print(f"{out} is stale: run scripts/{script} with the vLLM environment's python", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({len(text):,} bytes)")
    return 0
