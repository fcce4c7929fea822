"""A restarted canary's log findings name lines as `kubectl logs` / `kubectl logs --previous`
count them (first-hour-2 N25: the report's "Root cause: attention-build-failed at line 26" where
`kvgate scan-logs` of the same log said 25, because the operator scanned "previous + \\n +
current", with an empty previous too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.controller import sources
from kvgate.evidence import logs
from kvgate.evidence.logs.containers import CURRENT, PREVIOUS, joined, per_container

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
CRASH = (LOGS / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt").read_text()


def root_cause(hints: list[str]) -> str:
    (hint,) = [h for h in hints if "Root cause" in h]
    return hint


def test_the_cli_and_the_operator_name_the_same_line_without_a_restart() -> None:
    cli_scan = logs.scan_log(CRASH, engine="vllm")
    cli_hint = root_cause([f.hint for f in cli_scan.findings])
    assert cli_hint == "Root cause: attention-build-failed at line 25."
    for previous in (None, ""):  # no restart, or a previous container with nothing logged
        scan = sources.scan_engine_log(CRASH, "vllm", previous=previous)
        assert root_cause([f.hint or "" for f in scan.findings]) == cli_hint
        lines = {f.code: f.line for f in scan.findings}
        assert lines == {f.code: f.line for f in cli_scan.findings if f.code in lines}


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_a_crash_in_the_previous_container_is_named_there(trailing_newline: bool) -> None:
    previous = CRASH if trailing_newline else CRASH.rstrip("\n")
    current = "".join(CRASH.splitlines(keepends=True)[:3])  # the restart, just begun
    scan = sources.scan_engine_log(current, "vllm", previous=previous)
    hint = root_cause([f.hint or "" for f in scan.findings])
    assert hint == f"Root cause: attention-build-failed at line 25 {PREVIOUS}."
    build = next(f for f in scan.findings if f.code == "attention-build-failed")
    assert build.line == 25  # as `kubectl logs --previous` numbers it


def test_lines_of_the_current_container_count_from_its_first_line() -> None:
    previous = "".join(f"INFO boot line {i}\n" for i in range(1, 8))  # 7 lines, nothing found
    text, previous_lines = joined(previous, CRASH)
    assert previous_lines == 7 and text.splitlines()[7] == CRASH.splitlines()[0]
    scan = per_container(logs.scan_log(text, engine="vllm").status_record(), previous_lines)
    hint = root_cause([f.hint or "" for f in scan.findings])
    assert hint == f"Root cause: attention-build-failed at line 25 {CURRENT}."


def test_pod_logs_reads_both_containers() -> None:
    class Kube:
        def read_log(
            self, namespace: str, pod: str, container: str | None = None, *, previous: bool = False
        ) -> str | None:
            return "old\n" if previous else None

    assert sources.pod_logs(Kube(), "ns", "p", "c") == ("old\n", "")  # type: ignore[arg-type]
