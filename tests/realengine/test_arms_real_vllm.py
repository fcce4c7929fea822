"""Two real vLLM 0.32 arms (BF16 and FP8 KV, side by side) of a shape no other test uses: what
kvgate reads from them, and how its accuracy gate judges them.

A tiny Llama with 3 layers, 8 heads, 4 KV heads and head_dim 32 (1,536 bytes of BF16 KV a
token: 8 MiB is not a whole number of the CPU build's 128-token blocks, so the rounding shows),
served with BF16 and with FP8 KV. For each, kvgate's three readings must agree with the
engine's own numbers: the startup log (`scan_log`: version, dtype, backend, KV tokens, max
concurrency, ready), the /metrics (`parse_metrics`: dtype and pool tokens), and `preflight`'s
prediction from the checkpoint alone (with the CPU build's block size).

Then the paired GSM8K eval (`kvgate eval`: lm-eval against both OpenAI servers): a random model
scores about 0 on both arms, and kvgate must say that no loss can be measured on it
(inconclusive, `control_below_floor`), never non-inferior. And the divergence screen on the
arms' real log-probs. The model's tokenizer is trained on GSM8K (the builder's default): the
screen sizes its GSM8K documents by the characters a token of one sample takes, and a tokenizer
trained on other text (the builder's word list) made that estimate twice too low: 1,024 tokens
asked, more than 2,048 sent, and the engine refused the document.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import GSM8K_DIR

import real_vllm
from kvgate.evidence.logs import scan_log
from kvgate.evidence.metrics import parse_metrics

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(1200)]

SHAPE: dict[str, Any] = {"arch": "llama", "layers": 3, "heads": 8, "kv_heads": 4, "head_dim": 32}
CPU_BLOCK = 128  # vllm/platforms/cpu.py: every non-MLA model on the CPU build


@pytest.fixture(scope="module")
def model(vllm_installed: None) -> Path:
    from tiny_model import cached

    return cached("tiny-llama-l3-h8-kv4-d32", **SHAPE)


@pytest.fixture(scope="module")
def predicted(model: Path) -> dict[str, Any]:
    """`kvgate preflight` on the checkpoint alone, for the pool the servers get."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "kvgate", "preflight", str(model), "--json",
            "--gpu-memory-gib", str(real_vllm.SMALL_POOL_BYTES / 2**30),
            "--max-model-len", str(real_vllm.MAX_MODEL_LEN),
            "--vllm-version", "0.32.0", "--block-size", str(CPU_BLOCK),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout))


@pytest.fixture(scope="module")
def arm_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arms")


@pytest.fixture(scope="module")
def arms(model: Path, arm_logs: Path) -> Iterator[dict[str, str]]:
    """{kv dtype: base URL} of the two servers, started at once (logs: vllm-DTYPE.log)."""
    with real_vllm.serve_side_by_side(model, arm_logs, ("auto", "fp8")) as urls:
        yield urls


@pytest.fixture(params=["auto", "fp8"])
def served(
    request: pytest.FixtureRequest, arms: dict[str, str], arm_logs: Path
) -> tuple[str, str, str]:
    """(kv dtype, startup log, /metrics) of one arm."""
    dtype = str(request.param)
    log = arm_logs / f"vllm-{dtype}.log"
    metrics = httpx.get(f"{arms[dtype]}/metrics", timeout=10).text
    return dtype, log.read_text(errors="replace"), metrics


def test_kvgate_reads_the_real_engine_as_it_is(
    served: tuple[str, str, str], predicted: dict[str, Any]
) -> None:
    dtype, log, metrics = served
    key = "bf16" if dtype == "auto" else "fp8"
    expected = predicted["vllm_pool"][key]

    snapshot = parse_metrics(metrics, "vllm")
    info = snapshot.cache_config
    assert (info["cache_dtype"], int(info["block_size"])) == (dtype, CPU_BLOCK), info
    tokens = int(info["kv_cache_size_tokens"])
    assert snapshot.kv_capacity_tokens == tokens == int(info["num_gpu_blocks"]) * CPU_BLOCK

    scan = scan_log(log)
    assert (scan.engine, scan.engine_version, scan.ready, scan.failed) == (
        "vllm",
        "0.32.0",
        True,
        False,
    )
    assert scan.kv_cache_dtype == dtype
    assert scan.attention_backend == "CPU_ATTN"  # from the platform: the engine logs none
    assert scan.capacity.kv_tokens == tokens
    # preflight's prediction from the checkpoint: the engine's own figures, rounding included
    assert expected["kv_tokens"] == tokens, (expected, tokens)
    assert expected["num_blocks"] == int(info["num_gpu_blocks"])
    assert scan.capacity.max_concurrency == pytest.approx(expected["max_concurrency"], abs=0.01)


def test_fp8_holds_what_preflight_says(predicted: dict[str, Any]) -> None:
    """Not exactly twice here: 8 MiB holds 42 blocks of BF16 and 85 of FP8."""
    pool = predicted["vllm_pool"]
    assert (pool["bf16"]["kv_tokens"], pool["fp8"]["kv_tokens"]) == (42 * 128, 85 * 128)


