"""`kvgate eval`: the paired GSM8K accuracy job (control vs candidate endpoint)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, TypedDict

from kvgate.commands.diverge import (
    ScreenOptions,
    add_arm_options,
    add_screen_options,
    requested_arms,
)
from kvgate.commands.exit_codes import EXIT_BUG
from kvgate.commands.failure import error_text, report_summary_error
from kvgate.commands.terminal import NO_TASK, human_emitter, is_terminal, json_emitter, json_line
from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.gate import (
    DEFAULT_CHUNK,
    EXIT_CODES,
    SEVERITY,
    GatePlan,
    Verdict,
    build_summary,
    plan_gate,
)
from kvgate.evaluation.long_context import DEFAULT_ITEMS, DEFAULT_RECOVERY, LongContextPlan
from kvgate.evaluation.long_context import DEFAULT_MARGIN as LC_MARGIN
from kvgate.evaluation.records import FILTERS, QuestionRecord
from kvgate.inputs import bounded_int, finite_float, fraction, seconds
from kvgate.judge.stats import DEFAULT_CONFIDENCE, DEFAULT_MARGIN
from kvgate.spec.rollout import is_commit, is_local_path
from kvgate.vocabulary import EVAL_NONCE_ENV

if TYPE_CHECKING:  # imported where used: kvgate.evaluation.runner is loaded when the job runs
    from kvgate.evaluation.runner import Arm, EvalSettings

_LC_SPEC: Final = "--long-context-tasks"
EXAMPLES: Final = (
    "kvgate eval --control-url http://A:8000/v1/completions --candidate-url http://B:8000/v1/completions --task gsm8k_cot --sequential",
)
TASKS: Final = ("gsm8k", "gsm8k_cot")
SCREEN_TOKENS: Final = 8192  # the divergence screen's documents without --max-model-len


def configure(parser: argparse.ArgumentParser) -> None:
    add_arm_options(parser)
    parser.add_argument(
        "--task",
        choices=(*TASKS, NO_TASK),
        default="gsm8k",
        help=f"the accuracy task; {NO_TASK}: only the long-context task (no GSM8K needed)",
    )
    parser.add_argument(
        "--api",
        choices=("completions", "chat"),
        default="completions",
        help="lm-eval local-completions or local-chat-completions",
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
    parser.add_argument(
        "--num-fewshot", type=bounded_int(-(10**6), 10**6), help="(default: the task's own)"
    )
    parser.add_argument(
        "--seed", type=bounded_int(-(2**63), 2**63 - 1), default=1234, help="lm-eval seed"
    )
    parser.add_argument(
        "--concurrency", type=bounded_int(-1024, 1024), default=8, help="lm-eval num_concurrent"
    )
    parser.add_argument(
        "--max-gen-toks",
        type=bounded_int(-(2**20), 2**20),
        default=512,
        help="tokens per answer at most",
    )
    parser.add_argument(
        "--max-retries", type=bounded_int(-100, 100), default=3, help="attempts per request"
    )
    parser.add_argument(
        "--timeout",
        type=seconds(-86400, 86400),
        default=300.0,
        help="time per request: seconds or a duration (300, 5m)",
    )
    parser.add_argument(
        "--margin",
        type=fraction(),
        default=DEFAULT_MARGIN,
        help="largest tolerated loss: a fraction or a percentage (0.02, 2pp)",
    )
    parser.add_argument(
        "--confidence",
        type=fraction(),
        default=DEFAULT_CONFIDENCE,
        help="one-sided confidence of the non-inferiority claim",
    )
    parser.add_argument("--sequential", action="store_true", help="look every --chunk questions")
    parser.add_argument("--chunk", type=count, default=DEFAULT_CHUNK, help="questions per look")
    parser.add_argument("--data-dir", help="GSM8K jsonl directory (default: $KVGATE_GSM8K_DIR)")
    parser.add_argument("--output", help="per-question JSONL file")
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON lines only, also on a terminal (the output when stdout is not a terminal)",
    )
    lc = parser.add_argument_group(
        "long context", "RULER needle items per context length (docs/long-context.md)"
    )
    lc.add_argument(
        _LC_SPEC,
        dest="long_context_tasks",
        help="comma list of niah_single_1, niah_multikey_2, niah_multikey_3 (default: off)",
    )
    lc.add_argument(
        "--max-model-len",
        type=bounded_int(1, 2**24),
        help="the engines' --max-model-len: long-context buckets 4096, 8192, ... up to it, "
        "and the divergence screen's document length",
    )
    lc.add_argument(
        "--context-lengths", help="explicit comma list of bucket lengths (instead of 4k..max)"
    )
    lc.add_argument(
        "--long-context-items",
        type=bounded_int(1, 100_000),
        default=DEFAULT_ITEMS,
        help="items per task and bucket",
    )
    lc.add_argument(
        "--long-context-margin",
        type=fraction(),
        default=LC_MARGIN,
        help="largest tolerated loss per bucket: a fraction or a percentage",
    )
    lc.add_argument(
        "--recovery-floor",
        type=finite_float(),
        default=DEFAULT_RECOVERY,
        help="candidate score at least this share of control's, per bucket",
    )
    lc.add_argument(
        "--tokenizer", help="the model's tokenizer: a directory, tokenizer.json or a hub repo id"
    )
    lc.add_argument(
        "--tokenizer-revision",
        help="the hub commit (40 hex digits) to download a hub --tokenizer at (default: main's "
        "head, recorded in the summary as tokenizer_revision)",
    )
    dv = parser.add_argument_group(
        "divergence screen",
        "teacher-forced log-probs against the control's A/A floor (kvgate diverge; off by default)",
    )
    add_screen_options(
        dv,
        prefix="divergence-",
        documents_default=None,
        documents_help="documents to screen; turns the screen on (summary block `divergence`)",
        max_tokens_default=None,
        max_tokens_help="document length in tokens (default: --max-model-len, as the operator "
        f"sets it, else {SCREEN_TOKENS})",
    )


def _positive(value: int | float | None, field: str) -> None:
    if value is not None and value <= 0:
        raise SpecError(field, f"{value} is not positive")


def run(args: argparse.Namespace) -> int:
    from kvgate.evaluation.job import run_gate
    from kvgate.evaluation.runner import (
        EvalSettings,
        LmEvalRunner,
        check_endpoint,
        count_test_questions,
        resolve_data_dir,
        resolve_hub_dataset,
    )

    for field in ("limit", "concurrency", "max_gen_toks", "max_retries", "timeout", "chunk"):
        _positive(getattr(args, field), "--" + field.replace("_", "-"))
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise SpecError("--num-fewshot", f"{args.num_fewshot} is negative")
    chat = args.api == "chat" or args.chat_template
    requested = requested_arms(args, chat=chat)
    data_dir = resolve_data_dir(args.data_dir, os.environ)
    settings = EvalSettings(
        task=args.task,
        chat=chat,
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
    long_context = _long_context_request(args)
    divergence = _divergence_request(args)
    gsm8k = args.task != NO_TASK
    if not gsm8k and long_context is None:
        raise SpecError("--task", f"{NO_TASK} runs only the long-context task: add {_LC_SPEC}")
    extra: dict[str, Any] = {
        "filter": args.filt,
        "settings": settings.to_dict(),
        "plan": plan.to_dict(),
        "arms": {n: {"name": n, "url": u, "model": m} for n, (u, m) in requested.items()},
    }
    human = not args.json and is_terminal(sys.stdout)
    emit = human_emitter(sys.stdout, sys.stderr) if human else json_emitter(sys.stdout)
    exit_code: int | None = None
    output: IO[str] | None = None
    try:
        if args.output:
            try:
                output = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise SpecError("--output", f"cannot write {args.output}: {exc.strerror}") from exc
        try:
            if data_dir is None and (gsm8k or divergence is not None):
                # The dataset first, once: a missing one is named as such in seconds, before
                # any endpoint is contacted (lm-eval would retry the Hub, then blame an arm).
                settings = replace(settings, hub_files=resolve_hub_dataset(os.environ))
                extra["settings"] = settings.to_dict()
            # Both endpoints answer (and serve the model) before any question is asked.
            arms = [check_endpoint(n, u, m) for n, (u, m) in requested.items()]
            extra["arms"] = {a.name: a.to_dict() for a in arms}
            # lm-eval must not write to stdout: the summary is the Job log's last line. One
            # redirect around both arms' threads (redirect_stdout is process-wide).
            with (
                tempfile.TemporaryDirectory(prefix="kvgate-eval-") as workdir,
                contextlib.redirect_stdout(sys.stderr),
            ):
                if gsm8k:
                    summary = run_gate(
                        plan,
                        LmEvalRunner(settings, arms, Path(workdir)),
                        task=args.task,
                        filt=args.filt,
                        emit=emit,
                        keep=_keeper(output),
                        extra=extra,
                    )
                else:  # the long-context task alone: its verdict is the summary's
                    summary = _no_task_summary(plan, extra)
                if long_context is not None:
                    summary["long_context"] = _run_long_context(
                        long_context, settings, arms, Path(workdir), args.seed
                    )
                    if not gsm8k:
                        block = summary["long_context"]
                        summary.update(
                            verdict=block["verdict"], reason=block["reason"], error=block["error"]
                        )
                if divergence is not None:
                    summary["divergence"] = _run_divergence(divergence, arms, settings)
        except Exception as exc:  # a bug (ours or lm-eval's) too: the Job log ends in a summary
            if not isinstance(exc, EvalError):
                exit_code = EXIT_BUG
            summary = build_summary(
                plan=plan,
                task=args.task,
                verdict=Verdict.ERROR,
                counts=None,
                looks_taken=0,
                error=error_text(exc, EvalError),
                extra=extra,
            )
        if output is not None:
            summary["output"] = args.output
            output.write(json_line(summary))
    finally:
        if output is not None:
            output.close()
    # The operator passes a per-attempt nonce and accepts only a summary that carries it, so a
    # summary-shaped line an arm puts into this log (lm-eval logs error bodies) proves nothing.
    if not gsm8k:  # no questions were planned, whichever way the run ended
        summary.update(questions_planned=0, looks_planned=0, plan=None)
    not_run = (
        f"not run: the GSM8K task ended in {summary['verdict']}"
        if gsm8k
        else f"not run: {summary['error']}"
    )
    if long_context is not None:
        summary.setdefault("long_context", {**_block_header(long_context), "error": not_run})
        summary["overall"] = _overall(summary)
    if divergence is not None and "divergence" not in summary:
        from kvgate.commands.diverge import summary_header

        summary["divergence"] = {**summary_header(divergence), "error": not_run}
    if nonce := os.environ.get(EVAL_NONCE_ENV):
        summary["nonce"] = nonce
    emit(summary)
    final = summary["overall"]["verdict"] if long_context is not None else summary["verdict"]
    report_summary_error("eval", summary, final)
    return exit_code if exit_code is not None else EXIT_CODES[Verdict(final)]


class LongContextRequest(TypedDict):  # as `_long_context_request` checked them
    tasks: list[str]
    lengths: list[int]
    items: int
    tokenizer: str
    tokenizer_revision: str | None
    plan: LongContextPlan


def _long_context_request(args: argparse.Namespace) -> LongContextRequest | None:
    """The long-context settings, checked before anything is contacted (None: not asked)."""
    from kvgate.evaluation.long_context import TASKS, context_lengths

    if not args.long_context_tasks:
        if args.context_lengths or args.tokenizer or args.tokenizer_revision:
            raise SpecError(_LC_SPEC, "long-context options need --long-context-tasks")
        return None
    tasks = [t.strip() for t in args.long_context_tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise SpecError(_LC_SPEC, f"{unknown or tasks} not among {', '.join(TASKS)}")
    if args.context_lengths:
        try:
            lengths = sorted({int(x) for x in args.context_lengths.split(",") if x.strip()})
        except ValueError:
            raise SpecError("--context-lengths", "a comma list of integers") from None
        if not lengths or lengths[0] < 256 or lengths[-1] > 2**24:
            raise SpecError("--context-lengths", "lengths between 256 and 16777216")
    elif args.max_model_len:
        lengths = context_lengths(args.max_model_len)
    else:
        raise SpecError(
            "--max-model-len", "long context needs --max-model-len or --context-lengths"
        )
    if not args.tokenizer:
        raise SpecError("--tokenizer", "long context sizes prompts with the model's tokenizer")
    revision = args.tokenizer_revision
    if revision is not None and not is_commit(revision):
        raise SpecError(
            "--tokenizer-revision",
            f"{revision[:60]!r} is not a commit; use the 40 hex digits of a hub commit",
        )
    if revision is not None and is_local_path(args.tokenizer):
        raise SpecError(
            "--tokenizer-revision", f"{args.tokenizer!r} is a path; a revision pins a hub repo"
        )
    plan = LongContextPlan(
        margin=args.long_context_margin,
        confidence=args.confidence,
        recovery_floor=args.recovery_floor,
    )
    return {
        "tasks": tasks,
        "lengths": lengths,
        "items": args.long_context_items,
        "tokenizer": args.tokenizer,
        "tokenizer_revision": revision,
        "plan": plan,
    }


def _divergence_request(args: argparse.Namespace) -> ScreenOptions | None:
    """The divergence screen's options (None: not asked), checked before anything is sent."""
    from kvgate.judge.divergence import ScreenSettings

    if args.divergence_documents is None:
        return None
    max_tokens = args.divergence_max_tokens
    if max_tokens is None and args.max_model_len is not None:
        # As the operator does: documents as long as the engine serves (the screen aims 5%
        # below, since tokens per character vary along a document).
        if args.max_model_len < 64:
            raise SpecError("--max-model-len", "below 64 tokens, too short for a divergence screen")
        max_tokens = min(args.max_model_len, 2**21)
    return ScreenOptions(
        documents=args.divergence_documents,
        max_tokens=max_tokens or SCREEN_TOKENS,
        logprobs=args.divergence_logprobs,
        timeout=args.timeout,
        settings=ScreenSettings(factor=args.divergence_factor),
    )


