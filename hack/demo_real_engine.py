"""The demo's last part: what FP8 buys on a real vLLM, and a rollout gated on a real vLLM.

Called by hack/demo.sh (or alone, after `make vllmenv`):

    .venv/bin/python hack/demo_real_engine.py --state-dir DIR [--bin-dir BIN] [--timeout 900]

(a) The numbers: real vLLM 0.32 (CPU build) serving a tiny random Qwen3 (hack/tiny_model.py),
    with a BF16 KV cache and an FP8 one in the same 8 MiB pool, both started at once; a burst of
    `--levels` concurrent long requests on each in turn, sent by inference-perf (hack/real_vllm.compare, as
    bench/bench_real_engine.py): KV tokens, preemptions, peak waiting, tok/s, TPOT.
(b) A rollout on real vLLM: a small cluster of its own with the process kubelet (real vLLM has
    no image for the containerd node: it would be 6 GB), the operator as `kvgate run`, production
    a Deployment of real vLLM (hack/real_vllm.engine_deployment) whose pool inference-perf keeps
    full (real_vllm.Pressure) while Preflight samples it. Narrated like the demo's rollouts. The
    accuracy gate is off: a random model scores 0 on both arms.

Every wait has a deadline; on failure it prints what went wrong (the rollout's status, the
operator's log, the pods) and tears down what it started: servers, operator, cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HACK = Path(__file__).resolve().parent
ROOT = HACK.parent
sys.path.insert(0, str(HACK))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))  # the operator subprocess and the kubectl helpers
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))

from support import (  # noqa: E402
    Operator,
    apply,
    container_of,
    create_namespace,
    get,
    install_crd,
    pods,
    rollout,
    wait_deployment_ready,
    wait_for,
)

import real_vllm  # noqa: E402
from cluster import Cluster, default_bin_dir  # noqa: E402
from tiny_model import build  # noqa: E402

NS = "kvgate-real-engine"
TARGET = "vllm"
TERMINAL = {"Promoted", "RolledBack", "NotNeeded", "Failed"}
# A pod IP prefix below the xdist workers' (hack/cluster.py BESIDE_PREFIXES) and below the one
# `make test`'s harness tier takes beside them (15): this cluster runs beside any other.
POD_IP_PREFIX = 12

TTY = sys.stdout.isatty()
T0 = time.monotonic()


def c(code: str, text: str) -> str:
    return f"\033[{code}m{text}\033[0m" if TTY else text


def say(text: str = "") -> None:
    print(text, flush=True)


ELAPSED = 0.0  # seconds the caller (hack/demo.sh) had run before this part: its step clock


def step(text: str) -> None:
    say(f"\n{c('1', '== ' + text)} {c('2', f'({ELAPSED + time.monotonic() - T0:.0f}s)')}")


# ---- (a) the numbers ----------------------------------------------------------------------


def numbers(model: Path, levels: tuple[int, ...], log_dir: Path) -> None:
    step("What FP8 buys on a real vLLM: the same 8 MiB KV pool, BF16 vs FP8")
    say(
        c(
            "2",
            "vLLM 0.32 (CPU build), a tiny Qwen3 with random weights, 2 servers started at once; "
            f"inference-perf bursts of {', '.join(map(str, levels))} requests (128 tokens in, "
            "512 out), one server at a time.",
        )
    )

    def shown(dtype: str, b: real_vllm.Burst) -> None:
        say(
            f"  {c('2', '·')} {'BF16' if dtype == 'auto' else 'FP8 '} x{b.concurrency:<3} "
            f"{b.wall_s:5.1f}s, {b.preemptions} preempted"
        )

    t = time.monotonic()
    results = real_vllm.compare(model, levels, log_dir, on_burst=shown)
    say(c("2", f"  (measured in {time.monotonic() - t:.0f}s; servers stopped)"))
    bf16, fp8 = results["auto"], results["fp8"]
    say()
    say(
        f"  {'':22} " + "".join(f"{'x' + str(b.concurrency) + ' BF16':>11}{'FP8':>9}" for b in bf16)
    )
    rows: list[tuple[str, Any]] = [
        ("KV tokens", lambda b: f"{b.kv_tokens:,}"),
        ("preemptions", lambda b: str(b.preemptions)),
        ("peak waiting", lambda b: str(b.peak_waiting)),
        ("output tok/s", lambda b: f"{b.tok_s:,.0f}"),
        ("TPOT p50 (ms)", lambda b: f"{b.tpot_p50_ms:.1f}"),
        ("TPOT p99 (ms)", lambda b: f"{b.tpot_p99_ms:.1f}"),
    ]
    for label, cell in rows:
        say(
            f"  {label:22} "
            + "".join(f"{cell(x):>11}{cell(y):>9}" for x, y in zip(bf16, fp8, strict=True))
        )
    ratio = fp8[0].kv_tokens / bf16[0].kv_tokens
    say()
    say(
        f"  {c('1', 'FP8 holds ' + f'{ratio:.2f}x' + ' the tokens in the same bytes')}. Where "
        "BF16's pool runs out and FP8's does not, BF16's requests are preempted (recomputed) "
        "and wait; FP8's are not. Where both fit, the TPOT difference is FP8's cost per token "
        "on this CPU build, and this machine's noise (bench/RESULTS-real-engine.md has more)."
    )
    say(
        c(
            "2",
            "  tok/s, TPOT: inference-perf's report, in the engine's tokens; the rest from each "
            "engine's /metrics (peak waiting: samples every 0.5 s).",
        )
    )


# ---- (b) the rollout ----------------------------------------------------------------------


class Narrator:
    """A line per phase change and per new Event of one rollout (as hack/demo.sh's narrate)."""

    def __init__(self, cluster: Cluster, name: str, model: Path) -> None:
        self.cluster, self.name, self.model = cluster, name, model
        self.t0 = time.monotonic()
        self.seen: set[str] = set()
        self.phase: str | None = None

    def short(self, text: str | None) -> str:
        """The line without the long paths (the server's command, the model's directory)."""
        text = (text or "").replace(" ".join(real_vllm.VLLM_SERVER), "vllm")
        return text.replace(str(self.model.parent) + "/", "")[:150]

    def status(self) -> dict[str, Any]:
        obj = get(self.cluster, NS, "kvcacherollout", self.name) or {}
        return dict(obj.get("status") or {})

    def poll(self) -> dict[str, Any]:
        now = time.monotonic() - self.t0
        proc = self.cluster.kubectl(
            "get", "events", "-n", NS, "-o", "json",
            f"--field-selector=involvedObject.kind=KVCacheRollout,involvedObject.name={self.name}",
            check=False, timeout=30,
        )  # fmt: skip
        items = json.loads(proc.stdout).get("items", []) if proc.returncode == 0 else []
        for ev in sorted(items, key=lambda e: int(e["metadata"]["resourceVersion"])):
            if ev["metadata"]["uid"] in self.seen:
                continue
            self.seen.add(ev["metadata"]["uid"])
            mark = c("33", "!") if ev.get("type") == "Warning" else c("2", "·")
            say(f"  {now:6.1f}s {mark} {ev.get('reason')}: {self.short(ev.get('message'))}")
        status = self.status()
        if status.get("phase") and status["phase"] != self.phase:
            self.phase = status["phase"]
            color = (
                "32"
                if self.phase in ("Promoted", "NotNeeded")
                else "31"
                if self.phase in ("RolledBack", "Failed")
                else "36"
            )
            msg = self.short(status.get("message"))
            say(f"  {now:6.1f}s {c('1;' + color, '→ ' + self.phase)}  {msg}")
        return status

    def until(self, done: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = self.poll()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g}s (phase {status.get('phase')})")
            time.sleep(1.0)


def production_url(cluster: Cluster) -> str | None:
    for p in pods(cluster, NS, f"app={TARGET}"):
        ip = p["status"].get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in p["status"].get("conditions") or []
        )
        if ip and ready and not p["metadata"].get("deletionTimestamp"):
            return f"http://{ip}:{real_vllm.PORT}"
    return None


