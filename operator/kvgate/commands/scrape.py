"""`kvgate scrape URL`: an engine's /metrics snapshot and, over several samples, the pool verdict.

Exit 0: scraped, and with several samples the pool verdict is decided (pressured or not);
2: bad input; 3: the verdict needs more evidence; 4: the endpoint could not be read.
By default it takes enough samples for the verdict (5, 5 s apart: about 20 s); on a terminal it
prints one progress line per sample to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

from kvgate.commands.exit_codes import EXIT_INCONCLUSIVE, EXIT_OK
from kvgate.errors import ScrapeError
from kvgate.evidence.metrics import MetricSnapshot, MetricWindow, delta
from kvgate.evidence.pool import MIN_SAMPLES, PoolPressure, pool_pressure
from kvgate.inputs import bounded_int, fraction, seconds

EXAMPLES: Final = ("kvgate scrape http://10.0.0.7:8000/metrics --samples 12 --interval 10",)

# The pool verdict needs MIN_SAMPLES usable samples (ones with a KV usage reading); the
# default takes two more, over a 20 s window.
DEFAULT_SAMPLES: Final = MIN_SAMPLES + 2
DEFAULT_INTERVAL: Final = 5.0
SLEEP: Callable[[float], None] = time.sleep  # the wait between samples (a test seam)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="metrics URL, e.g. http://10.0.0.5:8000/metrics")
    parser.add_argument(
        "--interval",
        type=seconds(0, 86400),
        default=DEFAULT_INTERVAL,
        metavar="S",
        help="time between samples: seconds or a duration (5, 5s, 1m)",
    )
    parser.add_argument(
        "--samples",
        type=bounded_int(1, 100_000),
        default=DEFAULT_SAMPLES,
        metavar="N",
        help=f"number of samples; the pool verdict needs at least {MIN_SAMPLES}",
    )
    parser.add_argument("--engine", default="auto", metavar="ENGINE", help="vllm, sglang or auto")
    parser.add_argument(
        "--usage-threshold",
        type=fraction(0, 1, low_open=True),
        default=0.9,
        metavar="F",
        help="full-pool KV usage: a fraction or a percentage (0.9, 90%%)",
    )
    parser.add_argument(
        "--min-fraction",
        type=fraction(0, 1, low_open=True),
        default=0.5,
        metavar="F",
        help="share of samples that must show a full pool with requests waiting",
    )
    parser.add_argument(
        "--timeout",
        type=seconds(0, 3600, low_open=True),
        default=5.0,
        metavar="S",
        help="time per request: seconds or a duration (5, 5s, 1m)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from kvgate.adapters.http import scrape_series  # httpx only when scraping

    progress = _progress(args.samples, args.interval) if sys.stderr.isatty() else None
    failed: list[str] = []

    def lost(n: int, exc: ScrapeError) -> None:
        failed.append(f"sample {n}: {exc}")
        if progress is not None:
            print(f"sample {n}/{args.samples}: failed: {exc}", file=sys.stderr, flush=True)

    snapshots = scrape_series(
        args.url,
        args.interval,
        args.samples,
        SLEEP,
        engine=args.engine,
        timeout=args.timeout,
        clock=time.time,  # wall-clock stamps: what `taken_at` in --json means to a reader
        on_sample=progress,
        on_failure=lost,
    )
    window = delta(snapshots[0], snapshots[-1]) if len(snapshots) > 1 else None
    pressure = pool_pressure(
        snapshots, usage_threshold=args.usage_threshold, min_fraction=args.min_fraction
    )
    if args.json:
        print(
            json.dumps(
                {
                    "url": args.url,
                    "snapshot": snapshots[-1].to_dict(),
                    "window": window.to_dict() if window else None,
                    "pool_pressure": pressure.to_dict(),
                    "failed_samples": failed,
                },
                sort_keys=True,
                allow_nan=False,  # parse_metrics refuses non-finite values; never print Infinity
            )
        )
    else:
        print(render_text(args.url, snapshots[-1], window, pressure, failed))
    return EXIT_OK if pressure.pressured is not None else EXIT_INCONCLUSIVE


def _progress(total: int, interval: float) -> Callable[[int, MetricSnapshot], None]:
    def show(n: int, snapshot: MetricSnapshot) -> None:
        usage = "n/a" if snapshot.kv_usage is None else f"{snapshot.kv_usage:.1%}"
        line = f"sample {n}/{total}: kv usage {usage}, waiting {_fmt(snapshot.waiting)}"
        if n < total:
            line += f" (next in {interval:g} s)"
        print(line, file=sys.stderr, flush=True)

    return show


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def _dtype(dtype: str | None) -> str:
    if dtype == "auto":  # the engine's word for "no KV dtype of its own"
        return "auto (the model's own dtype, unless the checkpoint sets one)"
    return dtype or "n/a"


def render_text(
    url: str,
    snapshot: MetricSnapshot,
    window: MetricWindow | None,
    pressure: PoolPressure,
    failed: Sequence[str] = (),
) -> str:
    usage = "n/a" if snapshot.kv_usage is None else f"{snapshot.kv_usage:.1%}"
    lines = [
        f"{url}: {snapshot.engine}",
        f"  kv usage:        {usage} ({snapshot.names.get('kv_usage', 'absent')})",
        f"  running/waiting: {_fmt(snapshot.running)} / {_fmt(snapshot.waiting)}",
        f"  preemptions:     {_fmt(snapshot.preemptions, 6)}",
        f"  kv cache dtype:  {_dtype(snapshot.kv_cache_dtype)}",
        f"  kv pool tokens:  {snapshot.kv_capacity_tokens or 'n/a'}",
    ]
    if window is not None:
        lines.append(f"window ({_fmt(window.seconds)} s):")
        lines.append(f"  generation tokens/s: {_fmt(window.generation_token_rate, 5)}")
        lines.append(f"  preemptions:         {_fmt(window.preemptions, 6)}")
        for name, summary in (("ttft", window.ttft), ("itl", window.itl), ("tpot", window.tpot)):
            if summary is not None and summary.count:
                lines.append(
                    f"  {name} s: mean {_fmt(summary.mean)}, p50 {_fmt(summary.p50)}, "
                    f"p90 {_fmt(summary.p90)}, p99 {_fmt(summary.p99)} (n={summary.count:g})"
                )
    verdict = {True: "pressured", False: "not pressured", None: "inconclusive"}[pressure.pressured]
    lines.append(f"pool: {verdict}")
    lines.extend(f"  {reason}" for reason in pressure.reasons)
    if failed:
        lines.append(f"left out ({len(failed)} sample(s) could not be read):")
        lines.extend(f"  {line}" for line in failed)
    return "\n".join(lines)
