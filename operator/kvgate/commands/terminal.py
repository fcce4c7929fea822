"""What `kvgate eval` and `kvgate diverge` show a person at a terminal.

Both commands print one JSON summary line (the operator's eval Job reads it) when stdout is piped
or with `--json`; on a terminal, without `--json`, the same summary is rendered here as text:
the verdict and its claim first, then the figures behind them (first-hour #14, N18).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any, Final

from kvgate.evaluation.gate import GSM8K_TEST_QUESTIONS, PROGRESS_KIND, reason_words
from kvgate.vocabulary import CONTROL_BELOW_FLOOR

NO_TASK: Final = "none"  # `eval --task none`: the long-context task alone (the summary's task)


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or exotic stream: not a terminal
        return False


def json_line(obj: Mapping[str, Any]) -> str:
    """One compact JSON line: how the Jobs' logs carry progress and summaries."""
    return json.dumps(obj, separators=(",", ":")) + "\n"


def json_emitter(stream: IO[str]) -> Callable[[dict[str, Any]], None]:
    """Writes JSON lines to `stream`, the real stdout (also while lm-eval's goes to stderr),
    one line at a time from any thread."""
    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        with lock:
            stream.write(json_line(obj))
            stream.flush()

    return emit


def human_emitter(out: IO[str], err: IO[str]) -> Callable[[dict[str, Any]], None]:
    """One stderr line per look, and the summary as text on `out` (the real stdout)."""

    def emit(obj: dict[str, Any]) -> None:
        if obj.get("kind") == PROGRESS_KIND:
            err.write(progress_text(obj) + "\n")
            err.flush()
        else:
            out.write(summary_text(obj) + "\n")
            out.flush()

    return emit


def _pct(correct: int, n: int) -> str:
    return f"{100 * correct / n:.1f}%" if n else "-"


def progress_text(line: dict[str, Any]) -> str:
    """`look 2/6: 200 questions, control 88.0%, candidate 87.5% (-0.5 pp); continuing`."""
    paired = line["paired"]
    n = line["questions"]
    control = paired["both"] + paired["control_only"]
    candidate = paired["both"] + paired["candidate_only"]
    reason = reason_words(line["reason"])
    state = "continuing" if line["verdict"] is None else f"{line['verdict']} ({reason})"
    return (
        f"kvgate eval: look {line['look']}/{line['looks_planned']}: {n} questions, "
        f"control {_pct(control, n)}, candidate {_pct(candidate, n)} "
        f"({100 * line['difference']:+.1f} pp); {state}"
    )


def summary_text(summary: dict[str, Any]) -> str:
    """The summary for a person: verdict and claim first, then the figures behind them."""
    overall = summary.get("overall")
    verdict = overall["verdict"] if overall else summary["verdict"]
    lines = [f"verdict: {verdict}"]
    if overall and overall["task"]:
        where = f" at {overall['bucket']} tokens" if overall.get("bucket") else ""
        lines[0] += f" (decided by {overall['task']}{where}: {overall['reason']})"
    task = summary["task"]
    if task != NO_TASK:
        lines.append(
            f"{task}: {summary['verdict']}"
            + (f" ({reason_words(summary['reason'])})" if summary.get("reason") else "")
        )
    if summary.get("claim"):
        lines.append(f"  {summary['claim']}")
    if summary.get("error") and (task != NO_TASK or summary.get("long_context") is None):
        lines.append(f"  error: {summary['error']}")
    control, candidate = summary.get("control"), summary.get("candidate")
    if control and candidate:
        lines.append(
            f"  {summary['questions_used']} of {summary['questions_planned']} questions, "
            f"look {summary['looks']} of {summary['looks_planned']}"
        )
        for name, arm in (("control  ", control), ("candidate", candidate)):
            lines.append(f"  {name} {_pct(arm['correct'], arm['n'])} ({arm['correct']}/{arm['n']})")
        paired = summary["paired"]
        lines.append(
            f"  difference {100 * paired['difference']:+.1f} pp "
            f"({paired['control_only']} right only on control, "
            f"{paired['candidate_only']} only on candidate)"
        )
        if (advice := advice_text(summary)) is not None:
            lines.append(f"  {advice}")
    lc = summary.get("long_context")
    if lc is not None:
        text = f"long context: {lc['verdict']}"
        if lc.get("failing_bucket"):
            text += f" at {lc['failing_bucket']} tokens"
        if lc.get("reason"):
            text += f" ({lc['reason']})"
        if lc.get("error"):
            text += f"; {lc['error']}"
        lines.append(text)
    div = summary.get("divergence")
    if div is not None:
        lines.append(screen_line(div))
    if summary.get("output"):
        lines.append(f"per-question records: {summary['output']}")
    return "\n".join(lines)


