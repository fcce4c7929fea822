"""Run inference-perf from the load venv as a subprocess, bounded in time, and judge it.

The tool's exit code is not trusted (it exits 0 on broken runs): the stages are judged from
the report files it leaves (`kvgate.load.report`). A run past its deadline is killed with
its whole process group (the tool starts worker processes) and its stages end `error`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from kvgate.load.config import LoadPlan, inference_perf_config
from kvgate.load.output import PER_REQUEST_FILE, read_output
from kvgate.load.report import VALIDATION_FILE, StageJudgement, judge_reports, stage_file
from kvgate.records.loadresult import OutputFigures

REPO = Path(__file__).resolve().parents[3]
LOAD_VENV = REPO / ".venv-load"  # made by `make loadenv`
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
LOG_TAIL_CHARS = 2000
INFERENCE_PERF_LOG = "inference-perf.log"  # in the run's work dir: the tool's output


class LoadToolMissing(RuntimeError):
    """inference-perf is not installed where it was looked for."""


def default_inference_perf(environ: Mapping[str, str] | None = None) -> Path:
    """KVGATE_INFERENCE_PERF, else the load venv's binary (`make loadenv`)."""
    environ = os.environ if environ is None else environ
    given = environ.get("KVGATE_INFERENCE_PERF", "").strip()
    return Path(given) if given else LOAD_VENV / "bin" / "inference-perf"


@dataclass(frozen=True)
class LoadRun:
    exit_code: int | None  # None: killed at the deadline
    stages: tuple[StageJudgement, ...]
    config_path: Path
    log_path: Path
    log_tail: str
    output: OutputFigures | None = None  # what the responses held (None: no per-request report)


def read_report_files(report_dir: Path, plan: LoadPlan) -> dict[str, str]:
    names = [stage_file(n) for n in range(len(plan.stages))] + [VALIDATION_FILE, PER_REQUEST_FILE]
    return {
        name: (report_dir / name).read_text() for name in names if (report_dir / name).is_file()
    }


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the tool's process group, SIGKILL it after 10 s if it lingers."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_load(
    plan: LoadPlan,
    work_dir: Path,
    *,
    timeout_s: float,
    inference_perf: Path | None = None,
) -> LoadRun:
    """Write the config into `work_dir`, run the tool (offline) and judge every stage."""
    binary = inference_perf or default_inference_perf()
    if not binary.is_file():
        raise LoadToolMissing(f"{binary}: inference-perf not found (run `make loadenv`)")
    work_dir.mkdir(parents=True, exist_ok=True)
    report_dir = Path(plan.report_dir)
    for name in read_report_files(report_dir, plan):
        (report_dir / name).unlink()  # a report left by an earlier run must not pass for this one
    config_path = work_dir / "inference-perf.yaml"
    config_path.write_text(yaml.safe_dump(inference_perf_config(plan), sort_keys=False))
    log_path = work_dir / INFERENCE_PERF_LOG
    child_env = {**os.environ, **OFFLINE}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--config_file", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,  # its own process group, so a kill takes the workers too
        )
        try:
            exit_code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            exit_code = None
    files = read_report_files(report_dir, plan)
    stages = judge_reports(plan, files)
    output = read_output(files.get(PER_REQUEST_FILE), plan.output_tokens)
    if exit_code != 0:
        why = (
            f"inference-perf killed after {timeout_s:g}s"
            if exit_code is None
            else f"inference-perf exited {exit_code}"
        )
        stages = tuple(
            replace(stage, status="error", reasons=(*stage.reasons, why)) for stage in stages
        )
    tail = log_path.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
    return LoadRun(exit_code, stages, config_path, log_path, tail, output)
