"""Which line of a judge Job's log is evidence? The eval and load Jobs print progress lines and,
last, a summary carrying the attempt's nonce; only that last line counts (pure).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Final


def job_lines(
    text: str, nonce_sha256: str | None, *, kind: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(summary, latest progress) from a judge Job's log: `<kind>/summary`, `<kind>/progress`.

    Evidence integrity: the summary is the log's last line only, and only when it carries the
    attempt's nonce (whose hash status keeps). lm-eval logs an arm's error bodies into the same
    log, so a summary-shaped line anywhere else proves nothing. Progress lines are only shown.
    """
    progress = None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        obj = json_object(line)
        if obj is not None and obj.get("kind") == f"{kind}/progress":
            progress = obj
    last = json_object(lines[-1]) if lines else None
    if last is None or last.get("kind") != f"{kind}/summary" or not nonce_sha256:
        return None, progress
    nonce = last.get("nonce")
    if not isinstance(nonce, str) or hashlib.sha256(nonce.encode()).hexdigest() != nonce_sha256:
        return None, progress
    summary = {k: v for k, v in last.items() if k != "nonce"}
    return summary, progress


def json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{") or len(line) > 1_000_000:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


eval_lines: Final = functools.partial(job_lines, kind="kvgate.eval")  # the eval Job's log
