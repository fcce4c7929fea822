"""`kvgate load-job`: inference-perf against both arms at once, each stage judged from its JSON.

The load Job's program. Both arms get the same workload (fixed prompt and output lengths, the
same stages, `load.num_workers` explicit) in two inference-perf runs started together, so both
see the same conditions. The stages are production's concurrency first (measured while the arms
are fresh, before any stage drives one into the ground), then the sweep's other levels upward,
capped by `--max-concurrency`.

inference-perf's exit code is not trusted (it exits 0 with every request failed): each stage is
judged from its own report (`kvgate.load.report`); failures, cut-off streams, short outputs or a
missing report make the stage `error`, never a measurement. After the runs each arm is asked
whether it still answers, so an arm that died reads as such, and each arm's token counters
(read before and after its run) must agree with what its client counted (`kvgate.load.counts`):
a load tokenizer that is not the served model's makes the arm an error naming both counts.

stdout carries JSON lines only: `kvgate.load/progress` lines, then one `kvgate.load/summary`
line (`kvgate.records.loadresult.LoadSummary`), always the last, carrying `KVGATE_LOAD_NONCE` when set.
Exit 0 when every stage of both arms was measured, 3 when some were errors, 4 when an arm
measured nothing or the run could not be made, 70 on a bug.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from kvgate.commands.exit_codes import (
    EXIT_BUG,
    EXIT_EXTERNAL,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
)
from kvgate.commands.failure import error_text
from kvgate.commands.terminal import json_emitter
from kvgate.errors import SpecError
from kvgate.inputs import seconds
from kvgate.load.config import LoadPlan, LoadPlanError, Slo, Stage
from kvgate.load.counts import EngineCounters, check_counts, client_counts
from kvgate.load.report import StageJudgement, stage_file
from kvgate.load.runner import INFERENCE_PERF_LOG
from kvgate.records.loadresult import (
    ARMS,
    PROGRESS_KIND,
    SGLANG_SWITCH,
    SUMMARY_KIND,
    ArmLoad,
    LoadSummary,
    LoadVerdict,
    PrefixProbe,
    StagePoint,
    StageStatus,
    overall,
)
from kvgate.vocabulary import LOAD_NONCE_ENV

if TYPE_CHECKING:
    from kvgate.evidence.metrics import MetricSnapshot

EXAMPLES: Final = (
    "kvgate load-job --control-url http://A:8000 --candidate-url http://B:8000 --model M "
    "--production-concurrency 64 --prompt-tokens 512 --output-tokens 128",
)
SWEEP: Final = (1, 8, 32, 64, 128)
DEFAULT_MAX_CONCURRENCY: Final = 128
EXIT_CODES: Final = {
    LoadVerdict.MEASURED: EXIT_OK,
    LoadVerdict.PARTIAL: EXIT_INCONCLUSIVE,
    LoadVerdict.ERROR: EXIT_EXTERNAL,
}
POLL_S: Final = 1.0
PROBE_TIMEOUT_S: Final = 5.0
# The prefix probe's prompt, sent twice: long enough for several whole KV blocks (16 tokens on
# vLLM) in any tokenizer, so the second send hits the first's blocks when prefix caching is on.
PREFIX_PROBE_PROMPT: Final = " ".join(
    f"Line {n}: kvgate sends this same prompt twice to see the prefix cache hit." for n in range(16)
)
PREFIX_PROBE_READS: Final = 5  # the counters move with the engine's next stats record


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control-url", required=True, help="the arm's base URL, http://IP:PORT")
    parser.add_argument("--candidate-url", required=True)
    parser.add_argument("--model", required=True, help="served model name of both arms")
    parser.add_argument("--server-type", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument(
        "--production-concurrency",
        type=int,
        required=True,
        help="production's concurrent requests: the first stage, and where the gate reads",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=DEFAULT_MAX_CONCURRENCY,
        help=f"the sweep ({', '.join(map(str, SWEEP))}) stops here",
    )
    parser.add_argument(
        "--stages", help="concurrency levels to run, comma-separated (replaces the sweep)"
    )
    parser.add_argument("--prompt-tokens", type=int, required=True)
    parser.add_argument("--prompt-std-tokens", type=int, default=0)
    parser.add_argument("--output-tokens", type=int, required=True)
    parser.add_argument(
        "--rounds", type=int, default=2, help="requests per stage = concurrency x rounds"
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=1,
        help="inference-perf's worker processes per arm, set explicitly: the tool would take the node's CPU count",
    )
    parser.add_argument(
        "--slo-ttft-ms",
        type=float,
        help="a request meets the SLO only with its time to first token at most this "
        "(inference-perf's goodput; the gate's ttftP99Ms)",
    )
    parser.add_argument(
        "--slo-tpot-ms", type=float, help="... and its time per output token at most this"
    )
    parser.add_argument(
        "--request-timeout", type=seconds(), default=120.0, help="time per request (120, 2m)"
    )
    parser.add_argument(
        "--timeout", type=seconds(), default=1800.0, help="time for each arm's run (1800, 30m)"
    )
    parser.add_argument(
        "--tokenizer",
        help="the served model's source: a tokenizer directory, or a hub repo id read from the "
        "Hugging Face cache, never downloaded (else, or when unreadable: the word tokenizer "
        "built from --tokenizer-corpus, which the engines' token counters then check)",
    )
    parser.add_argument(
        "--tokenizer-corpus",
        help="GSM8K train.jsonl for the word tokenizer that counts as kvgate.sim does "
        "(default: $KVGATE_GSM8K_DIR/train.jsonl)",
    )
    parser.add_argument(
        "--work-dir", help="where configs, logs and reports go (default: a temp dir)"
    )


def sweep(production: int, cap: int) -> tuple[int, ...]:
    """Production's concurrency first, then SWEEP's other levels upward, none above `cap`."""
    if production < 1:
        raise SpecError("--production-concurrency", f"must be >= 1, got {production}")
    if cap < production:
        raise SpecError(
            "--max-concurrency", f"{cap} is below --production-concurrency {production}"
        )
    return (production, *sorted(c for c in set(SWEEP) if c != production and c <= cap))


def explicit_stages(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecError("--stages", f"not a comma-separated list of integers: {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise SpecError("--stages", f"give concurrency levels >= 1, got {text!r}")
    return levels


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def stage_point(stage: Stage, judgement: StageJudgement) -> StagePoint:
    """One judged stage as the summary keeps it: figures only from a measured stage."""
    result = judgement.result
    measured = judgement.status == "measured" and result is not None
    figures = result if measured else None
    return StagePoint(
        concurrency=stage.concurrency,
        requests=stage.num_requests,
        status=StageStatus.MEASURED if measured else StageStatus.ERROR,
        successes=result.successes if result is not None else None,
        failures=result.failures if result is not None else None,
        output_tokens_per_s=round(figures.output_tokens_per_s, 3) if figures else None,
        ttft_p50_ms=_ms(figures.ttft_s.p50) if figures and figures.ttft_s else None,
        ttft_p99_ms=_ms(figures.ttft_s.p99) if figures and figures.ttft_s else None,
        tpot_p50_ms=_ms(figures.tpot_s.p50) if figures and figures.tpot_s else None,
        tpot_p99_ms=_ms(figures.tpot_s.p99) if figures and figures.tpot_s else None,
        itl_p50_ms=_ms(figures.itl_s.p50) if figures and figures.itl_s else None,
        itl_p99_ms=_ms(figures.itl_s.p99) if figures and figures.itl_s else None,
        goodput_percent=(
            round(figures.goodput_percentage, 2)
            if figures and figures.goodput_percentage is not None
            else None
        ),
        reasons=tuple(r[:300] for r in judgement.reasons),
    )


def _positive(value: float, option: str) -> None:
    if not value > 0:
        raise SpecError(option, f"must be > 0, got {value:g}")


def _tokenizer_dir(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The tokenizer the clients count with, and which one it is (for the log): the model
    source's (`--tokenizer`) where this Job can read it, else the word tokenizer that counts as
    kvgate.sim does (the engines' token counters then say whether it was right:
    `kvgate.load.tokenizer`)."""
    from kvgate.load.tokenizer import (
        TokenizerBuildError,
        build_word_tokenizer,
        readable_tokenizer_dir,
    )

    source = args.tokenizer
    found = readable_tokenizer_dir(source, os.environ) if source else None
    if found is not None:
        return found, f"the model's: {source}"
    corpus = args.tokenizer_corpus or (
        str(Path(os.environ["KVGATE_GSM8K_DIR"]) / "train.jsonl")
        if os.environ.get("KVGATE_GSM8K_DIR")
        else None
    )
    if not corpus:
        why = f"{source} holds no tokenizer this Job can read" if source else "none given"
        raise SpecError(
            "--tokenizer",
            f"{why}; give a tokenizer directory, --tokenizer-corpus or KVGATE_GSM8K_DIR",
        )
    try:
        built = build_word_tokenizer(Path(corpus), work / "tokenizer")
    except TokenizerBuildError as exc:
        raise SpecError("--tokenizer-corpus", str(exc)) from None
    unread = f" ({source}: no tokenizer this Job can read)" if source else ""
    return built, f"the word tokenizer that counts as kvgate.sim does{unread}"