def the_rollout(cluster: Cluster, model: Path, log_dir: Path, timeout: float) -> None:
    create_namespace(cluster, NS)
    install_crd(cluster)
    operator = Operator(cluster, log_dir / "operator.log", namespaces=[NS]).start()
    try:
        rollout_on_real_vllm(cluster, operator, model, timeout, log_dir)
    except BaseException:
        say(c("31", "\n== What went wrong"))
        obj = get(cluster, NS, "kvcacherollout", "fp8") or {}
        say("-- the rollout's status: " + json.dumps(obj.get("status"))[:2500])
        proc = cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False, timeout=30)
        say(proc.stdout + proc.stderr)
        say(f"-- operator log (last 40 lines; all of it in {operator.log_path})")
        say(operator.tail(40))
        raise
    finally:
        # The rollout's finalizer needs the operator: delete it first, then stop the operator.
        cluster.kubectl("delete", "kvr", "--all", "-n", NS, "--wait=false", check=False)
        cluster.kubectl(
            "wait", "--for=delete", "kvr", "--all", "-n", NS, "--timeout=60s", check=False
        )
        code = operator.stop()
        if code != 0 or "Traceback" in operator.log():
            say(c("33", f"  the operator exited {code}; its log: {operator.log_path}"))
        # Production's pod is real vLLM: stopped by its kubelet before the cluster goes.
        cluster.kubectl("delete", "deployment", TARGET, "-n", NS, "--wait=false", check=False)
        cluster.kubectl(
            "wait", "--for=delete", "pods", "--all", "-n", NS, "--timeout=90s", check=False
        )


