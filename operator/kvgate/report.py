"""Render a KVCacheRollout for people: a terminal summary and a self-contained HTML page.

Pure: takes the rollout object as a dict (as `kubectl get kvr NAME -o json` prints it) and
returns text. Every status field is optional, because a report is asked for at any phase and
an older operator may not write every field; what is missing is shown as "-", never guessed.
Keys are read in camelCase (the CRD) and, where the eval summary is copied as is, snake_case.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, overload

ARMS: Final = ("control", "candidate")
# kstatus conditions say how the object is doing, not what the gates found.
_KSTATUS: Final = frozenset({"Ready", "Reconciling", "Stalled"})
_DASH: Final = "-"
_WRAP: Final = 100  # terminal report width for long log lines and remedies
_GATE_ORDER: Final = {
    g: i
    for i, g in enumerate(
        (
            "poolPressure",
            "scales",
            "canary",
            "engineTruth",
            "backend",
            "capacityGain",
            "accuracy",
            "speed",
        )
    )
}


# ---------------------------------------------------------------- reading the dict


def _get(mapping: Any, *keys: str) -> Any:
    """The first present key of `keys` in `mapping` (camelCase first, then snake_case)."""
    if not isinstance(mapping, Mapping):
        return None
    for key in keys:
        if key in mapping and mapping[key] is not None:
            return mapping[key]
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Mapping):
        value = [_get(value, "low", "lower"), _get(value, "high", "upper")]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        low, high = _num(value[0]), _num(value[1])
        if low is not None and high is not None:
            return (low, high)
    return None


@overload
def _as_fraction(value: float) -> float: ...
@overload
def _as_fraction(value: float | None) -> float | None: ...
def _as_fraction(value: float | None) -> float | None:
    """Accuracy may be a fraction (0.918) or a percentage (91.8); return a fraction."""
    if value is None:
        return None
    return value / 100.0 if value > 1.0 else value


@dataclass(frozen=True, slots=True)
class ArmAccuracy:
    """One arm's GSM8K score: right answers, questions, and the 95% Wilson interval."""

    correct: int | None
    n: int | None
    accuracy: float | None
    wilson: tuple[float, float] | None


@dataclass(frozen=True, slots=True)
class Accuracy:
    """The paired accuracy gate as the eval summary reports it."""

    verdict: str | None
    task: str | None
    margin: float | None
    confidence: float | None
    questions_used: int | None
    stopped_early: bool | None
    arms: dict[str, ArmAccuracy]
    difference: float | None
    difference_ci: tuple[float, float] | None
    mcnemar_p: float | None
    discordant: tuple[int, int] | None
    ruled_out: float | None
    questions_needed: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Finding:
    """One gate's result: a condition (or a findings entry) with its reason and message."""

    gate: str
    status: str
    reason: str
    message: str


