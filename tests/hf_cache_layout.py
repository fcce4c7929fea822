"""A Hugging Face hub cache in tmp_path, in huggingface_hub's real layout.

    <cache>/<kind>s--<org>--<name>/
        blobs/<sha256 of the content>
        refs/main                      the commit hash, no newline
        snapshots/<commit>/<path>      a symlink to ../../blobs/<sha> (as huggingface_hub makes)

Tests point HF_HOME (cache = HF_HOME/hub) or HF_HUB_CACHE at it, so code under test finds the
files through huggingface_hub's own cache API, never by a path of ours.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(
    cache: Path, repo_id: str, files: dict[str, bytes], *, kind: str = "model", commit: str = COMMIT
) -> Path:
    """Write `files` (repo path: content) as revision `main` of `repo_id`; returns the snapshot."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot
