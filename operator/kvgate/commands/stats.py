"""`kvgate stats`: Wilson intervals per arm, the paired analysis, or a saved eval result."""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kvgate.errors import EvalError, InputError, ParseError, SpecError
from kvgate.evaluation.gate import EXIT_CODES, Verdict, assess_look, look_bounds, plan_gate
from kvgate.evaluation.records import QUESTION_KIND, read_question_lines
from kvgate.inputs import fraction, load_json, read_text
from kvgate.judge.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MARGIN,
    ArmResult,
    PairedCounts,
    analyse_paired,
    questions_needed,
)

# Paired modes exit as the gate would: 0 pass, 1 candidate shown worse, 3 inconclusive
# (a saved summary's own verdict decides for it; its `error` is 4).
EXAMPLES: Final = (
    "kvgate stats --paired 440,19,14,27 --margin 0.02",
    "kvgate stats --baseline 459/500 --candidate 454/500",
    "kvgate stats --from summary.json",
)

_FRACTION = re.compile(r"^\s*([0-9]{1,12})\s*/\s*([0-9]{1,12})\s*$", re.ASCII)
# Counts above this are not an eval run (GSM8K has 1,319 questions).
MAX_COUNT = 10_000_000
_SUMMARY_KIND = "kvgate.eval/summary"
_HEADER = f"{'arm':<11} {'right/n':>11}   accuracy  Wilson 95%"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        "--control",
        dest="baseline",
        metavar="K/N",
        help="the control arm's right answers / questions (--control is the same option)",
    )
    parser.add_argument(
        "--candidate", metavar="K/N", action="append", default=[], help="repeatable"
    )
    parser.add_argument(
        "--paired",
        metavar="BOTH,BASE_ONLY,CAND_ONLY,NEITHER",
        help="paired counts on the same questions",
    )
    parser.add_argument(
        "--from", dest="source", metavar="FILE", help="kvgate eval --output JSONL or summary JSON"
    )
    parser.add_argument(
        "--margin",
        type=fraction(),
        default=None,
        help=f"largest tolerated loss: a fraction or a percentage, 0.02 or 2pp "
        f"(default: {DEFAULT_MARGIN})",
    )
    parser.add_argument(
        "--confidence",
        type=fraction(),
        default=None,
        help=f"one-sided (default: {DEFAULT_CONFIDENCE})",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def parse_fraction(text: str, field: str) -> ArmResult:
    """'459/500' -> ArmResult; K ≤ N and N > 0."""
    m = _FRACTION.match(text or "")
    if m is None:
        raise SpecError(field, f"{text[:40]!r} is not K/N (right answers/questions), e.g. 459/500")
    k, n = int(m.group(1)), int(m.group(2))
    _check_questions(n, text, field)
    if k > n:
        raise SpecError(field, f"{text!r}: {k} right answers out of {n} questions; K must be ≤ N")
    return ArmResult.from_counts(k, n)


def parse_paired(text: str, field: str = "--paired") -> PairedCounts:
    """'452,7,6,35' -> PairedCounts(both, control_only, candidate_only, neither)."""
    parts = [p.strip() for p in (text or "").split(",")]
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() and len(p) <= 12 for p in parts):
        raise SpecError(
            field,
            f"{text[:60]!r} is not four counts BOTH,BASE_ONLY,CAND_ONLY,NEITHER, e.g. 452,7,6,35",
        )
    counts = PairedCounts(*(int(p) for p in parts))
    _check_questions(counts.n, text, field)
    return counts


def _check_questions(n: int, text: str, field: str) -> None:
    if n > MAX_COUNT:
        raise SpecError(field, f"{n} questions is more than {MAX_COUNT:,}")
    if n == 0:
        raise SpecError(field, f"{text!r} has 0 questions")


def read_saved_result(path: Path) -> tuple[PairedCounts, dict[str, Any] | None]:
    """Paired counts from a per-question JSONL, or from a summary JSON (object or last line)."""
    text = read_text(path, regular=True)  # bounded: a regular UTF-8 file of sane size
    summary = _find_summary(text, str(path))
    if summary is not None and summary.get("verdict") == "error":
        # the eval's own error is the answer, exit 4 (first-hour-2 N5: an eval that never
        # reached an arm read as "no paired counts", exit 2, and a mid-run one hid its error)
        looks = summary.get("looks")
        after = f" after {looks} look(s)" if isinstance(looks, int) and looks > 0 else ""
        error = summary.get("error")
        raise EvalError(f"{path}: the eval ended in error{after}: {error or 'no error text saved'}")
    if f'"{QUESTION_KIND}"' in text:  # each line depth-bounded by read_question_lines
        return read_question_lines(path), summary
    if summary is None:
        raise ParseError(str(path), "neither per-question lines nor a kvgate.eval/summary object")
    paired = summary.get("paired")
    keys = ("both", "control_only", "candidate_only", "neither")
    if not isinstance(paired, dict) or not all(
        type(paired.get(k)) is int and 0 <= paired[k] <= MAX_COUNT for k in keys
    ):
        raise ParseError(str(path), f"the summary has no paired counts (integers <= {MAX_COUNT:,})")
    counts = PairedCounts(*(paired[k] for k in keys))
    if counts.n == 0:
        raise ParseError(str(path), "the summary has 0 paired questions")
    return counts, summary


