"""`kvgate diverge`: the token-level divergence screen (teacher-forced, no generation).

Sends the same long documents (GSM8K train text concatenated to the wanted length) to the
control twice and to the candidate once, with vLLM completions `echo: true, max_tokens: 0,
logprobs: k`, and compares the next-token distributions per position bucket
(`kvgate.judge.divergence`). Prints one JSON summary line, `kind: kvgate.diverge/summary`, when
stdout is piped or with --json; on a terminal, the same summary as text (`commands.terminal`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from kvgate.commands.failure import report_summary_error
from kvgate.commands.terminal import diverge_text, is_terminal, json_line
from kvgate.errors import EvalError, SpecError
from kvgate.inputs import bounded_int, finite_float, seconds
from kvgate.judge.divergence import (
    DEFAULT_FACTOR,
    DEFAULT_FIRST_EDGE,
    DEFAULT_MIN_DISAGREEMENT,
    DEFAULT_MIN_KL,
    EXIT_CODES,
    SUMMARY_KIND,
    DocumentLogprobs,
    ScreenSettings,
    Verdict,
    bucket_edges,
    compare,
    parse_completion,
    screen,
)
from kvgate.vocabulary import EVAL_NONCE_ENV

if TYPE_CHECKING:  # httpx is imported where the screen runs: `kvgate eval` loads this module
    import httpx  # for its options, and may refuse a run before any request

_CALIBRATION_CHARS: Final = 4000
_FILL: Final = 0.95  # aim below --max-tokens: tokens per character vary along a document
_MAX_BODY: Final = 256 << 20
EXAMPLES: Final = (
    "kvgate diverge --control-url http://A:8000/v1/completions --candidate-url http://B:8000/v1/completions --documents 4",
)


def add_screen_options(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    prefix: str = "",
    documents_default: int | None,
    documents_help: str,
    max_tokens_default: int | None = 8192,
    max_tokens_help: str = "document length in tokens (below the engines' --max-model-len)",
) -> None:
    """The screen's size and sensitivity, shared by `kvgate diverge` and `kvgate eval`
    (there as --divergence-*, where giving --divergence-documents turns the screen on)."""
    group.add_argument(
        f"--{prefix}documents",
        type=bounded_int(1, 1000),
        default=documents_default,
        help=documents_help,
    )
    group.add_argument(
        f"--{prefix}max-tokens",
        type=bounded_int(64, 2**21),
        default=max_tokens_default,
        help=max_tokens_help,
    )
    group.add_argument(
        f"--{prefix}logprobs", type=bounded_int(1, 20), default=5, help="top-k per position"
    )
    group.add_argument(
        f"--{prefix}factor",
        type=finite_float(1.0, 1e6),
        default=DEFAULT_FACTOR,
        help="flag a position bucket whose divergence exceeds the A/A floor by this factor",
    )


def add_arm_options(parser: argparse.ArgumentParser) -> None:
    """The two engines and their served model names, shared by `kvgate diverge` and `kvgate eval`
    (read back by `requested_arms`)."""
    parser.add_argument(
        "--control-url",
        required=True,
        help="the control engine: http://IP:8000 or its completions endpoint "
        "http://IP:8000/v1/completions",
    )
    parser.add_argument(
        "--candidate-url", required=True, help="the candidate engine, the same form"
    )
    parser.add_argument(
        "--model", help="served model name of both arms (default: the one each endpoint serves)"
    )
    parser.add_argument("--control-model", help="served model name of the control arm")
    parser.add_argument("--candidate-model", help="served model name of the candidate arm")


def configure(parser: argparse.ArgumentParser) -> None:
    add_arm_options(parser)
    add_screen_options(parser, documents_default=4, documents_help="documents to send")
    parser.add_argument(
        "--min-kl",
        type=finite_float(1e-12, 10.0),
        default=DEFAULT_MIN_KL,
        help="floor under the A/A mean KL (nats): a bucket flags above factor x max(floor, A/A)",
    )
    parser.add_argument(
        "--min-disagreement",
        type=finite_float(1e-9, 1.0),
        default=DEFAULT_MIN_DISAGREEMENT,
        help="floor under the A/A top-1 disagreement rate, as for --min-kl",
    )
    parser.add_argument(
        "--first-bucket",
        type=bounded_int(1, 2**20),
        default=DEFAULT_FIRST_EDGE,
        help="upper edge of the first position bucket; later ones double",
    )
    parser.add_argument("--data-dir", help="GSM8K jsonl directory (default: $KVGATE_GSM8K_DIR)")
    parser.add_argument(
        "--timeout", type=seconds(1.0, 86400.0), default=600.0, help="time per request (600, 10m)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="the JSON summary line, also on a terminal (the output when stdout is not a terminal)",
    )


def documents_source(data_dir: Path | None) -> list[str]:
    if data_dir is None:
        raise EvalError(
            "GSM8K dataset: no local copy (KVGATE_GSM8K_DIR and --data-dir unset); diverge "
            "builds its documents from GSM8K's train.jsonl: set KVGATE_GSM8K_DIR or pass "
            "--data-dir (a directory with test.jsonl and train.jsonl)"
        )
    rows = []
    with (data_dir / "train.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                rows.append(f"Question: {row['question']}\nAnswer: {row['answer']}\n\n")
    if not rows:
        raise SpecError("--data-dir", f"{data_dir}/train.jsonl has no rows")
    return rows


def make_document(rows: list[str], index: int, chars: int) -> str:
    """Document `index`: train rows in order from a per-document offset, cut to `chars`."""
    parts: list[str] = []
    total = 0
    for row in itertools.islice(itertools.cycle(rows), (index * 997) % len(rows), None):
        if total >= chars:
            break
        parts.append(row)
        total += len(row)
    return "".join(parts)[:chars]


class _Arm:
    def __init__(self, client: httpx.Client, name: str, url: str, model: str) -> None:
        self.client, self.name, self.url, self.model = client, name, url, model

    def echo(self, text: str, k: int) -> tuple[DocumentLogprobs, int]:
        payload = {
            "model": self.model,
            "prompt": text,
            "echo": True,
            "max_tokens": 0,
            "logprobs": k,
            "temperature": 0.0,
        }
        import httpx

        where = f"{self.name} endpoint {self.url}"
        content = bytearray()
        try:
            # Streamed and cut at the bound: a body is never held past it (an error's at 300).
            with self.client.stream("POST", self.url, json=payload) as response:
                limit = _MAX_BODY if response.status_code == 200 else 300
                for chunk in response.iter_bytes():
                    content += chunk
                    if len(content) > limit:
                        break
        except httpx.HTTPError as exc:
            raise EvalError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            text = content[:300].decode("utf-8", "replace")
            raise EvalError(f"{where}: HTTP {response.status_code}: {text}")
        if len(content) > _MAX_BODY:
            raise EvalError(f"{self.name}: response over {_MAX_BODY} bytes")
        try:
            body = json.loads(content)
        except ValueError as exc:
            raise EvalError(f"{where}: body is not JSON") from exc
        doc = parse_completion(body, where)
        usage = body.get("usage") if isinstance(body, dict) else None
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return doc, prompt_tokens if isinstance(prompt_tokens, int) else len(doc.tokens)


def requested_arms(
    args: argparse.Namespace, *, chat: bool = False
) -> dict[str, tuple[str, str | None]]:
    """Per arm: its completions URL and the served model name given (None: the one it serves)."""
    from kvgate.evaluation.runner import completions_url

    return {
        arm: (
            completions_url(arm, getattr(args, f"{arm}_url"), chat=chat),
            getattr(args, f"{arm}_model") or args.model,
        )
        for arm in ("control", "candidate")
    }


def run(args: argparse.Namespace) -> int:
    from kvgate.evaluation.runner import check_endpoint, resolve_data_dir

    requested = requested_arms(args)
    settings = ScreenSettings(args.factor, args.min_kl, args.min_disagreement)
    data_dir = resolve_data_dir(args.data_dir, os.environ)
    options = ScreenOptions(
        documents=args.documents,
        max_tokens=args.max_tokens,
        logprobs=args.logprobs,
        first_bucket=args.first_bucket,
        timeout=args.timeout,
        settings=settings,
    )
    try:  # a missing dataset is an outside failure, exit 4, as for eval (first-hour-2 N24)
        rows = documents_source(data_dir)
        endpoints = [check_endpoint(n, u, m) for n, (u, m) in requested.items()]
    except EvalError as exc:
        summary = {**summary_header(options), "error": str(exc)}
    else:
        summary = run_screen(endpoints, rows, options)
    if nonce := os.environ.get(EVAL_NONCE_ENV):
        summary["nonce"] = nonce
    if not args.json and is_terminal(sys.stdout):  # a person: text, as `eval` (first-hour #14)
        sys.stdout.write(diverge_text(summary) + "\n")
    else:  # piped (the eval Job's log) or --json: the one JSON summary line
        sys.stdout.write(json_line(summary))
    sys.stdout.flush()
    report_summary_error("diverge", summary, summary["verdict"])
    return EXIT_CODES[Verdict(summary["verdict"])]


@dataclass(frozen=True, slots=True)
class ScreenOptions:
    documents: int = 4
    max_tokens: int = 8192
    logprobs: int = 5
    first_bucket: int = DEFAULT_FIRST_EDGE
    timeout: float = 600.0
    settings: ScreenSettings = field(default_factory=ScreenSettings)


def summary_header(options: ScreenOptions) -> dict[str, Any]:
    """The summary before the screen ran: verdict error until it says otherwise."""
    return {
        "kind": SUMMARY_KIND,
        "verdict": str(Verdict.ERROR),
        "error": None,
        "documents": options.documents,
        "max_tokens": options.max_tokens,
        "logprobs": options.logprobs,
        "settings": options.settings.to_dict(),
        "flagged_buckets": [],
        "first_flagged": None,
        "buckets": [],
    }


def run_screen(endpoints: list[Any], rows: list[str], options: ScreenOptions) -> dict[str, Any]:
    """The screen against checked endpoints (control first): the summary, errors inside it.

    Used by `kvgate diverge` and by `kvgate eval --divergence-documents` (the operator's eval
    Job), so both print the same block.
    """
    summary = summary_header(options)
    try:
        summary.update(_screen(endpoints, rows, options))
    except EvalError as exc:
        summary["error"] = str(exc)
    return summary


def _screen(endpoints: list[Any], rows: list[str], options: ScreenOptions) -> dict[str, Any]:
    import httpx

    timeout = httpx.Timeout(options.timeout, connect=10.0)
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        control, candidate = (_Arm(client, e.name, e.url, e.model) for e in endpoints)
        # Characters per token of this text on this tokenizer, from one short request.
        sample = make_document(rows, 0, _CALIBRATION_CHARS)
        _, sample_tokens = control.echo(sample, 1)
        chars = int(options.max_tokens * _FILL * len(sample) / max(1, sample_tokens))
        first, again, cand = [], [], []
        lengths = []
        for i in range(options.documents):
            text = make_document(rows, i, chars)
            doc, tokens = control.echo(text, options.logprobs)
            first.append(doc)
            cand.append(candidate.echo(text, options.logprobs)[0])
            again.append(control.echo(text, options.logprobs)[0])
            lengths.append(tokens)
    edges = bucket_edges(max(lengths), options.first_bucket)
    floor = compare(first, again, edges)
    against = compare(first, cand, edges)
    verdict, table = screen(floor, against, options.settings)
    flagged = [row for row in table if row.flagged]
    return {
        "verdict": str(verdict),
        "arms": {e.name: e.to_dict() for e in endpoints},
        "document_tokens": lengths,
        "positions": sum(row.candidate.positions for row in table),
        "flagged_buckets": [f"{row.low}-{row.high}" for row in flagged],
        "first_flagged": flagged[0].to_dict() if flagged else None,
        "buckets": [row.to_dict() for row in table],
    }