def rollout_on_real_vllm(
    cluster: Cluster, operator: Operator, model: Path, timeout: float, log_dir: Path
) -> None:
    apply(cluster, NS, real_vllm.engine_deployment(TARGET, model))
    say(f"  {c('2', '·')} Deployment {TARGET}: `python -m vllm.entrypoints.openai.api_server` on")
    say(f"    {model.name}, --kv-cache-memory-bytes {real_vllm.SMALL_POOL_BYTES}; the kubelet runs")
    say("    its pod as a process at a loopback IP")
    t = time.monotonic()
    wait_deployment_ready(cluster, NS, TARGET, timeout=600)
    url = wait_for(lambda: production_url(cluster), 60, "production's ready pod")
    say(f"  production ready in {time.monotonic() - t:.0f}s at {url}")
    say(f"    {kv_line(url)}")

    pressure = real_vllm.Pressure(url, str(model), workers=16).start()
    narrator = Narrator(cluster, "fp8", model)
    try:
        full = pressure.wait_full(timeout=300)
        say(f"  inference-perf, 16 concurrent streams, keeps production's pool full: {full}")
        say(
            c(
                "2",
                "  accuracy: not measurable on a random tiny model, off here; with it on kvgate "
                "says inconclusive, never non-inferior.",
            )
        )
        spec = rollout(
            "fp8",
            TARGET,
            kvCacheDtype="fp8",
            gates={
                "capacity": {"mode": "require", "window": "6s", "samples": 3},
                "accuracy": {"mode": "off"},
            },
            # Two more real servers start beside production on the same cores: room for that.
            canary={"startupTimeout": "600s", "evalTimeout": "300s", "evalRetries": 0},
            promotion={"mode": "auto", "verifyWindow": "10s", "verifySamples": 3},
        )
        apply(cluster, NS, spec)
        say("  kvcacherollout.kvgate.io/fp8 created (--kv-cache-dtype fp8)")
        # Production's pool is kept full only while Preflight samples it: the two canaries
        # (real vLLM, control and candidate) start next, on the same cores.
        narrator.until(
            lambda s: s.get("phase") not in (None, "Pending", "Preflight"), 300, "past Preflight"
        )
    finally:
        pressure.stop()
    say(c("2", "  (inference-perf stops; vLLM aborts the requests it had in flight)"))
    status = narrator.until(lambda s: s.get("phase") in TERMINAL, timeout, "fp8 ended")
    verdict(cluster, status, log_dir)
    if status.get("phase") != "Promoted":
        raise RuntimeError(f"the rollout ended {status.get('phase')}: {status.get('message')}")
    wait_deployment_ready(cluster, NS, TARGET, timeout=600)
    url = wait_for(lambda: production_url(cluster), 60, "the promoted pod")
    say(f"  the promoted pod is real vLLM with an FP8 KV cache, {kv_line(url)}")


