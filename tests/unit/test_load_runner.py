"""The runner around inference-perf, with stand-in binaries that leave recorded reports."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
import yaml

from kvgate.load.config import LoadPlan, Stage
from kvgate.load.runner import LoadToolMissing, default_inference_perf, run_load

DATA = Path(__file__).resolve().parents[1] / "data" / "load"


def fake_tool(tmp_path: Path, script: str) -> Path:
    """An executable taking `--config_file X` like inference-perf; $REPORTS is X's storage path."""
    tool = tmp_path / "fake-inference-perf"
    tool.write_text(f'#!/bin/sh\nREPORTS=$(sed -n "s/^ *path: //p" "$2")\n{script}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def plan(tmp_path: Path) -> LoadPlan:
    return LoadPlan(
        base_url="http://127.0.0.1:1",
        model_name="Qwen/Qwen3-8B",
        tokenizer_dir="tok",
        report_dir=str(tmp_path / "reports"),
        stages=(Stage(1, 4), Stage(4, 8)),
        prompt_tokens=256,
        prompt_std_tokens=32,  # as tests/data/load/ok was recorded: normal(256, 32)
        output_tokens=32,
        num_workers=1,
    )


def test_reports_left_by_the_tool_are_judged_and_the_config_is_written(tmp_path: Path) -> None:
    tool = fake_tool(tmp_path, f'mkdir -p "$REPORTS" && cp {DATA}/ok/*.json "$REPORTS"/')
    run = run_load(plan(tmp_path), tmp_path / "work", timeout_s=30, inference_perf=tool)
    assert run.exit_code == 0 and all(s.status == "measured" for s in run.stages)
    written = yaml.safe_load(run.config_path.read_text())
    assert written["storage"]["local_storage"]["path"] == str(tmp_path / "reports")
    assert written["load"]["num_workers"] == 1


def test_a_failing_exit_makes_every_stage_an_error_even_with_clean_reports(tmp_path: Path) -> None:
    tool = fake_tool(
        tmp_path, f'mkdir -p "$REPORTS" && cp {DATA}/ok/*.json "$REPORTS"/; echo boom; exit 3'
    )
    run = run_load(plan(tmp_path), tmp_path / "work", timeout_s=30, inference_perf=tool)
    assert run.exit_code == 3 and not all(s.status == "measured" for s in run.stages)
    assert all(stage.reasons[-1] == "inference-perf exited 3" for stage in run.stages)
    assert "boom" in run.log_tail


def test_reports_of_an_earlier_run_do_not_pass_for_this_one(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in ("stage_0_lifecycle_metrics.json", "stage_1_lifecycle_metrics.json"):
        (reports / name).write_text((DATA / "ok" / name).read_text())
    run = run_load(
        plan(tmp_path),
        tmp_path / "work",
        timeout_s=30,
        inference_perf=fake_tool(tmp_path, "exit 0"),
    )
    assert run.exit_code == 0
    assert [stage.reasons for stage in run.stages] == [
        ("no report stage_0_lifecycle_metrics.json",),
        ("no report stage_1_lifecycle_metrics.json",),
    ]


def test_a_run_past_its_deadline_is_killed_with_its_workers(tmp_path: Path) -> None:
    worker_pid = tmp_path / "worker.pid"
    tool = fake_tool(tmp_path, f"sleep 60 & echo $! > {worker_pid}; sleep 60")
    run = run_load(plan(tmp_path), tmp_path / "work", timeout_s=0.5, inference_perf=tool)
    assert run.exit_code is None
    assert run.stages[0].reasons[-1] == "inference-perf killed after 0.5s"
    pid = int(worker_pid.read_text())
    for _ in range(100):  # the orphaned worker is reaped by init shortly after its SIGTERM
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"worker {pid} outlived the deadline")


def test_a_missing_tool_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(
        LoadToolMissing, match=r"nowhere: inference-perf not found \(run `make loadenv`\)"
    ):
        run_load(plan(tmp_path), tmp_path, timeout_s=1, inference_perf=tmp_path / "nowhere")
    assert default_inference_perf({"KVGATE_INFERENCE_PERF": "/opt/ip"}) == Path("/opt/ip")
    assert default_inference_perf({}).parts[-3:] == (".venv-load", "bin", "inference-perf")
