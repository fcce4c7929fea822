#!/usr/bin/env python3
"""Run the test suite tier by tier, as `make test` and CI do (tiers: tests/conftest.py).

Every tier runs even when an earlier one fails; the exit code is non-zero if any tier failed or
ran no test. Per tier, under the output dir (default .test-output/): `<tier>.xml` (junit),
`<tier>.log` (pytest's console output, with its --durations table) and `<tier>.durations.txt`
(every test's time from the junit, slowest first). At the end: a line per tier and the slowest
tests of the whole run.

    hack/test_tiers.py                      # every tier
    hack/test_tiers.py fast e2e             # some tiers
    hack/test_tiers.py e2e --path tests/e2e/test_crd.py -- -x   # some files; pytest args after --

Tiers run one at a time (realengine, real vLLM on two cores, last and alone), but for the
harness, which runs beside fast, lmeval and tools
(`BESIDE`; `--one-at-a-time` to keep it alone): its output is printed when it ends, before
e2e starts. fast, lmeval and tools run on two pytest-xdist workers, a test file at
a time per worker. e2e runs on `--e2e-workers N` (`make test` passes 2; this script's default is
serial): each e2e module's operator watches every namespace (tests/e2e/support.py, Operator),
so two modules on one cluster would act on each other's rollouts, and each e2e worker starts a
cluster of its own with its own slice of loopback pod IPs. Measured (bench/RESULTS-suite.md):
2 workers took e2e from 2,145 s to 1,416 s (78 passed, the machine at load 5-10). Pytest args
after `--` come last, so `-- -n 0` runs the fast tier serially.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pytest-xdist, a test file per worker at a time (--dist loadfile keeps a module's tests, their
# module fixtures and their order on one worker). Two workers: CI has 2 cores.
PARALLEL = ["-n", "2", "--dist", "loadfile"]
SERIAL = ["-n", "0"]
# Files in collection order (the longest first, tests/conftest.py FIRST), not by test count.
E2E_PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]
# The selection of each tier; together they are the whole suite (the markers are disjoint).
# e2e is serial unless --e2e-workers (`make test`: 2; E2E_PARALLEL: each worker with a cluster
# of its own, tests/conftest.py `cluster`, so two modules' operators never see each other's
# rollouts).
# lmeval and tools mostly wait (on engines' simulated latency, inference-perf's timed stages,
# Prometheus' scrapes): run serially, the machine was 45-93% idle through them (vmstat,
# bench/RESULTS-suite.md), so they run on two workers, a file at a time each (every server they
# start listens on a port of its own). The harness starts clusters of its own: serial.
TIERS: dict[str, list[str]] = {
    "fast": [
        "-m",
        "not lmeval and not tools and not e2e and not harness and not realengine",
        *PARALLEL,
    ],
    "lmeval": ["--with-lmeval", "-m", "lmeval", *PARALLEL],
    "tools": ["--with-tools", "-m", "tools", *PARALLEL],
    "e2e": ["--with-e2e", "-m", "e2e", *SERIAL],
    "harness": ["--with-harness", "-m", "harness", *SERIAL],
    # Real vLLM (CPU) serving tiny models: each server takes most of a core while it starts, so
    # the tier runs alone, last, one module at a time.
    "realengine": ["--with-realengine", "-m", "realengine", *SERIAL],
}
PYTEST_NO_TESTS = 5
# The harness runs beside these tiers when they run too: it mostly waits on the real node's
# timed windows (the machine was ~90% idle through it, bench/RESULTS-suite.md), it alone builds
# images, and its clusters' addresses are not theirs: the real node's pods are on its bridge
# (10.244.0.0/24), its test kubelet's on 127.15.x.y (`BESIDE_ENV`, below the e2e workers'
# 127.16-254), the other tiers' servers on 127.0.0.x. Not beside e2e, whose measurements
# (the load gate's throughput gain) want the CPUs the two e2e workers already share: e2e starts
# when the harness ended (bench/RESULTS-suite.md, run 3). `--one-at-a-time` runs every tier
# alone.
BESIDE: dict[str, tuple[str, ...]] = {"harness": ("fast", "lmeval", "tools")}
BESIDE_ENV: dict[str, str] = {"KVGATE_POD_IP_PREFIX": "15"}  # hack/cluster.py BESIDE_PREFIXES


@dataclass
class TierResult:
    tier: str
    exit_code: int
    seconds: float
    tests: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def ran(self) -> int:
        return self.tests - self.skipped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.ran > 0


def read_junit(path: Path) -> tuple[dict[str, int], list[tuple[float, str]]]:
    """The totals and every test's (seconds, node id) of one junit file."""
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    times: list[tuple[float, str]] = []
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            times.append((float(case.get("time", "0")), name))
    times.sort(reverse=True)
    return totals, times