def _reachable(base_url: str) -> bool:
    import httpx

    try:
        return httpx.get(base_url.rstrip("/") + "/v1/models", timeout=PROBE_TIMEOUT_S).is_success
    except httpx.HTTPError:
        return False


def _engine_now(base_url: str, *, client: Any = None) -> EngineNow | None:
    """The engine's cumulative preemptions (vLLM) or retractions (SGLang) and its queue now,
    from its /metrics through kvgate's one scrape (bounded body and deadline, no proxy from the
    environment); None when it cannot be read (never an error: the engine's side adds to the
    measurement, it is not one)."""
    snap = _snapshot(base_url, client)
    if snap is None:
        return None
    return EngineNow(preemptions=snap.preemptions, waiting=snap.waiting, time_scale=snap.time_scale)


def _token_counters(base_url: str) -> EngineCounters | None:
    """The engine's cumulative prompt and generation token counters now (None: unreadable)."""
    snap = _snapshot(base_url)
    if snap is None:
        return None
    return EngineCounters(
        prompt_tokens=snap.prompt_tokens, generation_tokens=snap.generation_tokens
    )


def _snapshot(base_url: str, client: Any = None) -> MetricSnapshot | None:
    from kvgate.adapters import http
    from kvgate.errors import InputError, ScrapeError

    try:
        return http.scrape_snapshot(
            base_url.rstrip("/") + "/metrics", client=client, timeout=PROBE_TIMEOUT_S
        )
    except (ScrapeError, InputError):
        return None


