"""Line numbers per container for a scan of a restarted engine's two logs.

The operator scans the previous container's log and the current one's as one text (the crash
is in the first, the restart in the second), so the scanner's line numbers count both. A user
reads them with `kubectl logs` or `kubectl logs --previous`, whose lines each start at 1
(first-hour-2 N25: the report said "line 26" where `kvgate scan-logs` of the same log said 25).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

from kvgate.records.status import FindingRecord, ScanRecord

PREVIOUS: Final = "of the previous container's log (kubectl logs --previous)"
CURRENT: Final = "of the current container's log"
_LINE: Final = re.compile(r"\bline (\d+)\b")


def joined(previous: str | None, current: str) -> tuple[str, int]:
    """The text to scan and how many of its lines are the previous container's (0: none)."""
    if not previous:
        return current, 0
    head = previous if previous.endswith("\n") else previous + "\n"
    return head + current, head.count("\n")


def per_container(scan: ScanRecord, previous_lines: int) -> ScanRecord:
    """`scan` with each finding's line, and each line a hint names, counted in its own log."""
    if previous_lines <= 0:
        return scan

    def where(line: int) -> tuple[int, str]:
        if line <= previous_lines:
            return line, PREVIOUS
        return line - previous_lines, CURRENT

    def renumber(match: re.Match[str]) -> str:
        number, which = where(int(match.group(1)))
        return f"line {number} {which}"

    def finding(f: FindingRecord) -> FindingRecord:
        line = f.line if f.line is None else where(f.line)[0]
        return dataclasses.replace(f, line=line, hint=f.hint and _LINE.sub(renumber, f.hint))

    return dataclasses.replace(scan, findings=tuple(finding(f) for f in scan.findings))
