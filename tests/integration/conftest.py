"""Shared integration fixtures: a `kvgate.sim` engine as a subprocess on a free loopback port.

Use the `sim` fixture, a factory:

    def test_x(sim):
        engine = sim(["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"],
                     env={"KVGATE_SIM_GPU": "H100"})
        httpx.get(engine.url + "/health")

`sim(engine_args, env=None, *, host="127.0.0.1", ready=True, timeout=30.0) -> SimProcess`

- `host`: passed as `--host`; `None` passes no flag, so the engine binds `POD_IP` from `env`
  (as in a pod) or its own default.

- `engine_args`: the engine command line after `python -m kvgate.sim` (`["vllm", "serve", M, ...]`
  or `["sglang", "--model-path", M, ...]`); `--host` and `--port` are appended.
- `env`: extra environment (KVGATE_SIM_*); `KVGATE_SIM_SPEED` defaults to 0.001 so a
  request takes milliseconds. The parent environment is inherited.
- `ready=True` waits until `/health` returns 200 (SGLang: after its warm-up) and fails the
  test with the log tail if the process exits first; `ready=False` returns at once (for
  startup failures: call `engine.wait()` and read `engine.log()`).
- vLLM on the default L4 profile needs `--max-model-len` (Qwen3-8B's 40,960 tokens do not
  fit the BF16 pool, as on a real L4) and fails with the FlashInfer JIT fault under
  `--kv-cache-dtype fp8` unless `--attention-backend TRITON_ATTN` or `KVGATE_SIM_FAULTS=no-jit-build-fails`.

`SimProcess` has `url` (`http://host:port`), `host`, `port`, `proc` (Popen), `log_path`,
`log()` (stdout+stderr so far), `wait(timeout)` (exit code), `terminate(timeout)` (SIGTERM,
then the exit code). Every process is stopped (SIGTERM, then SIGKILL) after the test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class SimProcess:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def terminate(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_healthy(engine: SimProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.proc.poll() is not None:
            pytest.fail(
                f"simulator exited with {engine.proc.returncode} before ready:\n{engine.log()[-3000:]}"
            )
        try:
            if httpx.get(engine.url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    pytest.fail(f"simulator not healthy after {timeout}s:\n{engine.log()[-3000:]}")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[..., SimProcess]]:
    started: list[SimProcess] = []

    def start(
        engine_args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        host: str | None = "127.0.0.1",
        ready: bool = True,
        timeout: float = 30.0,
    ) -> SimProcess:
        full_env = {
            **os.environ,
            "KVGATE_SIM_SPEED": "0.001",
            "PYTHONUNBUFFERED": "1",
            # Engines here share 127.0.0.1: the node exporter only where a test asks for it.
            "KVGATE_SIM_DCGM": "off",
            **(env or {}),
        }
        # host=None: no --host flag, so the engine picks POD_IP (or its default)
        address = host or full_env.get("POD_IP") or "127.0.0.1"
        port = free_port(address)
        host_args = ["--host", host] if host else []
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO / "operator"), full_env.get("PYTHONPATH")])
        )
        log_path = tmp_path / f"sim-{len(started)}-{port}.log"
        with log_path.open(
            "wb"
        ) as sink:  # a file, not a pipe: an unread pipe would block the engine
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvgate.sim", *engine_args, *host_args, "--port", str(port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=REPO,
            )
        engine = SimProcess(proc, address, port, log_path)
        started.append(engine)
        if ready:
            wait_healthy(engine, timeout)
        return engine

    yield start
    for engine in started:
        if engine.proc.poll() is None:
            engine.proc.send_signal(signal.SIGTERM)
            try:
                engine.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                engine.proc.kill()
                engine.proc.wait(timeout=10)


GSM8K_DIR = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k"
).resolve()


@pytest.fixture(scope="session")
def local_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained on the GSM8K train set, saved as a tokenizer directory
    (tokenizer.json) in a temp dir: what `--tokenizer` loads, with nothing downloaded."""
    tokenizers = pytest.importorskip("tokenizers")
    import json

    rows = [
        json.loads(line)
        for line in (GSM8K_DIR / "train.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=["[UNK]"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((r["question"] + "\n" + r["answer"] for r in rows), trainer)
    directory = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(directory / "tokenizer.json"))
    return directory
