"""`kvgate load-job` against two `kvgate.sim` arms on 127.0.0.1 (inference-perf from the load venv).

The program's contract is its stdout: JSON lines, the last one the `kvgate.load/summary`
(carrying the attempt's nonce), and its exit code. An unreachable arm and an arm killed
mid-run end as `error` stages with exit 4, although inference-perf itself exits 0.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kvgate.judge.throughput import assess_throughput
from kvgate.load.runner import default_inference_perf
from kvgate.reasons import Reason
from kvgate.records.loadresult import (
    PROGRESS_KIND,
    SUMMARY_KIND,
    LoadSummary,
    LoadVerdict,
    StageStatus,
)
from kvgate.spec.rollout import ThroughputGainGate
from kvgate.vocabulary import Outcome

REPO = Path(__file__).resolve().parents[2]
GSM8K_DIR = Path(os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.load,
    pytest.mark.tools,
    pytest.mark.skipif(
        not default_inference_perf().is_file()
        and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
        reason=f"{default_inference_perf()} missing: run `make loadenv`",
    ),
]

ENGINE = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"]
FP8 = [*ENGINE, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"]  # no JIT on an L4
NONCE = "nonce-for-this-attempt"
TIMEOUT_S = 300.0


def load_job(
    control: str, candidate: str, tmp_path: Path, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "operator"), os.environ.get("PYTHONPATH")])
        ),
        "KVGATE_LOAD_NONCE": NONCE,
        "KVGATE_GSM8K_DIR": str(GSM8K_DIR),
        "KVGATE_INFERENCE_PERF": str(default_inference_perf()),
    }
    argv = [
        sys.executable, "-m", "kvgate", "load-job",
        "--control-url", control,
        "--candidate-url", candidate,
        "--model", "Qwen/Qwen3-8B",
        "--production-concurrency", "2",
        "--max-concurrency", "8",
        "--prompt-tokens", "256",
        "--output-tokens", "32",
        "--request-timeout", "20",
        "--timeout", "240",
        "--work-dir", str(tmp_path / "work"),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        argv,
        stdout=(tmp_path / "stdout").open("wb"),
        stderr=(tmp_path / "stderr").open("wb"),
        env=env,
        cwd=tmp_path,
    )


def finish(proc: subprocess.Popen[bytes], tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    code = proc.wait(TIMEOUT_S)
    lines = [json.loads(line) for line in (tmp_path / "stdout").read_text().splitlines()]
    assert lines, (tmp_path / "stderr").read_text()[-3000:]
    return code, lines


def summary_of(lines: list[dict[str, Any]]) -> LoadSummary:
    last = lines[-1]
    assert last["kind"] == SUMMARY_KIND and last["nonce"] == NONCE
    assert all(line["kind"] == PROGRESS_KIND for line in lines[:-1])
    summary = LoadSummary.from_dict(last)
    assert LoadSummary.from_dict(summary.to_dict()) == summary
    return summary


def dead_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def successes(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:request_success_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    )


def test_both_arms_measured_at_every_stage(sim: Callable[..., Any], tmp_path: Path) -> None:
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    candidate = sim(FP8, env={"KVGATE_SIM_SPEED": "0.01"})
    code, lines = finish(load_job(control.url, candidate.url, tmp_path), tmp_path)
    summary = summary_of(lines)
    assert code == 0, summary
    assert summary.verdict is LoadVerdict.MEASURED and summary.error is None
    assert (summary.production_concurrency, summary.prompt_tokens, summary.output_tokens) == (
        2,
        256,
        32,
    )
    assert summary.num_workers == 1
    for arm in (summary.control, summary.candidate):
        assert arm is not None and arm.error is None and arm.reachable_after is True
        assert arm.exit_code == 0
        # production's concurrency first, then the sweep upward to the cap
        assert [s.concurrency for s in arm.stages] == [2, 1, 8]
        assert [s.requests for s in arm.stages] == [4, 2, 16]
        for stage in arm.stages:
            assert stage.status is StageStatus.MEASURED, stage.reasons
            assert stage.successes == stage.requests and stage.failures == 0
            assert stage.output_tokens_per_s is not None and stage.output_tokens_per_s > 0
            assert stage.ttft_p50_ms is not None and stage.ttft_p99_ms is not None
            assert 0 < stage.ttft_p50_ms <= stage.ttft_p99_ms
            assert stage.tpot_p50_ms is not None and stage.tpot_p99_ms is not None
            assert 0 < stage.tpot_p50_ms <= stage.tpot_p99_ms
            assert stage.goodput_percent is None  # no SLO given: inference-perf counts none
    # each arm was sent exactly what was planned (4 + 2 + 16 requests), and the prefix probe's
    # two before them
    assert successes(control.url) == successes(candidate.url) == 22 + 2
    # the engines' own preemption counters were read before and after: a small load on a
    # pool with room preempts nothing
    assert summary.control is not None and summary.candidate is not None
    assert summary.control.preemptions == summary.candidate.preemptions == 0.0
    # the clients counted with the word tokenizer (no tokenizer for the served model here) and
    # the engines' own token counters agreed with them, or the arms would be errors
    assert lines[0]["tokenizer"].startswith("the word tokenizer that counts as kvgate.sim does")
    stage_lines = [line for line in lines if line.get("event") == "stage"]
    assert {(line["arm"], line["concurrency"]) for line in stage_lines} == {
        (arm, c) for arm in ("control", "candidate") for c in (2, 1, 8)
    }


def test_each_stage_says_what_it_did_to_each_engine(
    sim: Callable[..., Any], tmp_path: Path
) -> None:
    # GIVEN pools sized so that 8 requests of 256 + 200 tokens overflow BF16's (1,968 tokens)
    # and fit FP8's (3,936), paced so that a stage lasts seconds (the Job scrapes once a second)
    small = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "1024",
             "--gpu-memory-utilization", "0.786"]  # fmt: skip
    env = {"KVGATE_SIM_SPEED": "0.1"}
    control = sim(small, env=env)
    candidate = sim(
        [*small, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"], env=env
    )
    proc = load_job(control.url, candidate.url, tmp_path, ("--output-tokens", "200"))
    code, lines = finish(proc, tmp_path)
    summary = summary_of(lines)
    assert code == 0, summary
    assert summary.control is not None and summary.candidate is not None
    at = {
        (arm, s.concurrency): s
        for arm, load in (("control", summary.control), ("candidate", summary.candidate))
        for s in load.stages
    }
    # THEN BF16 runs out of room at 8 (it preempts), FP8 holds them all; at 1 and 2 neither
    assert (at["control", 8].preemptions or 0) > 0, at["control", 8]
    assert at["candidate", 8].preemptions == 0
    for arm in ("control", "candidate"):
        for level in (1, 2):
            assert at[arm, level].preemptions == 0
        for level in (1, 2, 8):  # a request can wait a step for admission, even with room
            assert 0 <= (at[arm, level].max_waiting or 0) <= level
    # the stages' counts add up to the whole load's (read before the first, after the last)
    assert sum(s.preemptions or 0 for s in summary.control.stages) == summary.control.preemptions


def test_a_tokenizer_that_is_not_the_engines_makes_every_stage_an_error(
    sim: Callable[..., Any], tmp_path: Path, local_tokenizer: Path
) -> None:
    # GIVEN clients making prompts with a BPE tokenizer while the engines count words
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    candidate = sim(FP8, env={"KVGATE_SIM_SPEED": "0.01"})
    extra = ["--tokenizer", str(local_tokenizer), "--stages", "2"]
    code, lines = finish(load_job(control.url, candidate.url, tmp_path, extra), tmp_path)
    # THEN every request ran, yet no stage is a measurement: the engine counted the prompts
    # otherwise than planned, both lengths named
    summary = summary_of(lines)
    assert code == 4 and summary.verdict is LoadVerdict.ERROR
    assert lines[0]["tokenizer"] == f"the model's: {local_tokenizer}"
    for arm in (summary.control, summary.candidate):
        assert arm is not None
        assert [stage.status for stage in arm.stages] == [StageStatus.ERROR]
        (reason,) = arm.stages[0].reasons
        assert re.fullmatch(
            r"prompts planned at [\d,]+ tokens reached the engine as [\d,]+( to [\d,]+)? "
            r"\(its usage\): the load tokenizer is not the served model's",
            reason,
        ), reason


def test_the_slos_reach_inference_perf_and_its_goodput_comes_back(
    sim: Callable[..., Any], tmp_path: Path
) -> None:
    # A TTFT bound every request meets and a TPOT bound none can (a microsecond): inference-perf
    # counts goodput per stage, and 0% is a measured figure, not a missing one.
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    candidate = sim(FP8, env={"KVGATE_SIM_SPEED": "0.01"})
    slo = ["--stages", "2", "--slo-ttft-ms", "600000", "--slo-tpot-ms", "0.001"]
    code, lines = finish(load_job(control.url, candidate.url, tmp_path, slo), tmp_path)
    summary = summary_of(lines)
    assert code == 0, summary
    config = yaml.safe_load((tmp_path / "work" / "control" / "inference-perf.yaml").read_text())
    assert config["report"]["goodput"] == {"constraints": {"ttft": 600.0, "tpot": 1e-06}}
    for arm in (summary.control, summary.candidate):
        assert arm is not None and [s.concurrency for s in arm.stages] == [2]
        (stage,) = arm.stages
        assert stage.status is StageStatus.MEASURED, stage.reasons
        assert stage.goodput_percent == 0.0


def test_an_unreachable_arm_is_an_error_although_the_tool_exits_0(
    sim: Callable[..., Any], tmp_path: Path
) -> None:
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    code, lines = finish(load_job(control.url, dead_url(), tmp_path, ["--stages", "2"]), tmp_path)
    summary = summary_of(lines)
    assert code == 4
    assert summary.verdict is LoadVerdict.ERROR
    assert summary.control is not None and summary.candidate is not None
    assert [s.status for s in summary.control.stages] == [StageStatus.MEASURED]
    (stage,) = summary.candidate.stages
    assert summary.candidate.exit_code == 0  # inference-perf called it a success
    assert stage.status is StageStatus.ERROR and stage.output_tokens_per_s is None
    assert "4 of 4 requests failed (Connection Error: 4)" in stage.reasons
    assert summary.candidate.reachable_after is False
    assert summary.error is not None and summary.error.startswith(
        "candidate: the arm did not answer after the run (0 of 1 stages measured)"
    )


def test_an_arm_killed_mid_run_is_an_error(sim: Callable[..., Any], tmp_path: Path) -> None:
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.05"})
    candidate = sim(FP8, env={"KVGATE_SIM_SPEED": "0.05"})
    proc = load_job(control.url, candidate.url, tmp_path, ["--output-tokens", "64"])
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if successes(candidate.url) >= 2 + 4:  # the prefix probe and the production stage
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    candidate.proc.kill()  # SIGKILL, as when the node or the OOM killer takes the pod
    code, lines = finish(proc, tmp_path)
    summary = summary_of(lines)
    assert code == 4
    assert summary.verdict is LoadVerdict.ERROR
    assert summary.control is not None and summary.candidate is not None
    assert all(s.measured for s in summary.control.stages)
    first, *later = summary.candidate.stages
    assert first.measured
    assert later[-1].status is StageStatus.ERROR and later[-1].output_tokens_per_s is None
    assert summary.candidate.reachable_after is False
    assert summary.error is not None and "candidate: the arm did not answer" in summary.error


def test_doubled_tokens_and_a_lost_prefix_cache_are_measured_per_arm(
    sim: Callable[..., Any], tmp_path: Path
) -> None:
    # GIVEN a sound BF16 control and an FP8 candidate that doubles every second token and runs
    # without prefix caching (the simulator's faults touch the quantized arm only)
    control = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    faults = {"KVGATE_SIM_SPEED": "0.01", "KVGATE_SIM_FAULTS": "duplicate-tokens,no-prefix-caching"}
    candidate = sim(FP8, env=faults)
    code, lines = finish(load_job(control.url, candidate.url, tmp_path), tmp_path)
    summary = summary_of(lines)
    # THEN the run itself is a measurement (the usage is what was asked): only the output says
    assert code == 0 and summary.verdict is LoadVerdict.MEASURED, summary
    assert summary.control is not None and summary.candidate is not None
    mine, theirs = summary.candidate.output, summary.control.output
    assert mine is not None and theirs is not None
    assert mine.requests == theirs.requests == 22  # every successful request was read
    assert mine.pieces == theirs.pieces == 22 * 32  # one piece per token, as vLLM streams
    assert mine.wrong_length == theirs.wrong_length == 0
    assert theirs.repeated_share is not None and theirs.repeated_share < 0.05
    assert mine.repeated_share is not None and mine.repeated_share > 0.45  # 1 of every 2
    # the probe: the control's second send hit its first's blocks, the candidate's nothing
    probe_c, probe_k = summary.control.prefix_cache, summary.candidate.prefix_cache
    assert probe_c is not None and probe_k is not None
    assert probe_c.error is None and probe_k.error is None
    assert probe_c.enabled is True and probe_k.enabled is False
    assert probe_c.hits is not None and probe_c.hits >= 16 * 8 and probe_c.hit_rate
    assert (probe_k.queries, probe_k.hits) == (0.0, 0.0)  # vLLM counts nothing with it off
    # AND the throughput gate refuses the candidate with its own reason, whatever it measured
    finding = assess_throughput(ThroughputGainGate(min_ratio=0.01), summary)
    assert finding.result.reason is Reason.OUTPUT_DEGENERATE, finding.result
    assert finding.result.outcome is Outcome.FAILED
    sound_output = replace(summary.candidate, output=theirs)
    only_cold = assess_throughput(
        ThroughputGainGate(min_ratio=0.01), replace(summary, candidate=sound_output)
    )
    assert only_cold.result.reason is Reason.PREFIX_CACHE_OFF, only_cold.result
