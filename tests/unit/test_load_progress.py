"""The load Job's progress lines folded for status.message (`LoadProgress`), and the bound its
runs get inside the Job's deadline (`manifests.load_run_timeout`)."""

from __future__ import annotations

import json

import pytest

from kvgate.change import manifests
from kvgate.records.loadresult import PROGRESS_KIND, LoadProgress


def line(**fields: object) -> str:
    return json.dumps({"kind": PROGRESS_KIND, **fields}, separators=(",", ":"))


def test_stage_lines_count_per_arm_and_repeats_count_once() -> None:
    text = "\n".join(
        [
            "transformers: PyTorch was not found",  # stderr noise in the same log
            line(event="started", stages=[64, 1, 8, 32], requests=[128, 2, 16, 64]),
            line(event="stage", arm="control", stage=0, concurrency=64),
            line(event="stage", arm="control", stage=0, concurrency=64),
            line(event="stage", arm="candidate", stage=0, concurrency=64),
            line(event="stage", arm="candidate", stage=1, concurrency=1),
            line(event="finished", arm="candidate"),
            '{"kind": "kvgate.load/summary", "verdict": "partial"}',
            "{not json",
        ]
    )
    progress = LoadProgress.from_log(text)
    assert progress.stages == 4
    assert progress.done == (("control", 1), ("candidate", 2))
    assert progress.finished == ("candidate",)
    assert progress.latest_concurrency == 1
    assert progress.describe() == "stages control 1/4, candidate 2/4 done (latest 1 concurrent)"


def test_before_the_started_line_it_is_starting() -> None:
    assert LoadProgress.from_log("").describe() == "starting inference-perf"
    assert LoadProgress.from_log("Traceback ...\n").describe() == "starting inference-perf"


@pytest.mark.parametrize(
    "bad",
    [
        line(event="stage", arm="judge", stage=0, concurrency=8),  # not an arm
        line(event="stage", arm="control", stage="0", concurrency=8),  # stage not an int
        json.dumps(
            {"kind": "kvgate.eval/progress", "event": "stage", "arm": "control", "stage": 0}
        ),
        "[1, 2]",
    ],
)
def test_lines_that_are_not_load_progress_count_for_nothing(bad: str) -> None:
    progress = LoadProgress.from_log(line(event="started", stages=[2]) + "\n" + bad)
    assert progress.done == (("control", 0), ("candidate", 0))
    assert progress.describe() == "stages control 0/1, candidate 0/1"


@pytest.mark.parametrize(
    ("deadline", "runs"),
    [(1800.0, 1620.0), (300.0, 240.0), (100.0, 50.0), (10.0, 5.0)],
)
def test_the_runs_stop_a_margin_before_the_jobs_deadline(deadline: float, runs: float) -> None:
    assert manifests.load_run_timeout(deadline) == runs
    command = manifests.load_command(
        control_url="http://a:8000", candidate_url="http://b:8000", model="m",
        production_concurrency=4, prompt_tokens=700, output_tokens=90, max_concurrency=8,
        deadline_s=deadline,
    )  # fmt: skip
    assert command[command.index("--timeout") + 1] == f"{runs:g}"


def test_without_a_deadline_the_command_is_as_before() -> None:
    command = manifests.load_command(
        control_url="http://a:8000", candidate_url="http://b:8000", model="m",
        production_concurrency=4, prompt_tokens=512, output_tokens=128, max_concurrency=8,
    )  # fmt: skip
    assert "--timeout" not in command and "--prompt-std-tokens" not in command


def test_a_hostile_progress_log_is_bounded_and_never_raises() -> None:
    started = json.dumps({"kind": PROGRESS_KIND, "event": "started", "stages": [1, 2]})
    deep = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"  # past the parser's recursion limit
    huge = json.dumps({"kind": PROGRESS_KIND, "event": "started", "pad": "x" * 1_100_000})
    assert LoadProgress.from_log(f"{deep}\n{started}").started  # the deep line is skipped
    assert not LoadProgress.from_log(huge).started  # a line past 1 MB is not read
