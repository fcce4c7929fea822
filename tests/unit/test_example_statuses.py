"""examples/status/*.json: saved rollouts to try `kvgate report -f` on without a cluster
(first-hour-2 N21: "no sample status to try report -f on"). They are the report tests' own
states (tests/unit/report_states.py), so they cannot drift from what the report is tested on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import report_states

from kvgate.cli import main

STATUS = Path(__file__).resolve().parents[2] / "examples" / "status"
EXIT_STATUS = {"promoted": 0, "regressed": 1, "l4-crash": 1, "awaiting-approval": 3}


def test_the_examples_are_the_report_tests_states() -> None:
    assert sorted(p.stem for p in STATUS.glob("*.json")) == sorted(EXIT_STATUS)
    for name in EXIT_STATUS:
        saved = json.loads((STATUS / f"{name}.json").read_text())
        assert saved == json.loads(json.dumps(report_states.STATES[name]())), name


@pytest.mark.parametrize(("name", "code"), sorted(EXIT_STATUS.items()))
def test_report_reads_each_and_exits_as_wait_would(
    name: str, code: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = str(STATUS / f"{name}.json")
    assert main(["report", "-f", path, "--html", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "-f", path, "--exit-status"]) == code
    capsys.readouterr()
