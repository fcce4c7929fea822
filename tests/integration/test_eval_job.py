"""`kvgate eval` end to end: real lm-eval against two kvgate.sim engines on 127.0.0.1.

The tests that start lm-eval are in the `lmeval` tier (`pytest --with-lmeval -m lmeval`).

Each test starts a control (BF16 KV) and a candidate engine, runs `python -m kvgate eval` as the
accuracy Job would, and checks the verdict, the exit code, the progress lines, the summary
contract and the per-question file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-8B"
DATA = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k"
).resolve()
CONTROL = ["vllm", "serve", MODEL, "--max-model-len", "8192"]
CANDIDATE = [*CONTROL, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"]
SIM_ENV = {
    "KVGATE_SIM_SPEED": "0.0005",
    "KVGATE_SIM_STARTUP_DELAY": "0",
    "KVGATE_GSM8K_DIR": str(DATA),
}


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One datasets cache for the module: the json builder then runs once, not per test.
    return tmp_path_factory.mktemp("hf-home")


def _eval(
    control_url: str,
    candidate_url: str,
    hf_home: Path,
    output: Path,
    *extra: str,
    model: str | None = MODEL,
) -> tuple[int, list[dict[str, Any]], str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "operator"),
        "HF_HOME": str(hf_home),
        "KVGATE_GSM8K_DIR": str(DATA),
    }
    argv = [
        sys.executable,
        "-m",
        "kvgate",
        "eval",
        "--control-url",
        control_url + "/v1/completions",
        "--candidate-url",
        candidate_url + "/v1/completions",
        *(["--model", model] if model else []),
        "--concurrency",
        "16",
        "--max-retries",
        "2",
        "--output",
        str(output),
        *extra,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-6000:]}"
    return done.returncode, lines, done.stderr


def _check_contract(summary: dict[str, Any]) -> None:
    assert summary["kind"] == "kvgate.eval/summary"
    for key in (
        "verdict",
        "error",
        "task",
        "margin",
        "confidence",
        "questions_used",
        "stopped_early",
        "looks",
        "control",
        "candidate",
        "paired",
        "largest_loss_ruled_out",
        "advice",
    ):
        assert key in summary, key
    if summary["paired"] is not None:
        assert set(summary["control"]) == {"correct", "n", "accuracy", "wilson95"}
        assert {"difference", "tango95", "mcnemar_p"} <= set(summary["paired"])
        assert "questions_needed" in summary["advice"]


def _start_pair(sim, candidate_env: dict[str, str]) -> tuple[Any, Any]:
    control = sim(CONTROL, {**SIM_ENV})
    candidate = sim(CANDIDATE, {**SIM_ENV, **candidate_env})
    return control, candidate


@pytest.mark.lmeval
def test_equal_arms_pass(sim, hf_home: Path, tmp_path: Path) -> None:
    control, candidate = _start_pair(sim, {"KVGATE_SIM_FP8_CHURN": "0", "KVGATE_SIM_FP8_LOSS": "0"})
    output = tmp_path / "questions.jsonl"
    started = time.monotonic()
    code, lines, stderr = _eval(
        control.url, candidate.url, hf_home, output, "--limit", "200", "--sequential"
    )
    elapsed = time.monotonic() - started
    summary = lines[-1]
    assert code == 0, stderr[-3000:]
    _check_contract(summary)
    assert summary["verdict"] == "pass"
    assert summary["paired"]["control_only"] == summary["paired"]["candidate_only"] == 0
    progress = lines[:-1]
    assert [p["kind"] for p in progress] == ["kvgate.eval/progress"] * summary["looks"]
    assert [p["questions"] for p in progress] == [50 * (i + 1) for i in range(len(progress))]
    # The per-question file holds every paired question and the summary, and `kvgate stats
    # --from` reads the same counts back.
    records = [json.loads(line) for line in output.read_text().splitlines()]
    questions = [r for r in records if r["kind"] == "kvgate.eval/question"]
    assert len(questions) == summary["questions_used"]
    assert len({q["prompt_hash"] for q in questions}) == len(questions)
    assert records[-1]["verdict"] == "pass"
    stats = subprocess.run(
        [sys.executable, "-m", "kvgate", "stats", "--from", str(output), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "operator")},
        check=True,
    )
    assert json.loads(stats.stdout)["both"] == summary["paired"]["both"]
    print(f"\nequal arms: {summary['questions_used']} questions in {elapsed:.1f} s")


@pytest.mark.lmeval
def test_ten_percent_flipped_answers_fail(sim, hf_home: Path, tmp_path: Path) -> None:
    control, candidate = _start_pair(sim, {"KVGATE_SIM_FP8_LOSS": "0.10"})
    code, lines, stderr = _eval(
        control.url, candidate.url, hf_home, tmp_path / "q.jsonl", "--limit", "200", "--sequential"
    )
    summary = lines[-1]
    assert code == 1, stderr[-3000:]
    _check_contract(summary)
    assert summary["verdict"] == "fail" and summary["error"] is None
    assert summary["paired"]["control_only"] > summary["paired"]["candidate_only"]
    assert summary["paired"]["difference"] < -0.02
    print(f"\nflipped: {summary['paired']} after {summary['looks']} look(s)")


@pytest.mark.lmeval
def test_garbage_answers_fail_at_the_first_look(sim, hf_home: Path, tmp_path: Path) -> None:
    control, candidate = _start_pair(sim, {"KVGATE_SIM_FAULTS": "garbage-answers"})
    # Without --model, each endpoint's one served model is used.
    code, lines, stderr = _eval(
        control.url,
        candidate.url,
        hf_home,
        tmp_path / "q.jsonl",
        "--limit",
        "200",
        "--sequential",
        model=None,
    )
    summary = lines[-1]
    assert code == 1, stderr[-3000:]
    assert summary["verdict"] == "fail"
    assert summary["looks"] == 1 and summary["questions_used"] == 50
    assert summary["stopped_early"] is True
    assert summary["candidate"]["correct"] == 0
    assert summary["arms"]["candidate"]["model"] == MODEL


@pytest.mark.lmeval
def test_candidate_crash_mid_run_is_an_error(sim, hf_home: Path, tmp_path: Path) -> None:
    control, candidate = _start_pair(sim, {"KVGATE_SIM_FAULTS": "crash-after=70"})
    code, lines, stderr = _eval(
        control.url, candidate.url, hf_home, tmp_path / "q.jsonl", "--limit", "200", "--sequential"
    )
    summary = lines[-1]
    assert code == 4, stderr[-3000:]
    _check_contract(summary)
    assert summary["verdict"] == "error"
    assert summary["error"].startswith("candidate endpoint")
    # The first look completed before the crash; its answers are reported, not judged.
    assert summary["looks"] == 1 and summary["questions_used"] == 50
    print(f"\ncrash: {summary['error']}")


# No lm-eval here: the endpoint check refuses the candidate first, so this stays in the fast tier.
def test_unreachable_candidate_is_an_error(sim, hf_home: Path, tmp_path: Path) -> None:
    control = sim(CONTROL, {**SIM_ENV})
    code, lines, _ = _eval(
        control.url, "http://127.0.0.1:9", hf_home, tmp_path / "q.jsonl", "--limit", "50"
    )
    assert code == 4
    assert lines[-1]["verdict"] == "error"
    assert "unreachable" in lines[-1]["error"] and lines[-1]["questions_used"] == 0


class _Malformed(BaseHTTPRequestHandler):
    """Lists the model, then answers every completion with HTTP 200 and a body that is not JSON."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(b'{"choices": [{"index": 0, "text": ')


@pytest.fixture
def malformed_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Malformed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.lmeval
def test_malformed_responses_are_an_error(
    sim, hf_home: Path, tmp_path: Path, malformed_server: str
) -> None:
    control = sim(CONTROL, {**SIM_ENV})
    code, lines, stderr = _eval(
        control.url, malformed_server, hf_home, tmp_path / "q.jsonl", "--limit", "20"
    )
    assert code == 4, stderr[-3000:]
    assert lines[-1]["verdict"] == "error"
    assert lines[-1]["error"].startswith("candidate endpoint")
    print(f"\nmalformed: {lines[-1]['error']}")