def _find_summary(text: str, source: str) -> dict[str, Any] | None:
    try:
        whole = load_json(text, source)
    except ParseError:
        whole = None
    if isinstance(whole, dict) and whole.get("kind") == _SUMMARY_KIND:
        return whole
    for line in reversed(text.splitlines()):
        if _SUMMARY_KIND not in line:
            continue
        try:
            obj = load_json(line, source)
        except ParseError:
            continue
        if isinstance(obj, dict) and obj.get("kind") == _SUMMARY_KIND:
            return obj
    return None


def run(args: argparse.Namespace) -> int:
    modes = [bool(args.baseline or args.candidate), bool(args.paired), bool(args.source)]
    if sum(modes) != 1:
        raise InputError("give exactly one of --baseline/--candidate, --paired or --from")
    if modes[0]:
        arms: list[tuple[str, ArmResult]] = []
        if args.baseline:
            arms.append(("baseline", parse_fraction(args.baseline, "--baseline")))
        for i, text in enumerate(args.candidate):
            name = "candidate" if len(args.candidate) == 1 else f"candidate{i + 1}"
            arms.append((name, parse_fraction(text, "--candidate")))
        _print_arms(arms, args.json)
        return 0

    summary: dict[str, Any] | None = None
    if args.paired:
        counts = parse_paired(args.paired)
    else:
        counts, summary = read_saved_result(Path(args.source))
    margin = _pick(args.margin, summary, "margin", DEFAULT_MARGIN)
    confidence = _pick(args.confidence, summary, "confidence", DEFAULT_CONFIDENCE)
    # A value read from the file is named as the file's field, so the error points at the input.
    where = f"{args.source}: margin" if args.margin is None and summary else "--margin"
    if not 0.0 < margin < 1.0:
        example = f"{margin / 100:g} or {margin:g}pp" if 1.0 <= margin < 100.0 else "0.02 or 2pp"
        raise SpecError(
            where, f"{margin} is not in (0, 1): a margin is a fraction; write {example}"
        )
    where = f"{args.source}: confidence" if args.confidence is None and summary else "--confidence"
    if not 0.5 < confidence < 1.0:
        raise SpecError(where, f"{confidence} is not in (0.5, 1); use e.g. 0.95")
    verdict = _verdict(counts, margin, confidence, summary)
    _print_paired(counts, margin, confidence, summary, verdict, args.json)
    return EXIT_CODES[verdict.verdict]


@dataclass(frozen=True, slots=True)
class PairedVerdict:
    """The gate's verdict on these counts, and the sentence that leads with what was shown."""

    verdict: Verdict
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "verdict_sentence": self.sentence}


def _verdict(
    counts: PairedCounts, margin: float, confidence: float, summary: dict[str, Any] | None
) -> PairedVerdict:
    """A saved eval summary keeps its own (look-adjusted) verdict; raw counts get one look."""
    if summary is not None:
        written = summary.get("verdict")
        # a summary without a readable verdict proves nothing
        saved = next((v for v in Verdict if v.value == written), Verdict.INCONCLUSIVE)
        claim = summary.get("claim")
        sentence = f"the eval's verdict: {saved.value}" + (
            f"; {claim}" if isinstance(claim, str) and claim else ""
        )
        return PairedVerdict(saved, sentence)
    plan = plan_gate(counts.n, margin=margin, confidence=confidence)
    look = assess_look(plan, 0, counts)
    bounds = look_bounds(plan, 0, counts)
    control, candidate = counts.control(), counts.candidate()
    arms = f"{_pct(candidate.accuracy)}% vs {_pct(control.accuracy)}%"
    if look.verdict is Verdict.FAIL:
        return PairedVerdict(
            Verdict.FAIL,
            f"candidate worse: {arms}, worse by at least {100 * -bounds.upper:.2f} pp "
            f"(one-sided {plan.fail_confidence:.1%}, McNemar exact)",
        )
    if look.verdict is Verdict.PASS:
        return PairedVerdict(
            Verdict.PASS,
            f"non-inferior: {arms}, a loss larger than {100 * -bounds.lower:.2f} pp is ruled "
            f"out (one-sided {plan.confidence:.1%}; margin {100 * margin:g} pp)",
        )
    return PairedVerdict(
        Verdict.INCONCLUSIVE,
        f"inconclusive: {arms}; neither a loss of {100 * margin:g} pp ruled out nor a loss shown",
    )


