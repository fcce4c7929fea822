"""A crashed canary in words: the classified cause first, then the remedy and where it goes, and
the engine's own line last, cut short.

`describe` builds it from the crashed arm's log scan; `Crash.message` is the operator's
`status.message` and the `CanaryCrashed` Event; `read` turns that message back into its parts
for the report, so the operator and the report say the same thing. Pure: data in, data out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from kvgate.evidence.logs.model import CAUSES
from kvgate.judge.remedy import Remedy
from kvgate.records.status import FindingRecord, ScanRecord

# The engine's own line (often a ~300-character ninja command) is evidence, not the headline.
RAW_CHARS: Final = 160
# "engine failed to start" only points at its cause; the cause carries the remedy.
GENERIC_FAILURES: Final = frozenset({"engine-start-failed"})
_ERROR: Final = frozenset({"error", "fatal", "critical"})
AUTO_HINT: Final = "or set spec.canary.remediation: auto and kvgate applies it and tests again"
APPLIED_NOTE: Final = " (already applied: the remedied candidate crashed too)"
GENERIC_WHERE: Final = (
    "the candidate's flags go in spec.extraArgs, its environment in spec.extraEnv"
)


@dataclass(frozen=True, slots=True)
class Crash:
    """One crashed arm: what failed, what to do, where it goes, and the engine's line."""

    arm: str  # control or candidate
    cause: str  # the classified cause and its code, or the exit and "cause not classified"
    remedy: str | None = None  # what to change
    remedy_for: str | None = None  # "vllm 0.13.0": the engine version the remedy is known for
    note: str = ""  # " (already applied: ...)", " (not applied, the allowlist refuses it: ...)"
    where: str | None = None  # which spec fields take the remedy
    raw: str | None = None  # the engine's line, at most RAW_CHARS characters

    @property
    def headline(self) -> str:
        return f"{self.arm} crashed: {self.cause}"

    @property
    def remedy_shown(self) -> str | None:
        """The remedy as the report shows it: "X (for vllm 0.13.0)" plus any note."""
        if not self.remedy:
            return self.note.strip() or None
        version = f" (for {self.remedy_for})" if self.remedy_for else ""
        return f"{self.remedy}{version}{self.note}"

    @property
    def message(self) -> str:
        """`status.message` and the Event (`read` parses it back)."""
        out = self.headline
        if self.remedy:
            label = f"remedy for {self.remedy_for}" if self.remedy_for else "remedy"
            out += f"; {label}: {self.remedy}"
        out += self.note
        if self.where:
            out += f"; {self.where}"
        if self.raw:
            out += f"; log: {self.raw}"
        return out


def root_cause(scan: ScanRecord | None) -> FindingRecord | None:
    """The crashed arm's first error finding, a specific one before a generic one."""
    findings = scan.findings if scan is not None else ()
    errors = [f for f in findings if (f.severity or "").lower() in _ERROR]
    errors.sort(key=lambda f: f.code in GENERIC_FAILURES)
    return errors[0] if errors else None


def classify(scan: ScanRecord | None, detail: str) -> tuple[str, str | None, str | None]:
    """(cause, the engine's line, the log rule's hint) of a crashed arm's log scan.

    A known signature leads with what it means (`CAUSES`); anything else says how the pod
    ended and that kvgate does not know why."""
    finding = root_cause(scan)
    code = str(finding.code) if finding is not None else None
    if finding is not None and code in CAUSES:
        return f"{CAUSES[code]} ({code})", _cut(finding.text), finding.hint or None
    ended = f"{detail}, cause not classified" if detail else "cause not classified"
    if finding is not None:
        return ended, _cut(finding.text or code), finding.hint or None
    tail = scan.tail if scan is not None else ()
    return ended, _cut(tail[-1]) if tail else None, None


def where(arm: str, args: Sequence[str], env: Mapping[str, str], *, offer_auto: bool) -> str | None:
    """Which spec fields take a candidate's remedy (None for the control: its config is
    production's)."""
    if arm != "candidate":
        return None
    out = []
    if args:
        out.append(f"spec.extraArgs: [{', '.join(a for arg in args for a in arg.split())}]")
    if env:
        # a YAML list, as the CRD's extraEnv is: pasted as is, it passes the schema (first-hour-2
        # N11: a bare `{name: ..., value: '0'}` mapping was refused)
        pairs = ", ".join(f"{{name: {k}, value: {json.dumps(str(v))}}}" for k, v in env.items())
        out.append(f"spec.extraEnv: [{pairs}]")
    text = "set " + " and ".join(out) if out else GENERIC_WHERE
    return f"{text}; {AUTO_HINT}" if offer_auto and out else text


def describe(
    arm: str,
    scan: ScanRecord | None,
    detail: str,
    fix: Remedy | None = None,
    *,
    auto: bool = False,
    already_applied: bool = False,
) -> Crash:
    """A crashed arm, from its log scan and its pod's end (`detail`).

    `fix` is the engine version's known remedy (a candidate only), else the log rule's hint.
    `auto`: kvgate applies remedies itself, so a refused or already applied one is said so."""
    cause, raw, hint = classify(scan, detail)
    note = ""
    if fix is not None and auto and fix.refused:
        note = f" (not applied, the allowlist refuses it: {fix.refused})"
    if already_applied:
        note += APPLIED_NOTE
    if fix is None:
        return Crash(arm, cause, remedy=hint, note=note,
                     where=where(arm, (), {}, offer_auto=False) if hint else None, raw=raw)  # fmt: skip
    return Crash(
        arm,
        cause,
        remedy=fix.text,
        remedy_for=f"{fix.engine} {fix.version}",
        note=note,
        where=where(arm, fix.args, fix.env, offer_auto=not (fix.refused or already_applied)),
        raw=raw,
    )


_MESSAGE: Final = re.compile(
    r"(?P<arm>control|candidate) crashed: (?P<cause>.*?)"
    r"(?:; remedy(?: for (?P<version>[^:;]+))?: (?P<remedy>.*?))?"
    r"(?P<note>(?: \((?:already applied|not applied, the allowlist refuses it): [^;]*\))*)"
    r"(?:; (?P<where>(?:set spec\.|the candidate's flags go in ).*?))?"
    r"(?:; log: (?P<raw>.*))?",
    re.DOTALL,
)


def read(message: str) -> Crash | None:
    """The parts of a message `Crash.message` wrote; None for any other message."""
    m = _MESSAGE.fullmatch(message)
    if m is None:
        return None
    return Crash(
        m.group("arm"),
        m.group("cause"),
        remedy=m.group("remedy") or None,
        remedy_for=m.group("version") or None,
        note=m.group("note") or "",
        where=m.group("where") or None,
        raw=m.group("raw") or None,
    )


def _cut(text: object) -> str | None:
    line = " ".join(str(text).split()) if text is not None else ""
    if not line:
        return None
    return line if len(line) <= RAW_CHARS else line[: RAW_CHARS - 1] + "…"
