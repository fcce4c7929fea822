"""How status writes a time: RFC 3339 in UTC to the second, `2026-12-03T15:04:05Z`."""

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
