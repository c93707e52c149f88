"""A real Hugging Face cache, built at test time in the layout ``huggingface_hub`` reads and writes.

``models--{org}--{name}/blobs/<sha256>`` holds each file once, ``snapshots/<commit>/<file>`` links to
it, and ``refs/<branch>`` names the commit: exactly what ``vllm serve`` leaves behind after a download,
so the sidecar's resolution is tested against the library's own reading of it, offline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path


def add_model(
    cache: Path, repo_id: str, files: Mapping[str, str | bytes | dict[str, object]], *, branch: str = "main"
) -> Path:
    """Put ``files`` (name -> text, bytes or JSON object) into ``cache`` as one commit of ``repo_id``.

    Returns the snapshot folder.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    contents = {
        name: value if isinstance(value, bytes) else (value if isinstance(value, str) else json.dumps(value))
        for name, value in files.items()
    }
    raw = {name: v.encode() if isinstance(v, str) else v for name, v in contents.items()}
    commit = hashlib.sha1(b"".join(sorted(raw.values())) + branch.encode()).hexdigest()  # noqa: S324 - an id
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in raw.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / digest)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snapshot
