"""How status writes a time (RFC 3339 in UTC to the second, `2026-12-03T15:04:05Z`), how it is
read back, and how a message or the report says how long something took."""

from __future__ import annotations

import datetime as dt


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    """A time in RFC 3339, in UTC: as status writes it (`...Z`, to the second), or with a
    fraction or an offset; None for anything else (absent, no zone, another format, junk)."""
    if not text or not isinstance(text, str):
        return None
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return None if t.tzinfo is None else t.astimezone(dt.UTC)


_UNITS = ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s"))


def duration(seconds: float) -> str:
    """`45 s`, `4 min 12 s`, `12 min`, `2 h 5 min`, `4 d 17 h`: read at a glance, in the two
    largest units (a second one of zero left out), for messages and the report alike."""
    whole = max(0, int(seconds))
    for size, unit, part, smaller in _UNITS:
        if whole >= size:
            rest = whole % size // part
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


def waited(seconds: float) -> str:
    """How long a wait has lasted, in steps of 10 s (then of a minute): a waiting poll's message
    changes, and so its status is written, at most that often, not at every poll."""
    total = max(0, int(seconds))
    return duration(total - total % (10 if total < 60 else 60))
