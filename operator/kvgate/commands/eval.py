"""`kvgate eval`: the paired GSM8K accuracy job (control vs candidate endpoint)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from kvgate.cli import EXIT_BUG
from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.gate import (
    DEFAULT_CHUNK,
    EXIT_CODES,
    Verdict,
    build_summary,
    plan_gate,
)
from kvgate.evaluation.records import FILTERS, QuestionRecord
from kvgate.inputs import bounded_int, finite_float
from kvgate.stats import DEFAULT_CONFIDENCE, DEFAULT_MARGIN

HELP = "run the paired GSM8K accuracy job against a control and a candidate endpoint"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control-url", required=True, help="e.g. http://IP:8000/v1/completions")
    parser.add_argument("--candidate-url", required=True)
    parser.add_argument(
        "--model", help="served model name of both arms (default: the one each endpoint serves)"
    )
    parser.add_argument("--control-model", help="served model name of the control arm")
    parser.add_argument("--candidate-model", help="served model name of the candidate arm")
    parser.add_argument("--task", choices=("gsm8k", "gsm8k_cot"), default="gsm8k")
    parser.add_argument(
        "--api",
        choices=("completions", "chat"),
        default="completions",
        help="lm-eval local-completions (default) or local-chat-completions",
    )
    parser.add_argument(
        "--chat-template",
        action="store_true",
        help="apply the server's chat template (implies --api chat)",
    )
    parser.add_argument(
        "--filter",
        choices=FILTERS,
        default="strict-match",
        dest="filt",
        help="the lm-eval filter the gate judges (both are recorded)",
    )
    # Types give one line for NaN, infinities and absurd counts; the range checks in run()
    # keep their messages for zero and negative values.
    count = bounded_int(-(10**9), 10**9)
    parser.add_argument("--limit", type=count, help="questions at most (default: the test split)")
    parser.add_argument("--num-fewshot", type=bounded_int(-(10**6), 10**6))
    parser.add_argument("--seed", type=bounded_int(-(2**63), 2**63 - 1), default=1234)
    parser.add_argument(
        "--concurrency", type=bounded_int(-1024, 1024), default=8, help="lm-eval num_concurrent"
    )
    parser.add_argument("--max-gen-toks", type=bounded_int(-(2**20), 2**20), default=512)
    parser.add_argument(
        "--max-retries", type=bounded_int(-100, 100), default=3, help="attempts per request"
    )
    parser.add_argument(
        "--timeout", type=finite_float(-86400, 86400), default=300.0, help="seconds per request"
    )
    parser.add_argument(
        "--margin",
        type=finite_float(),
        default=DEFAULT_MARGIN,
        help="largest tolerated loss (fraction)",
    )
    parser.add_argument(
        "--confidence",
        type=finite_float(),
        default=DEFAULT_CONFIDENCE,
        help="one-sided confidence of the non-inferiority claim",
    )
    parser.add_argument("--sequential", action="store_true", help="look every --chunk questions")
    parser.add_argument("--chunk", type=count, default=DEFAULT_CHUNK, help="questions per look")
    parser.add_argument("--data-dir", help="GSM8K jsonl directory (default $KVGATE_GSM8K_DIR)")
    parser.add_argument("--output", help="per-question JSONL file")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")


def _positive(value: int | float | None, field: str) -> None:
    if value is not None and value <= 0:
        raise SpecError(field, f"{value} is not positive")


def run(args: argparse.Namespace) -> int:
    from kvgate.evaluation.job import run_gate
    from kvgate.evaluation.runner import (
        EvalSettings,
        LmEvalRunner,
        check_endpoint,
        check_url,
        count_test_questions,
        resolve_data_dir,
    )

    for field in ("limit", "concurrency", "max_gen_toks", "max_retries", "timeout", "chunk"):
        _positive(getattr(args, field), "--" + field.replace("_", "-"))
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise SpecError("--num-fewshot", f"{args.num_fewshot} is negative")
    requested = {
        "control": (args.control_url, args.control_model or args.model),
        "candidate": (args.candidate_url, args.candidate_model or args.model),
    }
    for name, (url, _) in requested.items():
        check_url(name, url)
    data_dir = resolve_data_dir(args.data_dir, os.environ)
    settings = EvalSettings(
        task=args.task,
        chat=args.api == "chat" or args.chat_template,
        num_fewshot=args.num_fewshot,
        seed=args.seed,
        concurrency=args.concurrency,
        max_gen_toks=args.max_gen_toks,
        max_retries=args.max_retries,
        timeout=args.timeout,
        data_dir=data_dir,
    )
    total = count_test_questions(data_dir)
    if args.limit is not None:
        total = min(total, args.limit)
    plan = plan_gate(
        total,
        chunk=args.chunk if args.sequential else None,
        margin=args.margin,
        confidence=args.confidence,
    )
    extra: dict[str, Any] = {
        "filter": args.filt,
        "settings": settings.to_dict(),
        "plan": plan.to_dict(),
        "arms": {n: {"name": n, "url": u, "model": m} for n, (u, m) in requested.items()},
    }
    emit = _emitter(sys.stdout)
    exit_code: int | None = None
    output: IO[str] | None = None
    try:
        if args.output:
            try:
                output = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise SpecError("--output", f"cannot write {args.output}: {exc.strerror}") from exc
        try:
            # Both endpoints answer (and serve the model) before any question is asked.
            arms = [check_endpoint(n, u, m) for n, (u, m) in requested.items()]
            extra["arms"] = {a.name: a.to_dict() for a in arms}
            # lm-eval must not write to stdout: the summary is the Job log's last line. One
            # redirect around both arms' threads (redirect_stdout is process-wide).
            with (
                tempfile.TemporaryDirectory(prefix="kvgate-eval-") as workdir,
                contextlib.redirect_stdout(sys.stderr),
            ):
                runner = LmEvalRunner(settings, arms, Path(workdir))
                summary = run_gate(
                    plan,
                    runner,
                    task=args.task,
                    filt=args.filt,
                    emit=emit,
                    keep=_keeper(output),
                    extra=extra,
                )
        except EvalError as exc:
            summary = build_summary(
                plan=plan,
                task=args.task,
                verdict=Verdict.ERROR,
                counts=None,
                looks_taken=0,
                error=str(exc),
                extra=extra,
            )
        except Exception as exc:  # a bug (ours or lm-eval's): the Job log still ends in a summary
            traceback.print_exc(file=sys.stderr)
            summary = build_summary(
                plan=plan,
                task=args.task,
                verdict=Verdict.ERROR,
                counts=None,
                looks_taken=0,
                error=f"internal error: {type(exc).__name__}: {str(exc)[:300]}",
                extra=extra,
            )
            exit_code = EXIT_BUG
        if output is not None:
            summary["output"] = args.output
            output.write(json.dumps(summary, separators=(",", ":")) + "\n")
    finally:
        if output is not None:
            output.close()
    # The operator passes a per-attempt nonce and accepts only a summary that carries it, so a
    # summary-shaped line an arm puts into this log (lm-eval logs error bodies) proves nothing.
    nonce = os.environ.get("KVGATE_EVAL_NONCE")
    if nonce:
        summary["nonce"] = nonce
    emit(summary)
    return exit_code if exit_code is not None else EXIT_CODES[Verdict(summary["verdict"])]


def _emitter(stream: IO[str]) -> Callable[[dict[str, Any]], None]:
    """Writes JSON lines to `stream`, the real stdout, also while lm-eval's goes to stderr."""

    def emit(obj: dict[str, Any]) -> None:
        stream.write(json.dumps(obj, separators=(",", ":")) + "\n")
        stream.flush()

    return emit


def _keeper(output: IO[str] | None) -> Any:
    def keep(record: QuestionRecord) -> None:
        if output is not None:
            output.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
            output.flush()

    return keep
