"""One time reader and one duration formatter for the operator's messages and the report."""

from __future__ import annotations

import datetime as dt

import pytest

from kvgate.records.timestamps import duration, iso, parse_time, waited


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3, "0 s"),
        (45, "45 s"),
        (720, "12 min"),  # a zero second unit is left out: "at most 12 min an attempt"
        (252, "4 min 12 s"),
        (3600, "1 h"),
        (7500, "2 h 5 min"),
        (2 * 86400, "2 d"),
        (6782 * 60 + 18, "4 d 17 h"),  # not "113 h 2 min"
    ],
)
def test_one_duration_for_messages_and_the_report(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(9, "0 s"), (59, "50 s"), (61, "1 min"), (119, "1 min"), (7219, "2 h")]
)
def test_a_wait_changes_its_words_every_10_s_then_every_minute(seconds: float, text: str) -> None:
    assert waited(seconds) == text


def test_a_time_reads_as_status_writes_it_and_in_any_rfc3339_form() -> None:
    t = dt.datetime(2026, 12, 3, 15, 4, 5, tzinfo=dt.UTC)
    assert parse_time(iso(t)) == t
    assert parse_time("2026-12-03T16:04:05.250+01:00") == t + dt.timedelta(milliseconds=250)
    got = parse_time("2026-12-03T16:04:05+01:00")
    assert got is not None and got.tzinfo is dt.UTC


@pytest.mark.parametrize("text", [None, "", "x", "2026-12-03T15:04:05", "2026-12-03", "3 pm"])
def test_no_time_without_a_zone_or_in_another_format(text: str | None) -> None:
    """A time without a zone cannot be compared with the operator's clock: none."""
    assert parse_time(text) is None
