"""inference-perf (the load venv's, `make loadenv`) against `kvgate.sim` on 127.0.0.1.

Its figures are parsed from its own report files and checked against what the engine
counted; an unreachable arm and an arm killed mid-run both end `error` although the tool
exits 0.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate.load.config import LoadPlan, Stage
from kvgate.load.runner import LoadRun, default_inference_perf, run_load
from kvgate.load.tokenizer import build_word_tokenizer

REPO = Path(__file__).resolve().parents[2]
GSM8K_DIR = Path(os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.load,
    pytest.mark.tools,
    # Under CI a missing load venv is a failure (make test builds it), never a silent skip.
    pytest.mark.skipif(
        not default_inference_perf().is_file()
        and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
        reason=f"{default_inference_perf()} missing: run `make loadenv`",
    ),
]

ENGINE = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"]
RUN_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def simword(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_tokenizer(GSM8K_DIR / "train.jsonl", tmp_path_factory.mktemp("tok") / "w")


def plan_for(
    url: str, tokenizer: Path, reports: Path, stages: tuple[Stage, ...], out: int
) -> LoadPlan:
    return LoadPlan(
        base_url=url,
        model_name="Qwen/Qwen3-8B",
        tokenizer_dir=str(tokenizer),
        report_dir=str(reports),
        stages=stages,
        prompt_tokens=256,
        prompt_std_tokens=32,
        output_tokens=out,
        num_workers=1,
        request_timeout_s=20.0,
        stage_grace_s=5.0,
        interval_s=0.5,
    )


def counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


def test_inference_perf_measures_the_simulator_and_the_counts_agree(
    sim: Callable[..., Any], simword: Path, tmp_path: Path
) -> None:
    engine = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.01"})
    plan = plan_for(engine.url, simword, tmp_path / "reports", (Stage(1, 4), Stage(4, 8)), 32)
    run = run_load(plan, tmp_path, timeout_s=RUN_TIMEOUT_S)
    assert run.exit_code == 0, run.log_tail
    assert [stage.status for stage in run.stages] == ["measured", "measured"], run.stages
    results = [stage.measured for stage in run.stages]
    assert all(result is not None for result in results)
    first, second = results[0], results[1]
    assert first is not None and second is not None
    assert (first.concurrency, first.successes, second.concurrency, second.successes) == (
        1,
        4,
        4,
        8,
    )
    assert first.output_tokens_total == 4 * 32 and second.output_tokens_total == 8 * 32
    assert first.output_tokens_min == second.output_tokens_min == 32
    # the engine counted the same tokens the tool reports (its prompts are the tool's random text)
    assert counter(engine.url, "vllm:generation_tokens_total") == 12 * 32
    assert counter(engine.url, "vllm:prompt_tokens_total") == (
        first.prompt_tokens_total + second.prompt_tokens_total
    )
    assert first.token_count_mismatches == second.token_count_mismatches == 0
    for result in results:
        assert result is not None and result.ttft_s is not None and result.tpot_s is not None
        assert 0 < result.ttft_s.p50 <= result.ttft_s.p99
        assert 0 < result.tpot_s.p50 <= result.tpot_s.p99
        assert result.output_tokens_per_s > 0


def test_an_unreachable_arm_exits_0_and_is_judged_error(simword: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    plan = plan_for(url, simword, tmp_path / "reports", (Stage(2, 4),), 16)
    run = run_load(plan, tmp_path, timeout_s=RUN_TIMEOUT_S)
    assert run.exit_code == 0  # the tool calls this a success
    (stage,) = run.stages
    assert stage.status == "error" and stage.measured is None
    assert "4 of 4 requests failed (Connection Error: 4)" in stage.reasons


def test_an_arm_killed_mid_run_is_judged_error(
    sim: Callable[..., Any], simword: Path, tmp_path: Path
) -> None:
    engine = sim(ENGINE, env={"KVGATE_SIM_SPEED": "0.05"})
    plan = plan_for(
        engine.url, simword, tmp_path / "reports", (Stage(1, 2), Stage(2, 8), Stage(2, 16)), 64
    )
    outcome: list[LoadRun] = []
    runner = threading.Thread(
        target=lambda: outcome.append(run_load(plan, tmp_path, timeout_s=RUN_TIMEOUT_S))
    )
    runner.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and runner.is_alive():
        try:
            if counter(engine.url, "vllm:request_success_total") >= 4:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    engine.proc.kill()  # SIGKILL, as when the node or the OOM killer takes the pod
    runner.join(RUN_TIMEOUT_S + 30)
    (run,) = outcome
    assert run.exit_code == 0
    first, *later = run.stages
    assert first.status == "measured"
    assert later[-1].status == "error" and later[-1].measured is None
    assert any("requests failed" in reason for reason in later[-1].reasons)


def test_a_run_past_its_deadline_is_killed_and_judged_error(simword: Path, tmp_path: Path) -> None:
    plan = plan_for("http://127.0.0.1:1", simword, tmp_path / "reports", (Stage(1, 1),), 8)
    run = run_load(plan, tmp_path, timeout_s=1.0)
    assert run.exit_code is None
    (stage,) = run.stages
    assert stage.status == "error"
    assert stage.reasons == (
        "no report stage_0_lifecycle_metrics.json",
        "inference-perf killed after 1s",
    )