def advice_text(summary: dict[str, Any]) -> str | None:
    """For an open question, about how many questions would decide it, as an estimate (N18).

    The figure is the summary's `advice` (`kvgate.judge.stats.questions_needed`: a fixed-n test's
    questions for 80% power at the observed discordance, if the candidate loses nothing), the
    one the operator's gate message and the report give. None when the eval decided, or when
    more questions cannot help (a control below the margin) or the figure is missing.
    """
    if summary.get("verdict") != "inconclusive" or summary.get("reason") == CONTROL_BELOW_FLOOR:
        return None
    advice = summary.get("advice") or {}
    needed = advice.get("questions_needed")
    discordance = advice.get("discordance")
    if not isinstance(needed, int) or not isinstance(discordance, int | float):
        return None
    text = (
        f"about {needed:,} questions would decide (an estimate: 80% power at this run's "
        f"{100 * discordance:.1f}% discordant questions, if the candidate loses nothing"
    )
    used = summary.get("questions_used")
    if isinstance(used, int) and used >= needed:  # the estimate assumes no loss; one was seen
        return text + f"; this run used {used:,}: its observed difference keeps it open)"
    if needed > GSM8K_TEST_QUESTIONS:
        return text + f"; more than GSM8K's {GSM8K_TEST_QUESTIONS:,}: a wider --margin decides)"
    return text + ")"


def screen_line(div: dict[str, Any]) -> str:
    """The divergence screen's verdict in one line: eval's summary and diverge's first line."""
    text = f"divergence screen: {div['verdict']} ({div['documents']} documents of "
    text += f"{div['max_tokens']} tokens)"
    if div.get("flagged_buckets"):
        text += f"; flagged positions {', '.join(div['flagged_buckets'])}"
    if div.get("error"):
        text += f"; {div['error']}"
    return text


_BUCKET_REASONS: Final = {
    "kl_above_floor": "mean KL",
    "top1_disagreement_above_floor": "top-1 disagreement",
}


def diverge_text(summary: dict[str, Any]) -> str:
    """`kvgate diverge`'s summary for a person: the verdict, what it compares, one line per
    position bucket (the candidate against the control's own repeat, the A/A floor)."""
    lines = [screen_line(summary)]
    settings = summary.get("settings") or {}
    if summary.get("buckets"):
        lines.append(
            f"  {summary.get('positions', 0):,} positions, top-{summary['logprobs']} log-probs; "
            f"a bucket is flagged above {settings.get('factor', '?'):g}x the control's "
            "run-to-run floor (A/A)"
        )
    for row in summary.get("buckets") or []:
        cand, floor = row["candidate"], row["floor"]
        if not row["positions"]:
            lines.append(f"  positions {row['bucket']}: none compared")
            continue
        state = "ok"
        if row["flagged"]:
            named = [_BUCKET_REASONS.get(r, r) for r in row["reasons"]]
            state = f"flagged ({' and '.join(named)})"
        lines.append(
            f"  positions {row['bucket']}: mean KL {cand['mean_kl']:.2g} vs A/A "
            f"{floor['mean_kl']:.2g}, top-1 differs {_share(cand)} vs A/A {_share(floor)}; "
            f"{state}"
        )
    return "\n".join(lines)


def _share(stats: dict[str, Any]) -> str:
    agreement = stats.get("top1_agreement")
    return "-" if agreement is None else f"{100 * (1 - agreement):.1f}%"
