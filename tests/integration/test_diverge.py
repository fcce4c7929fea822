"""`kvgate diverge` against two kvgate.sim engines on 127.0.0.1: the A/A floor, a sound FP8
candidate that passes, and a long-context-collapse candidate flagged from the bucket at its
threshold (which GSM8K does not see: tests/integration/test_long_context.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
DATA = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k"
).resolve()
MODEL = "Qwen/Qwen3-8B"
CONTROL = ["vllm", "serve", MODEL, "--max-model-len", "8192"]
CANDIDATE = [*CONTROL, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"]
ENV = {"KVGATE_SIM_SPEED": "0.0005", "KVGATE_GSM8K_DIR": str(DATA)}


def diverge(control: str, candidate: str, *extra: str) -> tuple[int, dict[str, Any]]:
    argv = [
        sys.executable, "-m", "kvgate", "diverge",
        "--control-url", control + "/v1/completions",
        "--candidate-url", candidate + "/v1/completions",
        "--documents", "2", "--max-tokens", "6000", "--data-dir", str(DATA), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    return done.returncode, json.loads(lines[0])


def by_bucket(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["bucket"]: row for row in summary["buckets"]}


def test_sound_fp8_candidate_passes_above_its_floor(sim: Any) -> None:
    control = sim(CONTROL, env=ENV)
    candidate = sim(CANDIDATE, env=ENV)
    code, summary = diverge(control.url, candidate.url)
    assert (code, summary["verdict"], summary["error"]) == (0, "pass", None)
    assert summary["kind"] == "kvgate.diverge/summary"
    rows = by_bucket(summary)
    assert list(rows) == ["0-512", "512-1024", "1024-2048", "2048-4096", "4096-8192"]
    for row in rows.values():
        floor, cand = row["floor"], row["candidate"]
        # the control is not bit-identical with itself (jitter), and FP8 adds a little more
        assert 0 < floor["mean_kl"] < cand["mean_kl"] < row["kl_limit"]
        assert cand["top1_agreement"] > 0.9 and not row["flagged"]


def test_long_context_collapse_is_flagged_from_the_threshold_bucket(sim: Any) -> None:
    control = sim(CONTROL, env=ENV)
    broken = sim(CANDIDATE, env={**ENV, "KVGATE_SIM_FAULTS": "long-context-collapse=4096"})
    code, summary = diverge(control.url, broken.url)
    assert (code, summary["verdict"]) == (1, "flag")
    assert summary["flagged_buckets"] == ["4096-8192"]
    assert summary["first_flagged"]["bucket"] == "4096-8192"
    rows = by_bucket(summary)
    assert not rows["2048-4096"]["flagged"]
    collapsed = rows["4096-8192"]
    assert collapsed["kl_ratio"] > 100
    assert set(collapsed["reasons"]) == {"kl_above_floor", "top1_disagreement_above_floor"}


def test_a_bit_identical_control_uses_the_minimum_floor(sim: Any) -> None:
    still = {**ENV, "KVGATE_SIM_LOGPROB_JITTER": "0"}
    control = sim(CONTROL, env=still)
    candidate = sim(CANDIDATE, env=still)
    code, summary = diverge(control.url, candidate.url, "--documents", "1")
    assert code == 0, summary
    for row in summary["buckets"]:
        assert row["floor"]["mean_kl"] == 0.0 and row["floor"]["top1_agreement"] == 1.0
        assert row["kl_limit"] == pytest.approx(10 * 1e-3)


def test_an_unreachable_arm_is_an_error(sim: Any) -> None:
    control = sim(CONTROL, env=ENV)
    code, summary = diverge(control.url, "http://127.0.0.1:9")
    assert (code, summary["verdict"]) == (4, "error")
    assert "candidate" in summary["error"]