def _preemptions(base_url: str, *, client: Any = None) -> float | None:
    now = _engine_now(base_url, client=client)
    return None if now is None else now.preemptions


def _prefix_probe(base_url: str, model: str) -> PrefixProbe:
    """The arm's `PrefixProbe` (what it holds: its docstring), the prompt sent with max_tokens 1
    and the counters read again up to PREFIX_PROBE_READS times a second apart until the hits
    move. Before the load and its counted window, so the token counts checked after the run are
    not touched."""
    import time

    import httpx

    from kvgate.adapters import http
    from kvgate.errors import InputError, ScrapeError

    metrics = base_url.rstrip("/") + "/metrics"
    body = {"model": model, "prompt": PREFIX_PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    try:
        before = http.scrape_snapshot(metrics, timeout=PROBE_TIMEOUT_S)
        with httpx.Client(trust_env=False, timeout=PROBE_TIMEOUT_S * 6) as poster:
            for _ in range(2):
                poster.post(base_url.rstrip("/") + "/v1/completions", json=body).raise_for_status()
        for read in range(PREFIX_PROBE_READS):
            after = http.scrape_snapshot(metrics, timeout=PROBE_TIMEOUT_S)
            if (after.prefix_cache_hits or 0) > (before.prefix_cache_hits or 0):
                break
            if read + 1 < PREFIX_PROBE_READS:
                time.sleep(1.0)
    except (ScrapeError, InputError, httpx.HTTPError) as exc:
        return PrefixProbe(error=f"prefix probe: {str(exc)[:200]}")
    hits_before, hits_after = before.prefix_cache_hits, after.prefix_cache_hits
    flag = after.cache_config.get("enable_prefix_caching")
    enabled, switch = (None if flag is None else flag.lower() == "true"), None
    if after.engine == "sglang":
        # sglang:cached_tokens_total is a labelled counter: absent until the first cached token
        # (metrics_collector.py:2115, 0.5.23), so absent is 0 once the prompt tokens counted
        if after.prefix_cache_queries is not None:
            hits_before = 0.0 if hits_before is None else hits_before
            hits_after = hits_before if hits_after is None else hits_after
        enabled, switch = _radix_cache_on(base_url), SGLANG_SWITCH
    return PrefixProbe(
        queries=_increase(before.prefix_cache_queries, after.prefix_cache_queries),
        hits=_increase(hits_before, hits_after),
        enabled=enabled,
        switch=switch,
    )


def _radix_cache_on(base_url: str) -> bool | None:
    """Not SGLang's /server_info `disable_radix_cache` (server_args.resolved_dict(), 0.5.23
    sglang/srt/utils/common.py:3589; /get_server_info before 0.5.6: metrics.SERVER_INFO_PATHS);
    None when neither answers with a bool."""
    import httpx

    from kvgate.evidence.metrics import SERVER_INFO_PATHS

    for path in SERVER_INFO_PATHS:
        try:
            with httpx.Client(trust_env=False, timeout=PROBE_TIMEOUT_S) as getter:
                answer = getter.get(base_url.rstrip("/") + path)
            if answer.status_code != 200:
                continue
            info = answer.json()
        except (httpx.HTTPError, ValueError):
            continue
        value = info.get("disable_radix_cache") if isinstance(info, dict) else None
        return (not value) if isinstance(value, bool) else None
    return None


@dataclass(frozen=True)
class EngineNow:
    preemptions: float | None
    waiting: float | None
    time_scale: float | None = None  # kvgate.sim off real time (kvgate_sim_time_scale)


def _time_scale(base_url: str) -> float | None:
    """A simulated engine's wall seconds per engine second, when it is not 1 (else None)."""
    now = _engine_now(base_url)
    scale = None if now is None else now.time_scale
    return scale if scale is not None and 0 < scale < 1e6 and scale != 1 else None


# inference-perf's log lines at each stage's start and end (loadgen/load_generator.py, 0.7.0)
STAGE_LOG: Final = re.compile(rb"Stage (\d+) - run (started|completed|failed)")


class EngineWatch:
    """One arm's engine seen from its /metrics while its load runs: what each stage did to it.

    inference-perf writes its stage reports only when the whole run ends, so the stages are
    followed in its log ("Stage N - run started" ... "run completed"), read once a second with a
    scrape of the engine at each boundary and in between. The figures are right to within that
    second; a stage whose start and end fall in the same second gets none (unknown, not 0)."""

    def __init__(self, scrape: Callable[[], EngineNow | None], log: Path) -> None:
        self._scrape = scrape
        self._log, self._read, self._partial = log, 0, b""
        self._stage: int | None = None  # the stage running, as far as the log has said
        self._counter: float | None = None
        self._max_waiting: float | None = None
        self._looks = 0  # looks at the log since the running stage started
        self.stages: dict[int, tuple[float | None, float | None]] = {}

    def _sample(self) -> float | None:
        now = self._scrape()
        if now is not None and now.waiting is not None:
            self._max_waiting = max(self._max_waiting or 0.0, now.waiting)
        return None if now is None else now.preemptions

    def stage_started(self, number: int) -> None:
        self._stage, self._max_waiting, self._looks = number, None, 0
        self._counter = self._sample()

    def stage_ended(self, number: int) -> None:
        if self._stage != number:
            return  # its start was not seen: nothing can be said of it
        counter = self._sample()
        seen_running = self._looks > 0
        self.stages[number] = (
            (_increase(self._counter, counter), self._max_waiting) if seen_running else (None, None)
        )
        self._stage = None

    def look(self) -> None:
        """Follow the log's new lines; sample the engine while a stage runs."""
        if self._stage is not None:
            self._looks += 1
        for number, event in self._new_events():
            if event == b"started":
                self.stage_started(number)
            else:
                self.stage_ended(number)
        if self._stage is not None:
            self._sample()

    def _new_events(self) -> list[tuple[int, bytes]]:
        if not self._log.is_file():
            return []
        with self._log.open("rb") as f:
            f.seek(self._read)
            chunk = f.read(1 << 20)  # bounded: a log that floods is read a MiB a second
        self._read += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        self._partial = self._partial[-4096:]
        return [(int(m.group(1)), m.group(2)) for line in lines if (m := STAGE_LOG.search(line))]

    def of(self, point: StagePoint, number: int) -> StagePoint:
        preemptions, max_waiting = self.stages.get(number, (None, None))
        return replace(point, preemptions=preemptions, max_waiting=max_waiting)


def _increase(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or after < before:
        return None  # unknown, or the engine restarted and its counter began again
    return after - before


def _arm_error(
    stages: tuple[StagePoint, ...], exit_code: int | None, reachable: bool
) -> str | None:
    """Why the arm's run broke as a whole (None: it ran, whatever its stages say)."""
    if not reachable:
        measured = sum(s.measured for s in stages)
        return f"the arm did not answer after the run ({measured} of {len(stages)} stages measured)"
    if exit_code is None:
        return "inference-perf was killed at the run's deadline"
    if exit_code != 0:
        return f"inference-perf exited {exit_code}"
    return None


def run(args: argparse.Namespace) -> int:
    from kvgate.load.runner import LoadToolMissing, run_load

    for option in (
        *("prompt_tokens", "output_tokens", "rounds", "num_workers", "max_concurrency"),
        *("request_timeout", "timeout", "slo_ttft_ms", "slo_tpot_ms"),
    ):
        value = getattr(args, option)
        if value is not None or not option.startswith("slo_"):  # only the SLOs may be left out
            _positive(value, "--" + option.replace("_", "-"))
    slo = (
        Slo(
            ttft_s=None if args.slo_ttft_ms is None else args.slo_ttft_ms / 1000,
            tpot_s=None if args.slo_tpot_ms is None else args.slo_tpot_ms / 1000,
        )
        if args.slo_ttft_ms is not None or args.slo_tpot_ms is not None
        else None
    )
    levels = (
        explicit_stages(args.stages)
        if args.stages
        else sweep(args.production_concurrency, args.max_concurrency)
    )
    stages = tuple(Stage(level, level * args.rounds) for level in levels)
    urls = {"control": args.control_url, "candidate": args.candidate_url}
    for name, url in urls.items():
        if not url.startswith(("http://", "https://")):
            raise SpecError(f"--{name}-url", f"not an http(s) URL: {url!r}")
    emit = json_emitter(sys.stdout)
    summary = LoadSummary(
        kind=SUMMARY_KIND,
        production_concurrency=args.production_concurrency,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        num_workers=args.num_workers,
    )
    exit_code: int | None = None
    with tempfile.TemporaryDirectory(prefix="kvgate-load-") as scratch:
        work = Path(args.work_dir) if args.work_dir else Path(scratch)
        try:
            tokenizer, counting_with = _tokenizer_dir(args, work)
            plans = {
                name: LoadPlan(
                    base_url=url,
                    model_name=args.model,
                    tokenizer_dir=str(tokenizer),
                    report_dir=str(work / name / "reports"),
                    stages=stages,
                    prompt_tokens=args.prompt_tokens,
                    prompt_std_tokens=args.prompt_std_tokens,
                    output_tokens=args.output_tokens,
                    num_workers=args.num_workers,
                    server_type=args.server_type,
                    request_timeout_s=args.request_timeout,
                    slo=slo,
                )
                for name, url in urls.items()
            }
        except LoadPlanError as exc:
            raise SpecError("load plan", str(exc)) from None
        emit(
            {
                "kind": PROGRESS_KIND,
                "event": "started",
                "stages": list(levels),
                "requests": [s.num_requests for s in stages],
                "tokenizer": counting_with,
            }
        )
        try:
            arms = _run_both(plans, work, args.timeout, emit, run_load)
            summary = _finish(summary, arms)
        except Exception as exc:  # a bug too: the log still ends in a summary
            error = error_text(exc, LoadToolMissing)
            summary = replace(summary, verdict=LoadVerdict.ERROR, error=error)
            if not isinstance(exc, LoadToolMissing):
                exit_code = EXIT_BUG
    out = summary.to_dict()
    if nonce := os.environ.get(LOAD_NONCE_ENV):
        out["nonce"] = nonce
    emit(out)
    verdict = summary.verdict or LoadVerdict.ERROR
    return exit_code if exit_code is not None else EXIT_CODES[verdict]


def _finish(summary: LoadSummary, arms: dict[str, ArmLoad]) -> LoadSummary:
    control, candidate = arms["control"], arms["candidate"]
    verdict = overall(control, candidate)
    error = "; ".join(f"{n}: {a.error}" for n, a in arms.items() if a.error) or None
    if error is None and verdict is LoadVerdict.ERROR:
        error = "; ".join(f"{n}: no stage measured" for n, a in arms.items() if not a.measured)
    return replace(summary, verdict=verdict, error=error, control=control, candidate=candidate)


def _run_both(
    plans: dict[str, LoadPlan],
    work: Path,
    timeout_s: float,
    emit: Callable[[dict[str, Any]], None],
    run_load: Callable[..., Any],
) -> dict[str, ArmLoad]:
    """Both runs started together; a progress line as each stage's report appears."""
    runs: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}

    def one(name: str) -> None:
        try:
            runs[name] = run_load(plans[name], work / name, timeout_s=timeout_s)
        except BaseException as exc:  # re-raised in the main thread
            failures[name] = exc

    # vLLM's prefix cache (SGLang exports no such counters), probed before the counted window
    probes = {
        name: _prefix_probe(plans[name].base_url, plans[name].model_name)
        if plans[name].server_type == "vllm"
        else None
        for name in ARMS
    }
    preempted_before = {name: _preemptions(plans[name].base_url) for name in ARMS}
    # Read last before the runs start: the arms' counters may move only by this load from here.
    counted_before = {name: _token_counters(plans[name].base_url) for name in ARMS}
    watches = {
        name: EngineWatch(
            functools.partial(_engine_now, plans[name].base_url),
            work / name / INFERENCE_PERF_LOG,
        )
        for name in ARMS
    }
    threads = {name: threading.Thread(target=one, args=(name,), daemon=True) for name in ARMS}
    for thread in threads.values():
        thread.start()
    seen: set[tuple[str, int]] = set()

    def look() -> None:
        for name in ARMS:
            reports = Path(plans[name].report_dir)
            for number, stage in enumerate(plans[name].stages):
                if (name, number) not in seen and (reports / stage_file(number)).is_file():
                    seen.add((name, number))
                    emit(
                        {
                            "kind": PROGRESS_KIND,
                            "event": "stage",
                            "arm": name,
                            "stage": number,
                            "concurrency": stage.concurrency,
                        }
                    )
            watches[name].look()

    while alive := [thread for thread in threads.values() if thread.is_alive()]:
        alive[0].join(POLL_S)  # a wait, also once the other run has ended
        look()
    look()  # the reports the last runs left as they ended
    for name in ARMS:
        if name in failures:
            raise failures[name]
    arms: dict[str, ArmLoad] = {}
    for name in ARMS:
        result = runs[name]
        points = tuple(
            watches[name].of(stage_point(stage, judgement), number)
            for number, (stage, judgement) in enumerate(
                zip(plans[name].stages, result.stages, strict=True)
            )
        )
        reachable = _reachable(plans[name].base_url)
        broke = _arm_error(points, result.exit_code, reachable)
        # An arm that died has its error; the counts of one that answers must be the engine's.
        miscounted = (
            check_counts(
                client_counts(result.stages, [s.num_requests for s in plans[name].stages]),
                counted_before[name],
                _token_counters(plans[name].base_url),
                output_tokens=plans[name].output_tokens,
                engine=plans[name].server_type,
            )
            if reachable
            else ()
        )
        arms[name] = ArmLoad(
            url=plans[name].base_url,
            exit_code=result.exit_code,
            reachable_after=reachable,
            error="; ".join(filter(None, (broke, *miscounted))) or None,
            stages=points,
            preemptions=_increase(
                preempted_before[name], _preemptions(plans[name].base_url) if reachable else None
            ),
            output=result.output,
            prefix_cache=probes[name],
            time_scale=_time_scale(plans[name].base_url) if reachable else None,
        )
        emit(
            {
                "kind": PROGRESS_KIND,
                "event": "finished",
                "arm": name,
                "measured": sum(p.measured for p in points),
                "stages": len(points),
                "logTail": result.log_tail[-300:] if arms[name].error else None,
            }
        )
    return arms
