"""`kvgate eval` with the long-context needle task: real lm-eval against two kvgate.sim engines.

A candidate whose FP8 KV cache collapses past 3,000 cached tokens passes GSM8K (its prompts are
about a thousand tokens) and is failed by the long-context task at the 4,096 bucket only; a
sound FP8 candidate passes both. Prompts are sized with a BPE tokenizer trained locally on the
GSM8K train set (the `local_tokenizer` fixture); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lmeval, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
DATA = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k"
).resolve()
MODEL = "Qwen/Qwen3-8B"
CONTROL = ["vllm", "serve", MODEL, "--max-model-len", "8192"]
CANDIDATE = [*CONTROL, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"]
ENV = {"KVGATE_SIM_SPEED": "0.0005", "KVGATE_GSM8K_DIR": str(DATA)}


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-home")


def evaluate(
    control: str, candidate: str, tokenizer: Path, hf_home: Path
) -> tuple[int, dict[str, Any]]:
    argv = [
        sys.executable, "-m", "kvgate", "eval",
        "--control-url", control + "/v1/completions",
        "--candidate-url", candidate + "/v1/completions",
        "--model", MODEL, "--limit", "200", "--margin", "0.05", "--concurrency", "16",
        "--max-retries", "2",
        "--long-context-tasks", "niah_single_1", "--context-lengths", "2048,4096",
        "--long-context-items", "30", "--long-context-margin", "0.15",
        "--tokenizer", str(tokenizer),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "operator"),
        "HF_HOME": str(hf_home),
        "KVGATE_GSM8K_DIR": str(DATA),
    }
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=280, cwd=REPO)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr[-4000:]
    return done.returncode, lines[-1]


def buckets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["bucket"]: row for row in summary["long_context"]["buckets"]}


def test_collapse_past_3000_tokens_passes_gsm8k_and_fails_the_4096_bucket(
    sim: Any, local_tokenizer: Path, hf_home: Path
) -> None:
    control = sim(CONTROL, env=ENV)
    broken = sim(CANDIDATE, env={**ENV, "KVGATE_SIM_FAULTS": "long-context-collapse=3000"})
    code, summary = evaluate(control.url, broken.url, local_tokenizer, hf_home)
    # GSM8K alone is blind: its keys are unchanged and say pass
    assert (summary["kind"], summary["task"], summary["verdict"]) == (
        "kvgate.eval/summary",
        "gsm8k",
        "pass",
    )
    assert summary["reason"] == "noninferior" and summary["bounds"]["lower"] > -0.05
    lc = summary["long_context"]
    assert (lc["verdict"], lc["failing_bucket"], lc["error"]) == ("fail", "4096", None)
    rows = buckets(summary)
    assert rows["2048"]["verdict"] == "pass"
    assert rows["2048"]["control"]["n"] == rows["2048"]["candidate"]["n"] == 30
    collapsed = rows["4096"]
    assert collapsed["reason"] == "worse_than_margin"
    assert collapsed["candidate"]["accuracy"] < 0.1 < 0.9 < collapsed["control"]["accuracy"]
    assert collapsed["recovery"] < 0.95 and collapsed["bounds"]["upper"] < -0.15
    assert summary["overall"] == {
        "verdict": "fail",
        "task": "long_context",
        "reason": "worse_than_margin",
        "bucket": "4096",
        "tasks": [
            {"task": "gsm8k", "verdict": "pass", "reason": "noninferior"},
            {"task": "long_context", "verdict": "fail", "reason": "worse_than_margin",
             "bucket": "4096"},
        ],
    }  # fmt: skip
    assert code == 1


def test_sound_fp8_candidate_passes_every_bucket(
    sim: Any, local_tokenizer: Path, hf_home: Path
) -> None:
    control = sim(CONTROL, env=ENV)
    candidate = sim(CANDIDATE, env=ENV)
    code, summary = evaluate(control.url, candidate.url, local_tokenizer, hf_home)
    assert summary["verdict"] == "pass"
    lc = summary["long_context"]
    assert (lc["verdict"], lc["failing_bucket"]) == ("pass", None)
    assert lc["context_lengths"] == [2048, 4096] and lc["tasks"] == ["niah_single_1"]
    for row in lc["buckets"]:
        assert row["verdict"] == "pass" and row["recovery"] >= 0.95
        assert row["bounds"]["lower"] > -0.15
    assert summary["overall"]["verdict"] == "pass" and code == 0


def test_task_none_runs_long_context_alone_without_gsm8k(
    sim: Any, local_tokenizer: Path, hf_home: Path
) -> None:
    """`--task none`: no GSM8K on disk, offline; the long-context verdict is the run's."""
    control = sim(CONTROL, env=ENV)
    broken = sim(CANDIDATE, env={**ENV, "KVGATE_SIM_FAULTS": "long-context-collapse=3000"})
    argv = [
        sys.executable, "-m", "kvgate", "eval", "--task", "none",
        "--control-url", control.url + "/v1/completions",
        "--candidate-url", broken.url + "/v1/completions",
        "--model", MODEL, "--concurrency", "16", "--max-retries", "2",
        "--long-context-tasks", "niah_single_1", "--context-lengths", "2048,4096",
        "--long-context-items", "30", "--long-context-margin", "0.15",
        "--tokenizer", str(local_tokenizer),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KVGATE_GSM8K_DIR"}
    env.update(PYTHONPATH=str(REPO / "operator"), HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=280, cwd=REPO)
    summary = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 1, done.stderr[-3000:]
    assert (summary["task"], summary["verdict"], summary["questions_used"]) == ("none", "fail", 0)
    assert summary["long_context"]["failing_bucket"] == "4096"
    assert summary["overall"]["task"] == "long_context"