def _int(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def read_accuracy(status: Mapping[str, Any]) -> Accuracy | None:
    """`status.accuracy` (the eval summary, camelCase or snake_case) as an `Accuracy`."""
    acc = _get(status, "accuracy")
    if not isinstance(acc, Mapping):
        return None
    arms: dict[str, ArmAccuracy] = {}
    for arm in ARMS:
        raw = _get(acc, arm)
        if not isinstance(raw, Mapping):
            continue
        correct, n = _int(_get(raw, "correct")), _int(_get(raw, "n", "total"))
        accuracy = _as_fraction(_num(_get(raw, "accuracy")))
        if accuracy is None and correct is not None and n:
            accuracy = correct / n
        wilson = _interval(_get(raw, "wilson95", "wilson", "interval"))
        if wilson is not None and max(wilson) > 1.0:
            wilson = (wilson[0] / 100.0, wilson[1] / 100.0)
        arms[arm] = ArmAccuracy(correct, n, accuracy, wilson)
    paired = _get(acc, "paired")
    paired = paired if isinstance(paired, Mapping) else {}
    control_only = _int(_get(paired, "controlOnly", "control_only"))
    candidate_only = _int(_get(paired, "candidateOnly", "candidate_only"))
    advice = _get(acc, "advice")
    stopped = _get(acc, "stoppedEarly", "stopped_early")
    return Accuracy(
        verdict=_str_or_none(_get(acc, "verdict")),
        task=_str_or_none(_get(acc, "task")),
        margin=_num(_get(acc, "margin")),
        confidence=_num(_get(acc, "confidence")),
        questions_used=_int(_get(acc, "questionsUsed", "questions_used")),
        stopped_early=stopped if isinstance(stopped, bool) else None,
        arms=arms,
        difference=_difference(acc, paired),
        difference_ci=_interval(_get(paired, "tango95", "interval", "ci95")),
        mcnemar_p=_num(_get(paired, "mcnemarP", "mcnemar_p")),
        discordant=(
            (control_only, candidate_only)
            if control_only is not None and candidate_only is not None
            else None
        ),
        ruled_out=_num(_get(acc, "largestLossRuledOut", "largest_loss_ruled_out")),
        questions_needed=_int(_get(advice, "questionsNeeded", "questions_needed")),
        error=_str_or_none(_get(acc, "error")),
    )


def _difference(acc: Mapping[str, Any], paired: Mapping[str, Any]) -> float | None:
    """Candidate minus control as a fraction; the CRD's `differencePp` is in points."""
    points = _num(_get(acc, "differencePp"))
    if points is not None:
        return points / 100.0
    return _num(_get(paired, "difference"))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def read_findings(status: Mapping[str, Any]) -> list[Finding]:
    """Gate results: `status.findings`, else `status.gates` (by gate name), else conditions."""
    raw = _get(status, "findings")
    found: list[Finding] = []
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        for item in raw:
            if isinstance(item, Mapping):
                found.append(_finding(str(_get(item, "gate", "type", "name") or _DASH), item))
            elif isinstance(item, str):
                found.append(Finding(gate="Finding", status=_DASH, reason="", message=item))
    gates = _get(status, "gates")
    if not found and isinstance(gates, Mapping):
        found = [_finding(str(k), v) for k, v in gates.items() if isinstance(v, Mapping)]
        # The order the gates run in; unknown names keep their place after them.
        found.sort(key=lambda f: _GATE_ORDER.get(f.gate, len(_GATE_ORDER)))
    if found:
        return found
    return [
        _finding(str(cond.get("type", _DASH)), cond)
        for cond in _conditions(status)
        if cond.get("type") not in _KSTATUS
    ]


def _finding(gate: str, item: Mapping[str, Any]) -> Finding:
    return Finding(
        gate=gate,
        status=str(_get(item, "outcome", "status", "result", "verdict") or _DASH),
        reason=str(_get(item, "reason") or ""),
        message=str(_get(item, "message") or ""),
    )


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = _get(status, "conditions")
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return []
    return [c for c in raw if isinstance(c, Mapping)]


def _arm_block(status: Mapping[str, Any], section: str, arm: str) -> Mapping[str, Any]:
    """`status.<section>.<arm>`, falling back to `status.arms.<arm>`."""
    block = _get(_get(status, section), arm)
    if isinstance(block, Mapping):
        return block
    block = _get(_get(status, "arms"), arm)
    return block if isinstance(block, Mapping) else {}


def read_kv_tokens(status: Mapping[str, Any], arm: str) -> float | None:
    """The arm's KV cache size in tokens, as its engine reported it at startup."""
    block = _arm_block(status, "capacity", arm)
    tokens = _num(_get(block, "kvTokens", "kvCacheTokens", "kv_tokens", "tokens"))
    if tokens is None:
        tokens = _num(_get(_get(_get(status, "arms"), arm), "kvTokens"))
    if tokens is None:
        tokens = _num(_get(_get(_scan(status, arm), "capacity"), "kv_tokens"))
    return tokens


def _scan(status: Mapping[str, Any], arm: str) -> Mapping[str, Any]:
    """The arm's startup-log scan (`status.arms.<arm>.scan`), or {}."""
    scan = _get(_get(_get(status, "arms"), arm), "scan")
    return scan if isinstance(scan, Mapping) else {}


def _capacity_rows(status: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []
    for arm in ARMS:
        block = _arm_block(status, "capacity", arm)
        scan = _scan(status, arm)
        dtype = _get(block, "kvCacheDtype", "kvDtype", "kv_cache_dtype", "dtype") or _get(
            scan, "kv_cache_dtype"
        )
        tokens = read_kv_tokens(status, arm)
        conc = _num(_get(block, "maxConcurrency", "max_concurrency"))
        if conc is None:
            conc = _num(_get(_get(scan, "capacity"), "max_concurrency"))
        backend = (
            _get(block, "attentionBackend", "backend")
            or _get(_get(_get(status, "arms"), arm), "attentionBackend")
            or _get(scan, "attention_backend")
        )
        if dtype is None and tokens is None and conc is None and backend is None:
            continue
        rows.append(
            (
                arm,
                [
                    str(dtype) if dtype is not None else _DASH,
                    str(backend) if backend is not None else _DASH,
                    _fmt_int(tokens),
                    f"{conc:.1f}x" if conc is not None else _DASH,
                ],
            )
        )
    return rows


def read_capacity_gain(status: Mapping[str, Any]) -> float | None:
    """Candidate KV tokens over control KV tokens (from the status, else computed)."""
    gain = _num(_get(_get(status, "capacity"), "gain", "ratio", "kvTokensRatio"))
    if gain is not None:
        return gain
    control, candidate = read_kv_tokens(status, "control"), read_kv_tokens(status, "candidate")
    if control and candidate is not None:
        return candidate / control
    return None


def _speed_table(status: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Speed figures per arm; the metric names are whatever the operator measured."""
    speed = _get(status, "speed")
    if not isinstance(speed, Mapping):
        return [], []
    blocks = {arm: _get(speed, arm) for arm in ARMS}
    keys: list[str] = []
    for block in blocks.values():
        if isinstance(block, Mapping):
            keys.extend(k for k, v in block.items() if _num(v) is not None and k not in keys)
    rows = []
    for key in keys:
        cells = []
        for arm in ARMS:
            block = blocks[arm]
            cells.append(_fmt_num(_num(block.get(key)) if isinstance(block, Mapping) else None))
        rows.append((_humanize(key), cells))
    return list(ARMS), rows


def _humanize(key: str) -> str:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ")
    return words[:1].upper() + words[1:].lower()


@dataclass(frozen=True, slots=True)
class LogLine:
    """A notable startup-log finding of one arm: a warning or an error, with its remedy."""

    arm: str
    severity: str
    code: str
    text: str
    hint: str


def read_log_findings(status: Mapping[str, Any]) -> list[LogLine]:
    """Warnings and errors from each arm's startup-log scan (info lines are left out)."""
    out: list[LogLine] = []
    for arm in ARMS:
        for f in _get(_scan(status, arm), "findings") or []:
            if not isinstance(f, Mapping) or f.get("severity") not in ("warning", "error"):
                continue
            out.append(
                LogLine(
                    arm=arm,
                    severity=str(f["severity"]),
                    code=str(f.get("code") or ""),
                    text=str(f.get("text") or "").strip(),
                    hint=str(f.get("hint") or "").strip(),
                )
            )
    return out


def read_preflight(status: Mapping[str, Any]) -> list[str]:
    """One line each: production load against the KV pool, and the checkpoint's KV scales."""
    pre = _get(status, "preflight")
    lines: list[str] = []
    pressure = _get(pre, "pressure")
    if isinstance(pressure, Mapping):
        verdict = {True: "KV pool is the limit", False: "KV pool has room"}.get(
            _get(pressure, "pressured"), "pool pressure unknown"
        )
        facts = []
        usage = _num(_get(pressure, "max_usage", "maxUsage"))
        if usage is not None:
            facts.append(f"KV usage up to {_pct(usage)}")
        waiting = _num(_get(pressure, "mean_waiting", "meanWaiting"))
        if waiting is not None:
            facts.append(f"{waiting:.1f} requests waiting on average")
        samples = _int(_get(pressure, "samples"))
        if samples is not None:
            facts.append(f"{samples} samples")
        lines.append(f"{verdict}" + (f" ({', '.join(facts)})" if facts else ""))
    scales = _get(pre, "checkpointHasScales", "checkpoint_has_scales")
    if isinstance(scales, bool):
        lines.append(
            "checkpoint carries k/v scales"
            if scales
            else "checkpoint has no k/v scales: FP8 KV uses scale 1.0"
        )
    return lines


def read_remediation(status: Mapping[str, Any]) -> list[str]:
    """`status.remediation`: both candidate attempts, the crash and the remedy applied."""
    rem = _get(status, "remediation")
    if not isinstance(rem, Mapping):
        return []
    first = _get(rem, "firstAttempt") or {}
    first = first if isinstance(first, Mapping) else {}
    args = " ".join(str(a) for a in _get(rem, "args") or [])
    env = _get(rem, "env") or {}
    env_text = " and ".join(f"{k}={v}" for k, v in env.items()) if isinstance(env, Mapping) else ""
    remedy = " and ".join(p for p in (args, env_text) if p) or _DASH
    crashed = str(_get(first, "message") or "crashed").split("; starting the candidate again")[0]
    return [
        f"attempt 1 ({_get(first, 'attentionBackend') or 'backend unknown'}): {crashed}",
        f"attempt 2: {_get(rem, 'code')} remedied for {_get(rem, 'engine')} "
        f"{_get(rem, 'engineVersion')} with {remedy}; gated like any other candidate",
    ]


def read_verdict(status: Mapping[str, Any]) -> str | None:
    """`status.verdict`: the decision and why, as one line."""
    v = _get(status, "verdict")
    if not isinstance(v, Mapping):
        return None
    decision = _get(v, "decision")
    message = _get(v, "message")
    if decision and message:
        return f"{decision}: {message}"
    return _str_or_none(decision or message)


def read_duration(status: Mapping[str, Any]) -> str | None:
    """How long the rollout ran (startedAt to finishedAt), e.g. "4 min 12 s"."""
    import datetime as dt

    def parse(text: Any) -> dt.datetime | None:
        if not isinstance(text, str):
            return None
        try:
            return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None

    start, end = parse(_get(status, "startedAt")), parse(_get(status, "finishedAt"))
    if start is None or end is None or end < start:
        return None
    seconds = int((end - start).total_seconds())
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


# The operator ends a message with "; remedy: <text>", or "; remedy for <engine> <version>:
# <text>" when the remedy comes from the engine version's facts.
_REMEDY = re.compile(r"; (remedy(?: for [^:;]+)?): ")


def split_remedy(message: str) -> tuple[str, str | None]:
    """("what happened", "what to do") from an operator message "...; remedy[ for E V]: ..."."""
    match = _REMEDY.search(message)
    if match is None:
        return message, None
    label = match.group(1)
    remedy = message[match.end() :]
    # "remedy for vllm 0.11.0: X" keeps the engine version it was chosen for.
    version = label.removeprefix("remedy").removeprefix(" for ")
    return message[: match.start()], f"{remedy} (for {version})" if version else remedy


def args_heading(status: Mapping[str, Any]) -> str:
    """The args are a recommendation only when the candidate was not rejected."""
    phase = _get(status, "phase")
    bad = isinstance(phase, str) and phase in _BAD_PHASES
    return "Rejected candidate args" if bad else "Recommended args"


def shell_command(args: Sequence[str]) -> str:
    """`args` as a copy-pasteable shell command: the program, then one flag (and value) a line."""
    import shlex

    lines: list[list[str]] = [[]]
    for arg in args:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return " \\\n  ".join(" ".join(line) for line in lines if line)


def read_recommended_args(status: Mapping[str, Any]) -> list[str]:
    raw = _get(status, "recommendedArgs", "recommended_args")
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, Sequence):
        return [str(a) for a in raw]
    return []


# ---------------------------------------------------------------- formatting


def _fmt_int(value: float | None) -> str:
    return _DASH if value is None else f"{round(value):,}"


def _fmt_num(value: float | None) -> str:
    if value is None:
        return _DASH
    if value == int(value) and abs(value) >= 100:
        return f"{int(value):,}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return _DASH if value is None else f"{100.0 * value:.1f}%"


def _pp(value: float | None) -> str:
    """A difference in percentage points; the summary gives fractions (-0.004 = -0.4 pp)."""
    if value is None:
        return _DASH
    return f"{_to_pp(value):+.1f} pp"


def _to_pp(value: float) -> float:
    # Summaries write differences as fractions; a magnitude above 1 is already in pp.
    return value * 100.0 if abs(value) <= 1.0 else value


def _wilson(ci: tuple[float, float] | None) -> str:
    return _DASH if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _table(
    header: Sequence[str], rows: Iterable[Sequence[str]], numeric_from: int = 1
) -> list[str]:
    """Aligned columns: text left, numbers (columns from `numeric_from` on) right.

    A text last column that would run past the report width wraps under itself.
    """
    body = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    last = len(header) - 1
    indent = 2 + sum(w + 2 for w in widths[:last])
    room = max(30, _WRAP - indent)
    lines = []
    for row in body:
        cells = [
            cell.rjust(widths[i]) if i >= numeric_from else cell.ljust(widths[i])
            for i, cell in enumerate(row[:last])
        ]
        tail = row[last]
        if last < numeric_from and len(tail) > room:
            parts = textwrap.wrap(tail, width=room) or [""]
            lines.append(("  " + "  ".join([*cells, parts[0]])).rstrip())
            lines += [" " * indent + p for p in parts[1:]]
            continue
        tail = tail.rjust(widths[last]) if last >= numeric_from else tail
        lines.append(("  " + "  ".join([*cells, tail])).rstrip())
    return lines


def _identity(rollout: Mapping[str, Any]) -> tuple[str, str]:
    meta = _get(rollout, "metadata") or {}
    return str(_get(meta, "namespace") or _DASH), str(_get(meta, "name") or _DASH)


def _target(spec: Mapping[str, Any]) -> str:
    ref = _get(spec, "targetRef", "target", "deployment")
    if isinstance(ref, Mapping):
        kind = _get(ref, "kind") or "Deployment"
        return f"{kind}/{_get(ref, 'name') or _DASH}"
    return str(ref) if ref else _DASH


def _mode(spec: Mapping[str, Any]) -> str | None:
    """Promotion mode (auto, manual, report): `spec.promotion.mode`."""
    return _str_or_none(_get(_get(spec, "promotion"), "mode") or _get(spec, "mode"))


def _ready(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(status) if c.get("type") == "Ready"), None)


def _mark(status: str) -> str:
    return {"True": "ok", "False": "NO", "Unknown": "?"}.get(status, status)


# ---------------------------------------------------------------- text


def render_text(rollout: Mapping[str, Any]) -> str:
    """A terminal summary: verdict, findings, accuracy, capacity, speed, recommended args."""
    spec = _get(rollout, "spec") or {}
    status = _get(rollout, "status") or {}
    namespace, name = _identity(rollout)
    phase = str(_get(status, "phase") or "Pending")
    lines = [f"KVCacheRollout {namespace}/{name}: {phase}"]
    mode = _mode(spec)
    facts = [f"target {_target(spec)}"]
    if mode:
        facts.append(f"mode {mode}")
    dtype = _get(spec, "kvCacheDtype")
    if dtype:
        facts.append(f"candidate --kv-cache-dtype {dtype}")
    lines.append("  " + ", ".join(facts))
    message = _get(status, "message")
    ready = _ready(status)
    message = message or (ready.get("message") if ready is not None else None)
    if message:
        what, remedy = split_remedy(str(message))
        lines += textwrap.wrap(what, _WRAP, initial_indent="  ", subsequent_indent="    ")
        if remedy:
            lines += textwrap.wrap(
                f"remedy: {remedy}", _WRAP, initial_indent="  ", subsequent_indent="    "
            )
    verdict = read_verdict(status)
    if verdict:
        lines += textwrap.wrap(
            f"verdict {verdict}", _WRAP, initial_indent="  ", subsequent_indent="    "
        )
    took = read_duration(status)
    if took:
        lines.append(f"  took {took}")

    remediation = read_remediation(status)
    if remediation:
        lines += ["", "Remediation"]
        for line in remediation:
            lines += textwrap.wrap(line, _WRAP, initial_indent="  ", subsequent_indent="    ")

    pre = read_preflight(status)
    if pre:
        lines += ["", "Production", *[f"  {p}" for p in pre]]

    findings = read_findings(status)
    if findings:
        lines += ["", "Findings"]
        lines += _table(
            ["gate", "result", "reason", "message"],
            [[f.gate, _mark(f.status), f.reason, f.message] for f in findings],
            numeric_from=99,
        )

    log_lines = read_log_findings(status)
    if log_lines:
        lines += ["", "Startup logs"]
        for ll in log_lines:
            lines += textwrap.wrap(
                f"{ll.arm} {ll.severity} {ll.code}: {ll.text}",
                width=_WRAP,
                initial_indent="  ",
                subsequent_indent="      ",
            )
            if ll.hint:
                lines += textwrap.wrap(
                    f"remedy: {ll.hint}",
                    width=_WRAP,
                    initial_indent="    ",
                    subsequent_indent="      ",
                )

    acc = read_accuracy(status)
    if acc is not None:
        lines += ["", _accuracy_heading(acc)]
        if acc.arms:
            lines += _table(
                ["arm", "correct", "n", "accuracy", "95% Wilson"],
                [
                    [
                        arm,
                        _fmt_int(a.correct),
                        _fmt_int(a.n),
                        _pct(a.accuracy),
                        _wilson(a.wilson),
                    ]
                    for arm, a in acc.arms.items()
                ],
            )
        lines += [f"  {line}" for line in _accuracy_notes(acc)]
    lc_rows = long_context_rows(status)
    if lc_rows:
        lines += ["", "Long context (paired, per context length)"]
        lines += _table(_LC_HEADER, lc_rows)
    div_rows = divergence_rows(status)
    if div_rows:
        lines += ["", "Token divergence (teacher-forced, per position bucket)"]
        lines += _table(_DIV_HEADER, div_rows)

    cap_rows = _capacity_rows(status)
    if cap_rows:
        lines += ["", "Capacity"]
        lines += _table(
            ["arm", "KV dtype", "backend", "KV tokens", "max concurrency"],
            [[arm, *cells] for arm, cells in cap_rows],
            numeric_from=3,
        )
        gain = read_capacity_gain(status)
        if gain is not None:
            lines.append(f"  candidate holds {gain:.2f}x the control's KV tokens")

    header, speed_rows = _speed_table(status)
    if speed_rows:
        lines += ["", "Speed"]
        lines += _table(["metric", *header], [[label, *cells] for label, cells in speed_rows])

    args = read_recommended_args(status)
    lines += ["", args_heading(status)]
    lines += (
        [f"  {line}" for line in shell_command(args).splitlines()] if args else ["  (none yet)"]
    )
    return "\n".join(lines) + "\n"


_LC_HEADER: Final = ("context", "control", "candidate", "recovery", "at least", "verdict")
_DIV_HEADER: Final = (
    "positions", "A/A mean KL", "candidate mean KL", "A/A top-1", "candidate top-1", "flag"
)  # fmt: skip


def _rows_of(status: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    accuracy = _get(status, "accuracy")
    block = accuracy.get(key) if isinstance(accuracy, Mapping) else None
    rows = block.get("buckets") if isinstance(block, Mapping) else None
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def long_context_rows(status: Mapping[str, Any]) -> list[list[str]]:
    """Per context-length bucket: both arms' scores, recovery, the lower bound, the verdict."""
    out = []
    for r in _rows_of(status, "long_context"):
        n = _int(r.get("context_length"))
        out.append(
            [
                f"{n:,} tokens" if n else _DASH,
                _pct(_num((r.get("control") or {}).get("accuracy"))),
                _pct(_num((r.get("candidate") or {}).get("accuracy"))),
                _fmt_num(_num(r.get("recovery"))),
                _pp(_num((r.get("bounds") or {}).get("lower"))),
                f"{r.get('verdict', _DASH)} ({r.get('reason', _DASH)})",
            ]
        )
    return out


def divergence_rows(status: Mapping[str, Any]) -> list[list[str]]:
    """Per position bucket: the A/A floor and the candidate, KL and top-1 agreement."""
    out = []
    for r in _rows_of(status, "divergence"):
        f, c = r.get("floor") or {}, r.get("candidate") or {}
        out.append(
            [
                str(r.get("bucket", _DASH)),
                f"{_num(f.get('mean_kl')) or 0:.3g}",
                f"{_num(c.get('mean_kl')) or 0:.3g}",
                _pct(_num(f.get("top1_agreement"))),
                _pct(_num(c.get("top1_agreement"))),
                "FLAG" if r.get("flagged") else "",
            ]
        )
    return out


def _kilo(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def render_long_context_svg(status: Mapping[str, Any]) -> str:
    """Score against context length for both arms (log2 x axis), or '' without buckets."""
    points = []
    for r in _rows_of(status, "long_context"):
        n = _int(r.get("context_length"))
        a = _num((r.get("control") or {}).get("accuracy"))
        b = _num((r.get("candidate") or {}).get("accuracy"))
        if n and n > 0 and a is not None and b is not None:
            points.append((math.log2(n), a, b, n))
    if not points:
        return ""
    w, h, left, right, top, bottom = 480, 220, 50, 20, 15, 35
    lo, hi = points[0][0], points[-1][0]
    span = max(hi - lo, 1.0)

    def x(v: float) -> float:
        return left + (v - lo) / span * (w - left - right)

    def y(v: float) -> float:
        return top + (1 - v) * (h - top - bottom)

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' "
        "aria-label='score against context length'>",
        f"<line x1='{left}' y1='{y(0)}' x2='{w - right}' y2='{y(0)}' stroke='#888'/>",
        f"<line x1='{left}' y1='{y(0)}' x2='{left}' y2='{y(1)}' stroke='#888'/>",
    ]
    for v in (0.0, 0.5, 1.0):
        parts.append(f"<text x='{left - 6}' y='{y(v) + 4}' text-anchor='end'>{v:.0%}</text>")
    for px, _, _, n in points:
        parts.append(f"<text x='{x(px)}' y='{h - 12}' text-anchor='middle'>{_kilo(n)}</text>")
    for index, colour, label in ((1, "#1f77b4", "control"), (2, "#d62728", "candidate")):
        line = " ".join(f"{x(pt[0]):.1f},{y(pt[index]):.1f}" for pt in points)
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{line}'/>")
        parts += [
            f"<circle cx='{x(pt[0]):.1f}' cy='{y(pt[index]):.1f}' r='3' fill='{colour}'/>"
            for pt in points
        ]
        parts.append(
            f"<text x='{w - right}' y='{top + 14 * index}' text-anchor='end' "
            f"fill='{colour}'>{label}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _accuracy_heading(acc: Accuracy) -> str:
    parts = [acc.task or "accuracy", "paired"]
    if acc.questions_used is not None:
        parts.append(f"{acc.questions_used:,} questions")
    if acc.margin is not None:
        parts.append(f"margin {abs(_to_pp(acc.margin)):.1f} pp")
    if acc.confidence is not None:
        parts.append(f"{100 * _as_fraction(acc.confidence):.0f}% confidence")
    return f"Accuracy ({', '.join(parts)})"


def _accuracy_notes(acc: Accuracy) -> list[str]:
    notes = []
    if acc.difference is not None:
        line = f"candidate - control: {_pp(acc.difference)}"
        if acc.difference_ci is not None:
            low, high = acc.difference_ci
            line += f", 95% CI [{_to_pp(low):+.1f}, {_to_pp(high):+.1f}] pp"
        if acc.mcnemar_p is not None:
            line += f", McNemar p={acc.mcnemar_p:.3g}"
        notes.append(line)
    if acc.discordant is not None:
        notes.append(
            f"answers that differ: control-only right {acc.discordant[0]}, "
            f"candidate-only right {acc.discordant[1]}"
        )
    if acc.verdict is not None:
        verdict = f"verdict: {acc.verdict}"
        if acc.ruled_out is not None:
            verdict += (
                f" (the sequential test rules out a loss larger than "
                f"{abs(_to_pp(acc.ruled_out)):.1f} pp)"
            )
        if acc.stopped_early:
            verdict += ", stopped early"
        notes.append(verdict)
    if acc.questions_needed is not None and acc.verdict == "inconclusive":
        notes.append(f"about {acc.questions_needed:,} questions would settle it")
    if acc.error:
        notes.append(f"error: {acc.error}")
    return notes


# ---------------------------------------------------------------- HTML

_CSS: Final = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:60rem;padding:0 1rem;color:#1d2330;background:#fbfcfe}
h1{font-size:1.5rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.8rem 0 .5rem}
.sub{color:#5b6475;margin:0 0 1rem}.badge{display:inline-block;padding:.15rem .6rem;
border-radius:1rem;font-weight:600;font-size:.9rem;vertical-align:middle;margin-left:.5rem}
.good{background:#dff5e3;color:#17612a}.bad{background:#fde2e1;color:#8a1c17}
.wait{background:#fff1cc;color:#7a5500}.info{background:#e4ecfb;color:#1f3f7a}
table{border-collapse:collapse;width:100%;margin:.3rem 0}th,td{padding:.35rem .6rem;
border-bottom:1px solid #e3e7ee;text-align:left;vertical-align:top}td.n,th.n{text-align:right;
font-variant-numeric:tabular-nums}th{font-weight:600;color:#5b6475;font-size:.85rem}
code{background:#eef1f6;padding:.15rem .35rem;border-radius:.25rem}
pre{background:#eef1f6;padding:.7rem .9rem;border-radius:.4rem;overflow-x:auto}
.msg{background:#fff;border-left:4px solid #9aa5b8;padding:.6rem .9rem;overflow-wrap:anywhere}
.remedy{border-left-color:#d9822b}
svg{background:#fff;border:1px solid #e3e7ee;border-radius:.4rem;max-width:100%}
ul.notes{margin:.3rem 0;padding-left:1.2rem}td.ok{color:#17612a;font-weight:600}
td.no{color:#8a1c17;font-weight:600}td.maybe{color:#7a5500;font-weight:600}
"""

_GOOD_PHASES: Final = frozenset({"Promoted", "NotNeeded", "Passed", "Succeeded", "Reported"})
_BAD_PHASES: Final = frozenset({"RolledBack", "Failed", "Rejected", "Error"})
_WAIT_PHASES: Final = frozenset({"AwaitingApproval", "Paused", "Suspended"})
_COLORS: Final = {"control": "#5b6f95", "candidate": "#d9822b"}


def _phase_class(phase: str) -> str:
    if not isinstance(phase, str):  # a hand-edited status may hold anything
        return "info"
    if phase in _GOOD_PHASES:
        return "good"
    if phase in _BAD_PHASES:
        return "bad"
    if phase in _WAIT_PHASES:
        return "wait"
    return "info"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric_from: int) -> str:
    def cell(tag: str, i: int, text: str) -> str:
        cls = ' class="n"' if i >= numeric_from else ""
        return f"<{tag}{cls}>{_e(text)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Point(NamedTuple):
    """An arm with a score, as the accuracy panel draws it."""

    accuracy: float
    wilson: tuple[float, float] | None


def render_svg(status: Mapping[str, Any]) -> str:
    """Two panels side by side: accuracy with Wilson intervals, and KV tokens, per arm."""
    acc = read_accuracy(status)
    tokens = {arm: read_kv_tokens(status, arm) for arm in ARMS}
    width, height, pad = 640, 260, 44
    panel = (width - 3 * pad) / 2
    top, bottom = 36, height - 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" '
        'aria-label="Accuracy with 95% Wilson intervals and KV cache tokens per arm" '
        'font-family="system-ui,sans-serif" font-size="12">'
    ]
    # Left panel: accuracy. The axis spans the intervals with some room, so small
    # differences stay visible instead of being flattened against a 0-100% axis.
    x0 = pad
    parts.append(f'<text x="{x0}" y="20" font-weight="600">Accuracy, 95% Wilson interval</text>')
    points = {
        arm: _Point(a.accuracy, a.wilson)
        for arm, a in (acc.arms.items() if acc else [])
        if a.accuracy is not None
    }
    if points:
        lows = [a.wilson[0] if a.wilson else a.accuracy for a in points.values()]
        highs = [a.wilson[1] if a.wilson else a.accuracy for a in points.values()]
        lo = max(0.0, min(lows) - 0.02)
        hi = min(1.0, max(highs) + 0.02)
        if hi - lo < 0.04:
            hi, lo = min(1.0, hi + 0.02), max(0.0, lo - 0.02)

        def y_of(v: float) -> float:
            return bottom - (v - lo) / (hi - lo) * (bottom - top)

        for tick in _ticks(lo, hi):
            y = y_of(tick)
            parts.append(
                f'<line x1="{x0}" x2="{x0 + panel:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                'stroke="#eef1f6"/>'
                f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#5b6475">'
                f"{100 * tick:.0f}%</text>"
            )
        for i, arm in enumerate(ARMS):
            a = points.get(arm)
            if a is None:
                continue
            cx = x0 + panel * (i + 1) / 3
            color = _COLORS[arm]
            if a.wilson is not None:
                y1, y2 = y_of(a.wilson[0]), y_of(a.wilson[1])
                parts.append(
                    f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                    f'<line x1="{cx - 10:.1f}" x2="{cx + 10:.1f}" y1="{y1:.1f}" y2="{y1:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                    f'<line x1="{cx - 10:.1f}" x2="{cx + 10:.1f}" y1="{y2:.1f}" y2="{y2:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                )
            cy = y_of(a.accuracy)
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}">'
                f"<title>{_e(arm)}: {_pct(a.accuracy)} {_wilson(a.wilson)}</title></circle>"
                f'<text x="{cx + 14:.1f}" y="{cy + 4:.1f}" fill="{color}">'
                f"{_pct(a.accuracy)}</text>"
                f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle">{_e(arm)}</text>'
            )
    else:
        parts.append(_no_data(x0, panel, top, bottom, f"no accuracy {_missing(status)}"))
    # Right panel: KV tokens as bars from zero, because the point is the ratio.
    x1 = 2 * pad + panel
    parts.append(f'<text x="{x1}" y="20" font-weight="600">KV cache size (tokens)</text>')
    known = {arm: t for arm, t in tokens.items() if t is not None}
    if known:
        peak = max(known.values()) or 1.0
        bar = panel / 4
        for i, arm in enumerate(ARMS):
            value = known.get(arm)
            cx = x1 + panel * (i + 1) / 3
            parts.append(
                f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle">{_e(arm)}</text>'
            )
            if value is None:
                continue
            h = value / peak * (bottom - top - 16)
            parts.append(
                f'<rect x="{cx - bar / 2:.1f}" y="{bottom - h:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}" fill="{_COLORS[arm]}" rx="3">'
                f"<title>{_e(arm)}: {_fmt_int(value)} tokens</title></rect>"
                f'<text x="{cx:.1f}" y="{bottom - h - 5:.1f}" text-anchor="middle">'
                f"{_fmt_int(value)}</text>"
            )
        parts.append(
            f'<line x1="{x1}" x2="{x1 + panel:.1f}" y1="{bottom}" y2="{bottom}" stroke="#9aa5b8"/>'
        )
        gain = read_capacity_gain(status)
        if gain is not None:
            parts.append(
                f'<text x="{x1 + panel:.1f}" y="20" text-anchor="end" fill="#5b6475">'
                f"{gain:.2f}x</text>"
            )
    else:
        parts.append(_no_data(x1, panel, top, bottom, f"no KV figures {_missing(status)}"))
    parts.append("</svg>")
    return "".join(parts)


def _missing(status: Mapping[str, Any]) -> str:
    """Why a figure is absent: not yet, or never (the rollout ended before measuring it)."""
    phase = _get(status, "phase")
    ended = isinstance(phase, str) and phase in (_GOOD_PHASES | _BAD_PHASES)
    done = ended or _get(status, "finishedAt")
    return "(not measured)" if done else "yet"


def _no_data(x: float, w: float, top: float, bottom: float, text: str) -> str:
    return (
        f'<text x="{x + w / 2:.1f}" y="{(top + bottom) / 2:.1f}" text-anchor="middle" '
        f'fill="#9aa5b8">{_e(text)}</text>'
    )


def _ticks(lo: float, hi: float) -> list[float]:
    span = hi - lo
    step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25) if span / s <= 6)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 6) for i in range(int((hi - first) / step + 1e-9) + 1)]


def render_html(rollout: Mapping[str, Any]) -> str:
    """A self-contained page (inline CSS and SVG, no scripts, no external links)."""
    spec = _get(rollout, "spec") or {}
    status = _get(rollout, "status") or {}
    namespace, name = _identity(rollout)
    phase = str(_get(status, "phase") or "Pending")
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>kvgate: {_e(namespace)}/{_e(name)} {_e(phase)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(name)}<span class='badge {_phase_class(phase)}'>{_e(phase)}</span></h1>",
        f"<p class='sub'>KVCacheRollout in namespace <code>{_e(namespace)}</code>, "
        f"target <code>{_e(_target(spec))}</code>"
        + (f", mode <code>{_e(_mode(spec))}</code>" if _mode(spec) else "")
        + "</p>",
    ]
    ready = _ready(status)
    message = _get(status, "message") or (ready.get("message") if ready else None)
    if message:
        what, remedy = split_remedy(str(message))
        out.append(f"<p class='msg'>{_e(what)}</p>")
        if remedy:
            out.append(f"<p class='msg remedy'><b>Remedy:</b> {_e(remedy)}</p>")
    facts = []
    verdict = read_verdict(status)
    if verdict:
        facts.append(f"verdict {verdict}")
    took = read_duration(status)
    if took:
        facts.append(f"took {took}")
    if facts:
        out.append("<p class='sub'>" + " · ".join(_e(f) for f in facts) + "</p>")
    out.append("<h2>Control and candidate</h2>")
    out.append(render_svg(status))
    args = read_recommended_args(status)
    out.append(f"<h2>{args_heading(status)}</h2>")
    out.append(f"<pre>{_e(shell_command(args))}</pre>" if args else "<p>(none yet)</p>")

    findings = read_findings(status)
    if findings:
        out.append("<h2>Findings</h2>")
        rows = "".join(
            f"<tr><td>{_e(f.gate)}</td><td class='{_result_class(f.status)}'>{_e(_mark(f.status))}"
            f"</td><td>{_e(f.reason)}</td><td>{_e(f.message)}</td></tr>"
            for f in findings
        )
        out.append(
            "<table><thead><tr><th>gate</th><th>result</th><th>reason</th><th>message</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
        )
    pre = read_preflight(status)
    if pre:
        out.append("<h2>Production</h2><ul class='notes'>")
        out.append("".join(f"<li>{_e(p)}</li>" for p in pre) + "</ul>")
    log_lines = read_log_findings(status)
    if log_lines:
        out.append("<h2>Startup logs</h2>")
        out.append(
            _html_table(
                ["arm", "severity", "finding", "line", "remedy"],
                [[ll.arm, ll.severity, ll.code, ll.text, ll.hint] for ll in log_lines],
                numeric_from=99,
            )
        )
    acc = read_accuracy(status)
    if acc is not None:
        out.append(f"<h2>{_e(_accuracy_heading(acc))}</h2>")
        if acc.arms:
            out.append(
                _html_table(
                    ["arm", "correct", "n", "accuracy", "95% Wilson"],
                    [
                        [
                            arm,
                            _fmt_int(a.correct),
                            _fmt_int(a.n),
                            _pct(a.accuracy),
                            _wilson(a.wilson),
                        ]
                        for arm, a in acc.arms.items()
                    ],
                    numeric_from=1,
                )
            )
        notes = _accuracy_notes(acc)
        if notes:
            out.append("<ul class='notes'>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    lc_rows = long_context_rows(status)
    if lc_rows:
        out.append("<h2>Long context (paired, per context length)</h2>")
        out.append(render_long_context_svg(status))
        out.append(_html_table(_LC_HEADER, lc_rows, numeric_from=1))
    div_rows = divergence_rows(status)
    if div_rows:
        out.append("<h2>Token divergence (teacher-forced, per position bucket)</h2>")
        out.append(_html_table(_DIV_HEADER, div_rows, numeric_from=1))
    cap_rows = _capacity_rows(status)
    if cap_rows:
        out.append("<h2>Capacity</h2>")
        out.append(
            _html_table(
                ["arm", "KV dtype", "backend", "KV tokens", "max concurrency"],
                [[arm, *cells] for arm, cells in cap_rows],
                numeric_from=3,
            )
        )
    header, speed_rows = _speed_table(status)
    if speed_rows:
        out.append("<h2>Speed</h2>")
        out.append(
            _html_table(["metric", *header], [[label, *cells] for label, cells in speed_rows], 1)
        )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _result_class(status: str) -> str:
    """Colour of a gate result: a condition status or an Outcome value."""
    if status in ("True", "Successful", "NotNeeded"):
        return "ok"
    if status in ("False", "Failed", "Error"):
        return "no"
    return "maybe"