def test_the_eval_says_no_loss_can_be_measured_on_a_random_model(
    arms: dict[str, str], tmp_path: Path
) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "kvgate", "eval", "--json",
            "--control-url", f"{arms['auto']}/v1/completions",
            "--candidate-url", f"{arms['fp8']}/v1/completions",
            "--limit", "30", "--num-fewshot", "0", "--max-gen-toks", "32", "--margin", "0.1",
            "--output", str(tmp_path / "answers.jsonl"), "--data-dir", GSM8K_DIR,
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = next(line for line in lines if line.get("kind") == "kvgate.eval/summary")
    assert proc.returncode == 3, proc.stderr[-2000:]  # inconclusive
    assert (summary["verdict"], summary["reason"]) == ("inconclusive", "control_below_floor")
    assert summary["questions_used"] == 30 and summary["control"]["accuracy"] < 0.1, summary
    assert "cannot be measured" in summary["claim"], summary["claim"]


def test_the_divergence_screen_runs_on_real_numerics(arms: dict[str, str]) -> None:
    """`kvgate diverge`: the control's own repeat (the A/A floor) against the FP8 candidate, by
    context position, on the engines' real log-probs. Random weights flatten the distributions,
    so what is asserted is that the screen measured both comparisons on real numbers, not a
    verdict about FP8."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "kvgate", "diverge", "--json",
            "--control-url", f"{arms['auto']}/v1/completions",
            "--candidate-url", f"{arms['fp8']}/v1/completions",
            "--documents", "2", "--max-tokens", "1024", "--first-bucket", "256",
            "--data-dir", GSM8K_DIR,
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["kind"] == "kvgate.diverge/summary", summary
    assert summary["verdict"] in ("pass", "flag"), summary
    assert proc.returncode == (0 if summary["verdict"] == "pass" else 1), proc.stderr[-2000:]
    measured = [b for b in summary["buckets"] if b["candidate"]["positions"]]
    assert measured, summary
    for bucket in measured:
        # real numerics: the FP8 arm's log-probs differ from the BF16 control's somewhere
        assert bucket["floor"]["mean_kl"] is not None and bucket["candidate"]["mean_kl"] > 0, bucket


def _load_job(arms: dict[str, str], model: Path, work: Path, *tokenizer: str) -> dict[str, Any]:
    """`kvgate load-job` (inference-perf against both arms at once) at 8 concurrent; its
    summary line."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "kvgate", "load-job",
            "--control-url", arms["auto"], "--candidate-url", arms["fp8"], "--model", str(model),
            "--production-concurrency", "8", "--stages", "8", "--rounds", "1",
            "--prompt-tokens", "256", "--output-tokens", "64", "--work-dir", str(work),
            "--tokenizer-corpus", str(Path(GSM8K_DIR) / "train.jsonl"), *tokenizer,
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["kind"] == "kvgate.load/summary", proc.stdout[-2000:]
    assert proc.returncode == (0 if summary["verdict"] == "measured" else 4), proc.stderr[-2000:]
    return summary


def test_the_load_job_measures_real_arms_in_the_engines_tokens(
    arms: dict[str, str], model: Path, tmp_path: Path
) -> None:
    # WITH the served model's own tokenizer: every stage measured, in the engine's tokens (the
    # usage of each response; the counters' increase agrees with it, or the arm is an error)
    summary = _load_job(arms, model, tmp_path / "model", "--tokenizer", str(model))
    assert summary["verdict"] == "measured", json.dumps(summary)[:3000]
    for arm in ("control", "candidate"):
        (stage,) = summary[arm]["stages"]
        assert (stage["status"], stage["requests"]) == ("measured", 8), stage
        assert stage["outputTokensPerS"] > 0, stage
        # TPOT is measured (present); its median can read 0.0 ms on 2 busy cores, where the
        # client reads a burst of streamed chunks at one instant (seen once in a warm run)
        assert stage["tpotP50Ms"] is not None and stage["tpotP50Ms"] >= 0, stage


def test_a_load_tokenizer_that_is_not_the_served_models_fails_every_stage(
    arms: dict[str, str], model: Path, tmp_path: Path
) -> None:
    # WITH the word tokenizer kvgate.sim counts with (no --tokenizer): its 256-"token" prompts
    # are other lengths to the real model's BPE, and the engine's usage says so
    summary = _load_job(arms, model, tmp_path / "words")
    assert summary["verdict"] == "error", json.dumps(summary)[:3000]
    for arm in ("control", "candidate"):
        (stage,) = summary[arm]["stages"]
        assert stage["status"] == "error", stage
        (reason,) = stage["reasons"]
        assert re.fullmatch(
            r"prompts planned at 256 tokens reached the engine as [\d,]+( to [\d,]+)? \(its "
            r"usage\): the load tokenizer is not the served model's",
            reason,
        ), reason