def run_tier(
    tier: str,
    out: Path,
    paths: list[str],
    extra: list[str],
    *,
    echo: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[TierResult, list[tuple[float, str]]]:
    junit, log = out / f"{tier}.xml", out / f"{tier}.log"
    for stale in (junit, log, out / f"{tier}.durations.txt"):
        stale.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", *paths, *TIERS[tier]]
    argv += [f"--junitxml={junit}", "-o", f"junit_suite_name={tier}", "--durations=30", *extra]
    where = "" if echo else f" (beside the others; its output in {log} and below when it ends)"
    print(f"\n=== tier {tier}{where}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        assert proc.stdout is not None
        # To the console and the log as it comes (pytest's progress dots end no line).
        fd = proc.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            if echo:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            sink.write(chunk)
            sink.flush()  # a tier beside the others is followed in its log
        code = proc.wait()
    result = TierResult(tier, code, time.monotonic() - started)
    if not junit.exists():
        return result, []
    totals, times = read_junit(junit)
    result.tests, result.skipped = totals["tests"], totals["skipped"]
    result.failed = totals["failures"] + totals["errors"]
    lines = [f"{seconds:9.2f}s  {name}" for seconds, name in times]
    (out / f"{tier}.durations.txt").write_text("\n".join(lines) + "\n")
    return result, times


def _finish(thread: threading.Thread, tier: str, out: Path) -> None:
    """Wait for a tier that ran beside the others, then show its output."""
    thread.join()
    print(f"\n=== tier {tier} (ran beside the others): its output", flush=True)
    log = out / f"{tier}.log"
    if log.exists():
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.buffer.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="*", help=f"some of {', '.join(TIERS)} (default: all)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / ".test-output")
    parser.add_argument("--slowest", type=int, default=10, help="slowest tests to print")
    parser.add_argument(
        "--e2e-workers",
        type=int,
        default=0,
        metavar="N",
        help="run e2e on N pytest-xdist workers, a cluster each (default: serial)",
    )
    parser.add_argument(
        "--path", action="append", dest="paths", help="test file or dir (default: tests)"
    )
    parser.add_argument(
        "--one-at-a-time", action="store_true", help="no tier beside another (see BESIDE)"
    )
    args = parser.parse_args(ours)
    unknown = [t for t in args.tiers if t not in TIERS]
    if unknown:
        parser.error(f"unknown tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}")
    tiers = args.tiers or list(TIERS)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results: list[TierResult] = []
    everything: list[tuple[float, str, str]] = []
    if args.e2e_workers < 0:
        parser.error(f"--e2e-workers {args.e2e_workers}: expected 0 (serial) or more")
    paths = args.paths or ["tests"]
    wall_started = time.monotonic()
    done: list[tuple[TierResult, list[tuple[float, str]]]] = []
    beside: dict[str, threading.Thread] = {}
    for tier, company in BESIDE.items():
        if tier in tiers and set(company) & set(tiers) and not args.one_at_a_time:
            thread = threading.Thread(
                target=lambda t=tier: done.append(
                    run_tier(t, args.output_dir, paths, extra, echo=False, env=BESIDE_ENV)
                )
            )
            thread.start()
            beside[tier] = thread
    started_beside = set(beside)
    for tier in tiers:
        if tier in started_beside:
            continue
        for other in [b for b in beside if tier not in BESIDE[b]]:
            _finish(beside.pop(other), other, args.output_dir)
        more = extra
        if tier == "e2e" and args.e2e_workers > 0:
            more = ["-n", str(args.e2e_workers), *E2E_PARALLEL, *extra]
        done.append(run_tier(tier, args.output_dir, paths, more))
    for other in list(beside):
        _finish(beside.pop(other), other, args.output_dir)
    for result, times in sorted(done, key=lambda d: tiers.index(d[0].tier)):
        results.append(result)
        everything += [(seconds, result.tier, name) for seconds, name in times]

    print(f"\n=== tiers (junit, logs and durations in {args.output_dir})")
    for r in results:
        verdict = "ok" if r.ok else "FAILED"
        if r.exit_code == PYTEST_NO_TESTS or (r.exit_code == 0 and r.ran == 0):
            verdict = "FAILED: ran no test"
        print(
            f"{r.tier:8} {verdict:20} exit {r.exit_code}  {r.tests} tests, {r.failed} failed, "
            f"{r.skipped} skipped  {r.seconds:7.1f}s"
        )
    wall = time.monotonic() - wall_started
    print(f"total {sum(r.seconds for r in results):.1f}s of tiers in {wall:.1f}s; "
          f"slowest {args.slowest} tests:")  # fmt: skip
    for seconds, tier, name in sorted(everything, reverse=True)[: args.slowest]:
        print(f"{seconds:9.2f}s  [{tier}] {name}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