def _pick(flag: float | None, summary: dict[str, Any] | None, key: str, default: float) -> float:
    if flag is not None:
        return flag
    value = summary.get(key) if summary is not None else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)  # as written: a negative margin is refused, never made positive
        except OverflowError:  # a huge integer: refused by the range check
            return math.inf
    return default


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _arm_line(name: str, arm: ArmResult) -> str:
    low, high = arm.wilson95
    fraction = f"{arm.correct}/{arm.n}"
    return f"{name:<11} {fraction:>11} = {_pct(arm.accuracy):>5}%  [{_pct(low)}, {_pct(high)}]"


def _print_arms(arms: list[tuple[str, ArmResult]], as_json: bool) -> None:
    if as_json:
        print(
            json.dumps({"kind": "kvgate.judge.stats/wilson", **{n: a.to_dict() for n, a in arms}})
        )
        return
    print(_HEADER)
    for name, arm in arms:
        print(_arm_line(name, arm))


def _print_paired(
    counts: PairedCounts,
    margin: float,
    confidence: float,
    summary: dict[str, Any] | None,
    verdict: PairedVerdict,
    as_json: bool,
) -> None:
    analysis = analyse_paired(counts, margin, confidence)
    needed = questions_needed(counts.discordance, margin, confidence)
    control, candidate = counts.control(), counts.candidate()
    if as_json:
        out: dict[str, Any] = {
            "kind": "kvgate.judge.stats/paired",
            **analysis.to_dict(),
            "control": control.to_dict(),
            "candidate": candidate.to_dict(),
            "questions_needed": needed,
            **verdict.to_dict(),
        }
        if summary is not None:
            out["eval_verdict"] = summary.get("verdict")
            out["eval"] = _eval_figures(summary)
        print(json.dumps(out))
        return
    low, high = analysis.tango95
    print(_HEADER)
    print(_arm_line("control", control))
    print(_arm_line("candidate", candidate))
    print(
        f"paired      both {counts.both}, control only {counts.control_only}, "
        f"candidate only {counts.candidate_only}, neither {counts.neither}"
    )
    print(
        f"difference  {100 * analysis.difference:+.2f} pp  Tango 95% two-sided "
        f"[{100 * low:+.2f}, {100 * high:+.2f}] pp  McNemar exact p = {analysis.mcnemar_p:.3g}"
    )
    one_look = "non-inferior" if analysis.noninferior else "non-inferiority not shown"
    looks = summary.get("looks") if summary is not None else None
    # first-hour-2 #13: a sequential eval's counts judged as one look are a description, not
    # the verdict; N13: on a fail, "losses above X pp are ruled out" read as reassurance
    label = (
        f"one look, descriptive (ignores the eval's {looks} looks)"
        if isinstance(looks, int) and looks > 1
        else "one look"
    )
    bound = (
        "nothing is ruled out (the candidate is shown worse)"
        if verdict.verdict is Verdict.FAIL
        else f"losses above {100 * analysis.largest_loss_ruled_out:.2f} pp are ruled out"
    )
    print(
        f"margin      {100 * margin:.1f} pp at {100 * confidence:.0f}% one-sided, {label}: "
        f"{one_look} (p = {analysis.noninferiority_p:.3g}); lower bound "
        f"{100 * analysis.lower_bound:+.2f} pp, {bound}"
    )
    print(f"verdict     {verdict.sentence}")
    if verdict.verdict is Verdict.INCONCLUSIVE:  # more questions can only help an open question
        print(
            f"advice      {needed} questions give 80% power at this discordance "
            f"({100 * counts.discordance:.1f}%)"
        )
    if summary is not None:
        print(f"eval        verdict {summary.get('verdict')} after {summary.get('looks')} look(s)")
        figures = _eval_figures(summary)
        if figures.get("claim") and str(figures["claim"]) not in verdict.sentence:
            # A sequential eval's own figures account for its looks; the ones above do not.
            print(f"eval claim  {figures['claim']}")


def _eval_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The verdict's own (look-adjusted) figures from a saved summary, where it has them."""
    keys = (
        "verdict",
        "reason",
        "claim",
        "looks",
        "bounds",
        "largest_loss_ruled_out",
        "smallest_loss_shown",
        "noninferiority_p",
    )
    return {k: summary[k] for k in keys if k in summary}