def kv_line(url: str) -> str:
    info = real_vllm.kv_tokens(url)
    text = real_vllm.httpx.get(f"{url}/metrics", timeout=5).text
    dtype = next(
        (
            line.split('cache_dtype="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("vllm:cache_config_info") and 'cache_dtype="' in line
        ),
        "?",
    )
    return f"its /metrics: cache_dtype={dtype}, kv_cache_size_tokens={info:,}"


def verdict(cluster: Cluster, status: dict[str, Any], log_dir: Path) -> None:
    (log_dir / "rollout-fp8.status.json").write_text(json.dumps(status, indent=2) + "\n")
    say(f"\n  {c('1', 'verdict')}: {status.get('phase')} ({status.get('reason')})")
    gates = status.get("gates") or {}
    order = ["poolPressure", "scales", "canary", "engineTruth", "backend", "capacityGain"]
    for name, g in sorted(gates.items(), key=lambda kv: [*order, kv[0]].index(kv[0])):
        reason = g.get("reason") or g.get("outcome") or "?"
        say(f"    {name:13} {reason:18} {(g.get('message') or '')[:100]}")
    for arm, a in sorted((status.get("arms") or {}).items(), reverse=True):  # control first
        logged = ((a.get("scan") or {}).get("capacity") or {}).get("kvTokens")
        served = ((a.get("metrics") or {}).get("cacheConfig") or {}).get("kv_cache_size_tokens")
        dtype = (a.get("scan") or {}).get("kvCacheDtype")
        say(
            f"    {arm:9} pod {a.get('pod')}: KV {dtype}, {logged} tokens in its startup log, "
            f"{served} in its /metrics"
        )
    dep = get(cluster, NS, "deployment", TARGET)
    if dep is not None:
        args = container_of(dep).get("args") or []
        say(f"  production's args now: {' '.join(args[2:])}")  # after --model DIR


# ---- main ---------------------------------------------------------------------------------


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM (demo.sh's trap) as Ctrl-C: the `finally`s tear down what was started."""
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="the cluster's and logs")
    parser.add_argument("--bin-dir", type=Path, default=default_bin_dir())
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the rollout")
    parser.add_argument("--levels", default="4,10", help="concurrent requests per burst")
    parser.add_argument("--elapsed", type=float, default=0.0, help="the caller's clock, seconds")
    parser.add_argument("--skip-numbers", action="store_true", help="the rollout only")
    parser.add_argument("--skip-rollout", action="store_true", help="the numbers only")
    args = parser.parse_args()
    if not real_vllm.VLLM_SERVER[0] or not Path(real_vllm.VLLM_SERVER[0]).exists():
        say(f"no real vLLM at {real_vllm.VLLM_VENV}: run `make vllmenv`")
        return 2
    global ELAPSED
    ELAPSED = args.elapsed
    levels = tuple(int(x) for x in args.levels.split(","))
    state = args.state_dir.resolve()
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # The model lives under the temp dir: the operator reads local checkpoints there only
    # (KVGATE_MODEL_DIRS, as tests/e2e/support.Operator sets it).
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-real-") as tmp:
        model = build(Path(tmp) / "tiny-qwen3", corpus="words")
        cluster: Cluster | None = None
        try:
            if not args.skip_numbers:
                numbers(model, levels, logs)
            if not args.skip_rollout:
                # In this thread: the control plane's processes die with the thread that
                # started them (PR_SET_PDEATHSIG), and after (a), which wants the cores.
                step("A rollout on real vLLM: production is real vLLM 0.32 (CPU), 4,096 tokens")
                t = time.monotonic()
                cluster = Cluster(
                    state / "cluster",
                    args.bin_dir,
                    node_kind="process",
                    kubelet_args=[f"--ip-prefixes={POD_IP_PREFIX}-{POD_IP_PREFIX}"],
                    log=lambda msg: append(logs / "cluster.log", msg),
                )
                cluster.start(timeout=300)
                up = time.monotonic() - t
                say(f"  a small cluster of its own with the process kubelet: up in {up:.0f}s")
                the_rollout(cluster, model, logs, args.timeout)
        except BaseException as exc:
            say(c("31", f"real-engine part failed: {exc!r}"))
            if isinstance(exc, subprocess.CalledProcessError):
                say(f"{exc.stdout or ''}{exc.stderr or ''}")
            for log in sorted(logs.glob("vllm-*.log")) if "vllm-" in str(exc) else []:
                say(f"-- {log} (last 10 lines)")
                say("\n".join(log.read_text(errors="replace").splitlines()[-10:]))
            return 1
        finally:
            if cluster is not None:
                cluster.stop()  # the kubelet stops its pods' process groups with it
            leftover = stray_servers(model)
            for pid in leftover:
                os.kill(pid, 9)
            if leftover:
                say(c("33", f"killed {len(leftover)} vLLM processes left behind: {leftover}"))
    say(c("32", f"\nThe real-engine part done in {time.monotonic() - T0:.0f}s; logs in {logs}"))
    return 0


def append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def stray_servers(model: Path) -> list[int]:
    """Processes still serving `model` (none should be: every server is stopped above)."""
    out = subprocess.run(["pgrep", "-f", str(model)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]


if __name__ == "__main__":
    sys.exit(main())
