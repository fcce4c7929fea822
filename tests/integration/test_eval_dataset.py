"""`kvgate eval` resolves GSM8K before it contacts any arm (issue 24, item 2).

Without --data-dir / KVGATE_GSM8K_DIR the questions come from the Hub dataset openai/gsm8k,
read from the local Hugging Face cache (downloaded into it first unless offline). When that
cannot work the job says so in seconds, naming the dataset and the fix, exit 4, and neither
endpoint sees a request. The endpoints and the "hub" here are counting HTTP servers on
loopback, so a request that should not happen is seen, not guessed. The job runs in this
process (kvgate.cli.main), so the time printed is the job's own, without Python's imports
(bench/RESULTS-eval-dataset.md has the whole command's wall time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hf_cache_layout import add_to_cache
from kvgate.cli import main
from kvgate.evaluation.runner import GSM8K_REVISION, HF_FILES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-8B"


@dataclass
class Counting:
    """A loopback server that answers like an OpenAI endpoint and records every request."""

    url: str
    requests: list[str] = field(default_factory=list)


def _handler(seen: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_HEAD = _answer

    return Handler


@pytest.fixture
def servers() -> Iterator[dict[str, Counting]]:
    running = []
    out = {}
    for name in ("control", "candidate", "hub"):
        seen: list[str] = []
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(seen))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        running.append(server)
        out[name] = Counting(f"http://127.0.0.1:{server.server_address[1]}", seen)
    yield out
    for server in running:
        server.shutdown()
        server.server_close()


def _eval(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    servers: dict[str, Counting],
    **env: str,
) -> tuple[int, dict[str, Any], str, float]:
    """`kvgate eval` in this process, with no GSM8K directory and an empty HF cache."""
    for name in [*os.environ]:
        if name.startswith(("HF_", "HUGGINGFACE_", "KVGATE_GSM8K")) or name.endswith("_OFFLINE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = [
        "eval",
        "--control-url",
        servers["control"].url + "/v1/completions",
        "--candidate-url",
        servers["candidate"].url + "/v1/completions",
        "--limit",
        "20",
    ]
    started = time.monotonic()
    code = main(argv)
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines, f"no JSON on stdout (exit {code}):\n{err[-3000:]}"
    return code, lines[-1], err, took


def test_offline_without_gsm8k_names_the_dataset_and_contacts_no_endpoint(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    servers: dict[str, Counting],
) -> None:
    # GIVEN no GSM8K directory, an empty HF cache, HF_HUB_OFFLINE=1, and two endpoints that
    # would answer (the "hub" is a third server, so a hub request would be seen too)
    # WHEN the accuracy job runs
    code, summary, stderr, took = _eval(
        monkeypatch, capsys, tmp_path, servers, HF_HUB_OFFLINE="1", HF_ENDPOINT=servers["hub"].url
    )
    # THEN it ends in error, exit 4, naming the dataset and the next step, not an endpoint
    print(f"\noffline eval without GSM8K: exit {code} in {took:.2f} s: {summary['error']}")
    assert code == 4, stderr[-3000:]
    assert summary["verdict"] == "error" and summary["questions_used"] == 0
    error = summary["error"]
    assert error.startswith("GSM8K dataset openai/gsm8k")
    assert "KVGATE_GSM8K_DIR" in error and "--data-dir" in error and "Hub access" in error
    assert "HF_HUB_OFFLINE" in error
    assert "endpoint" not in error and servers["control"].url not in error
    # AND no request reached either endpoint or the hub; nothing was retried
    assert servers["control"].requests == [] and servers["candidate"].requests == []
    assert servers["hub"].requests == []
    assert "Retrying" not in stderr and "Traceback" not in stderr


def test_unreachable_hub_without_gsm8k_names_the_dataset(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    servers: dict[str, Counting],
) -> None:
    # GIVEN not offline, but the hub endpoint refuses connections (a closed loopback port)
    code, summary, stderr, took = _eval(
        monkeypatch, capsys, tmp_path, servers, HF_ENDPOINT="http://127.0.0.1:9"
    )
    print(f"\nunreachable hub, no GSM8K: exit {code} in {took:.2f} s: {summary['error']}")
    assert code == 4, stderr[-3000:]
    error = summary["error"]
    assert error.startswith("GSM8K dataset openai/gsm8k")
    assert "is unreachable (ConnectError" in error and "KVGATE_GSM8K_DIR" in error
    assert "endpoint" not in error
    assert servers["control"].requests == [] and servers["candidate"].requests == []


# What the refusal must not wait for: numpy and scipy (1-3 s to import under load, most of the
# command's time before), httpx (the divergence screen's client), lm-eval and datasets.
HEAVY = ("numpy", "scipy", "httpx", "lm_eval", "datasets")
_PROBE = (
    "import sys\n"
    "from kvgate.cli import main\n"
    "code = main(sys.argv[1:])\n"
    f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def test_the_refusal_comes_before_the_statistics_and_http_imports(
    tmp_path: Path, servers: dict[str, Counting]
) -> None:
    # GIVEN a fresh interpreter, offline, with no GSM8K anywhere
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVGATE_GSM8K"))}
    env.update(PYTHONPATH=str(REPO / "operator"), HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    url = servers["control"].url + "/v1/completions"
    argv = ["eval", "--limit", "20", "--control-url", url, "--candidate-url", url]
    # WHEN `kvgate eval` runs and refuses
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          env=env, timeout=60, cwd=tmp_path)  # fmt: skip
    # THEN the refusal (exit 4, naming the dataset) came before any of those modules loaded
    assert done.returncode == 4, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["error"].startswith("GSM8K dataset openai/")
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr[-3000:]
    assert servers["control"].requests == []


@pytest.mark.lmeval
@pytest.mark.timeout(300)
def test_offline_eval_reads_gsm8k_from_the_hf_cache(sim: Any, tmp_path: Path) -> None:
    """Real lm-eval over the Hub dataset's parquet files found in a local HF cache, offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = Path(
        os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k"
    ).resolve()
    files = {}
    for split, name in HF_FILES.items():
        rows = [json.loads(x) for x in (data / f"{split}.jsonl").read_text().splitlines() if x]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        files[name] = sink.getvalue().to_pybytes()
    home = tmp_path / "hf-home"
    add_to_cache(home / "hub", "openai/gsm8k", files, kind="dataset", commit=GSM8K_REVISION)
    sim_env = {"KVGATE_SIM_SPEED": "0.0005", "KVGATE_GSM8K_DIR": str(data)}
    control = sim(["vllm", "serve", MODEL, "--max-model-len", "8192"], sim_env)
    candidate = sim(["vllm", "serve", MODEL, "--max-model-len", "8192"], sim_env)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVGATE_GSM8K"))}
    env.update(PYTHONPATH=str(REPO / "operator"), HF_HOME=str(home), HF_HUB_OFFLINE="1")
    argv = [
        *(sys.executable, "-m", "kvgate", "eval", "--limit", "20", "--model", MODEL),
        *("--control-url", control.url + "/v1/completions"),
        *("--candidate-url", candidate.url + "/v1/completions"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["error"] is None, done.stderr[-3000:]
    assert summary["questions_used"] == 20 and summary["control"]["n"] == 20
    assert summary["settings"]["dataset"].startswith("openai/gsm8k (")
    assert summary["settings"]["data_dir"] is None
