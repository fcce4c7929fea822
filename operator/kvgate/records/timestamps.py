"""How status writes a time (RFC 3339 in UTC to the second, `2026-12-03T15:04:05Z`), and how a
message says how long something took."""

from __future__ import annotations

import datetime as dt


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    """A time as status writes it; None for anything else (absent, another format, junk)."""
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return None


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `1 h 5 min`: a wait read at a glance."""
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    minutes = total // 60
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def waited(seconds: float) -> str:
    """How long a wait has lasted, in steps of 10 s (then of a minute): a waiting poll's message
    changes, and so its status is written, at most that often, not at every poll."""
    total = max(0, int(seconds))
    return duration(total - total % 10 if total < 60 else total)