def _run_divergence(
    options: ScreenOptions, arms: list[Arm], settings: EvalSettings
) -> dict[str, Any]:
    """The screen after the accuracy tasks; its failures stay inside its block."""
    from kvgate.commands.diverge import documents_source, run_screen, summary_header

    try:
        if settings.data_dir is None and settings.hub_files is not None:
            rows = _parquet_documents(settings.hub_files.train)
        else:
            rows = documents_source(settings.data_dir)
        return run_screen(arms, rows, options)
    except Exception as exc:  # a bug here must not hide the other results either
        expected = (EvalError, SpecError, OSError, ValueError)
        text = f"{type(exc).__name__}: {str(exc)[:300]}"
        return {**summary_header(options), "error": error_text(exc, expected, text)}


def _parquet_documents(path: Path) -> list[str]:
    """The screen's document rows from the Hub dataset's train split (as documents_source)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["question", "answer"]).to_pylist()
    rows = [f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in table]
    if not rows:
        raise SpecError("dataset", f"{path} has no rows")
    return rows


def _block_header(request: LongContextRequest) -> dict[str, Any]:
    from kvgate.judge.accuracy import LONG_CONTEXT_KIND

    plan = request["plan"]
    return {
        "kind": LONG_CONTEXT_KIND,
        "verdict": "error",
        "reason": None,
        "error": None,
        "failing_bucket": None,
        "tasks": request["tasks"],
        "context_lengths": request["lengths"],
        "items_per_bucket": request["items"] * len(request["tasks"]),
        "tokenizer": request["tokenizer"],
        "tokenizer_revision": request["tokenizer_revision"],
        "margin": plan.margin,
        "confidence": plan.confidence,
        "fail_confidence": plan.fail_confidence,
        "recovery_floor": plan.recovery_floor,
        "buckets": [],
    }


def _run_long_context(
    request: LongContextRequest,
    settings: EvalSettings,
    arms: list[Arm],
    workdir: Path,
    seed: int,
) -> dict[str, Any]:
    from kvgate.evaluation.long_context import generate_items, judge, pair_by_length
    from kvgate.evaluation.long_context_runner import NeedleRunner, load_tokenizer

    block = _block_header(request)
    try:
        count, commit = load_tokenizer(request["tokenizer"], request["tokenizer_revision"])
        block["tokenizer_revision"] = commit
        items = generate_items(request["tasks"], request["lengths"], request["items"], count, seed)
        answers = NeedleRunner(settings, arms, workdir, items).run()
        per_length = pair_by_length(answers["control"], answers["candidate"], len(items))
        verdict, reason, bucket, rows = judge(per_length, request["plan"])
    except Exception as exc:  # a bug here must not hide the GSM8K result either
        block["error"] = error_text(exc, (EvalError, SpecError))
        return block
    block.update(verdict=str(verdict), reason=reason, buckets=rows)
    if str(verdict) != "pass":
        block["failing_bucket"] = bucket
    return block


def _no_task_summary(plan: GatePlan, extra: dict[str, Any]) -> dict[str, Any]:
    """The summary line of a run without an accuracy task (`--task none`): no questions."""
    return build_summary(
        plan=plan, task=NO_TASK, verdict=Verdict.ERROR, counts=None, looks_taken=0, extra=extra
    )


def _overall(summary: dict[str, Any]) -> dict[str, Any]:
    """The worst task's verdict, naming the task (and the bucket for long context)."""
    lc = summary["long_context"]
    tasks = [
        {"task": summary["task"], "verdict": summary["verdict"], "reason": summary["reason"]},
        {
            "task": "long_context",
            "verdict": lc["verdict"],
            "reason": lc["reason"],
            "bucket": lc["failing_bucket"],
        },
    ]
    if summary["task"] == NO_TASK:
        tasks = tasks[1:]
    worst = max(tasks, key=lambda t: SEVERITY[Verdict(t["verdict"])])
    return {
        "verdict": worst["verdict"],
        "task": worst["task"] if worst["verdict"] != "pass" else None,
        "reason": worst["reason"] if worst["verdict"] != "pass" else None,
        "bucket": worst.get("bucket") if worst["verdict"] != "pass" else None,
        "tasks": tasks,
    }


def _keeper(output: IO[str] | None) -> Callable[[QuestionRecord], None]:
    def keep(record: QuestionRecord) -> None:
        if output is not None:
            output.write(json_line(record.to_dict()))
            output.flush()

    return keep
