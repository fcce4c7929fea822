"""One unit convention across the commands (first-hour-2 #20, N16, N22): every time flag takes
seconds or a duration, every share (margin, threshold, confidence) a fraction or a percentage.

Before, `scrape --timeout 5m` was "not a finite number", `wait --timeout 5` "not a duration",
`stats --margin 2pp` "not a finite number" and `scrape --usage-threshold 90%` refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgate import cli
from kvgate.commands import wait
from kvgate.inputs import duration_seconds, share

URLS = ["--control-url", "http://a:1", "--candidate-url", "http://b:1"]
LOAD_JOB = [*URLS, "--model", "m", "--production-concurrency", "1", "--prompt-tokens", "8",
            "--output-tokens", "8"]  # fmt: skip
# command, its other required arguments, its time flags
TIME_FLAGS: list[tuple[str, list[str], str]] = [
    ("scrape", ["http://a:1/metrics"], "--timeout"),
    ("scrape", ["http://a:1/metrics"], "--interval"),
    ("eval", URLS, "--timeout"),
    ("diverge", URLS, "--timeout"),
    ("preflight", ["m.json"], "--timeout"),
    ("load-job", LOAD_JOB, "--request-timeout"),
    ("load-job", LOAD_JOB, "--timeout"),
]
SHARE_FLAGS: list[tuple[str, list[str], str]] = [
    ("eval", URLS, "--margin"),
    ("eval", URLS, "--confidence"),
    ("eval", URLS, "--long-context-margin"),
    ("stats", ["--paired", "1,2,3,4"], "--margin"),
    ("stats", ["--paired", "1,2,3,4"], "--confidence"),
    ("scrape", ["http://a:1/metrics"], "--usage-threshold"),
    ("scrape", ["http://a:1/metrics"], "--min-fraction"),
]


def parse(command: str, *argv: str) -> argparse.Namespace:
    full = [command, *argv]
    return cli.build_parser(full).parse_args(full)


@pytest.mark.parametrize(("command", "rest", "flag"), TIME_FLAGS)
@pytest.mark.parametrize(("typed", "value"), [("90", 90.0), ("90s", 90.0), ("1m30s", 90.0)])
def test_every_time_flag_takes_seconds_or_a_duration(
    command: str, rest: list[str], flag: str, typed: str, value: float
) -> None:
    args = parse(command, *rest, flag, typed)
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == value


@pytest.mark.parametrize(("typed", "value"), [("300", 300.0), ("5m", 300.0), ("300s", 300.0)])
def test_wait_and_get_take_seconds_too(typed: str, value: float) -> None:
    for command in ("wait", "get"):
        args = parse(command, "r", "--timeout", typed, "--interval", "2")
        assert wait.durations(args) == (value, 2.0)


@pytest.mark.parametrize(("command", "rest", "flag"), SHARE_FLAGS)
@pytest.mark.parametrize("typed", ["0.9", "90%", "90pp", " 90 % "])
def test_every_share_takes_a_fraction_or_a_percentage(
    command: str, rest: list[str], flag: str, typed: str
) -> None:
    args = parse(command, *rest, flag, typed)
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("text", "value"),
    [("2pp", 0.02), ("2%", 0.02), ("2 pp", 0.02), ("2PP", 0.02), ("0.02", 0.02), ("-1%", -0.01)],
)
def test_share(text: str, value: float) -> None:
    assert share(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "%", "pp", "2 points", "nan%", "inf", "٢%", "2%%"])
def test_not_a_share(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a fraction \(0\.02\) or a percentage"):
        share(text)


@pytest.mark.parametrize(
    ("text", "value"), [("90", 90.0), ("1.5", 1.5), ("250ms", 0.25), ("1h30m", 5400.0)]
)
def test_duration_seconds(text: str, value: float) -> None:
    assert duration_seconds(text) == value


@pytest.mark.parametrize("text", ["", "5x", "m", "inf", "nan", "1e400", "5 m", "-5m"])
def test_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not seconds \(90\) or a duration"):
        duration_seconds(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scrape", "http://a:1/metrics", "--usage-threshold", "90"],
         "--usage-threshold: 90 is outside (0, 1]: a fraction; write 0.9 or 90%"),
        (["stats", "--paired", "1,2,3,4", "--margin", "2"],
         "--margin: 2.0 is not in (0, 1): a margin is a fraction; write 0.02 or 2pp"),
        (["eval", *URLS, "--margin", "2", "--data-dir", "{data}"],
         "margin: 2.0 is not in (0, 1): a margin is a fraction; write 0.02 or 2pp"),
        (["wait", "r", "--timeout", "soon"],
         "--timeout: 'soon' is not seconds (90) or a duration (90s, 5m, 1h30m)"),
    ],
)  # fmt: skip
def test_a_value_in_the_wrong_unit_is_refused_with_the_forms(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for split in ("test", "train"):
        (tmp_path / f"{split}.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    assert cli.main([a.format(data=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
