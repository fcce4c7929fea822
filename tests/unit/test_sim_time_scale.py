"""Figures measured on a sped-up simulator say so (issue 40 item 4): the simulator exports its
time scale off real time, the load Job keeps it per arm, and the throughput gate's line and the
report's load section call their tok/s, TTFT and TPOT wall-clock figures of a faster engine.

(The demo's 1,362 tok/s and 0.7 ms TPOT for one user on an "L4" were such figures, unlabelled.)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from test_load_job_cli import ARGV, fake_runs, summary_line, tokenizer  # noqa: F401
from test_report_load import SUMMARY, rollout

from kvgate import report
from kvgate.cli import main
from kvgate.commands import load_job
from kvgate.evidence.metrics import parse_metrics
from kvgate.judge.throughput import assess_throughput
from kvgate.records.loadresult import ArmLoad, LoadSummary, sim_time_note, time_scale
from kvgate.records.status import LoadStatus
from kvgate.sim.metrics import TIME_SCALE, build_registry, render
from kvgate.spec.rollout import ThroughputGainGate

NOW = dt.datetime(2026, 12, 1, 10, 12, 30, tzinfo=dt.UTC)


class _Running(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("vllm:num_requests_running", "running", value=1)


@pytest.mark.parametrize(("speed", "scale"), [(0.01, 0.01), (1.0, None)])
def test_the_simulator_exports_its_time_scale_only_off_real_time(
    speed: float, scale: float | None
) -> None:
    text = render(build_registry(_Running(), speed)).decode()
    assert (TIME_SCALE in text) is (scale is not None)
    assert parse_metrics(text).time_scale == scale


def test_the_load_job_keeps_each_arms_time_scale(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    fake_runs(monkeypatch, {})
    monkeypatch.setattr(
        load_job,
        "_engine_now",
        lambda url: load_job.EngineNow(preemptions=0.0, waiting=0.0, time_scale=0.01),
    )
    assert main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")]) == 0
    summary = LoadSummary.from_dict(summary_line(capsys))
    assert summary.control is not None and summary.candidate is not None
    assert (summary.control.time_scale, summary.candidate.time_scale) == (0.01, 0.01)


def test_a_real_engine_has_no_time_scale() -> None:
    assert time_scale(ArmLoad(), ArmLoad(time_scale=None)) is None
    assert time_scale(ArmLoad(time_scale=1.0), None) is None
    assert time_scale(ArmLoad(time_scale=float("nan")), ArmLoad(time_scale=-1)) is None
    assert time_scale(ArmLoad(time_scale=0.01), ArmLoad(time_scale=0.02)) == 0.02


def test_the_note_says_how_much_faster_and_what_engine_time_is() -> None:
    note = sim_time_note(0.01)
    assert note.startswith("simulated engines at 100x real time (KVGATE_SIM_SPEED=0.01)")
    assert "tok/s are 100x lower and TTFT and TPOT 100x higher" in note


def _summary(scale: float | None) -> LoadSummary:
    assert SUMMARY.control is not None and SUMMARY.candidate is not None
    return dataclasses.replace(
        SUMMARY,
        control=dataclasses.replace(SUMMARY.control, time_scale=scale),
        candidate=dataclasses.replace(SUMMARY.candidate, time_scale=scale),
    )


@pytest.mark.parametrize("scale", [0.01, None])
def test_the_reports_load_section_says_so(scale: float | None) -> None:
    loaded = rollout(LoadStatus(attempt=1, throughput_gain=1.4, summary=_summary(scale)))
    text = report.render_text(loaded, now=NOW)
    html = report.render_html(loaded, now=NOW)
    label = "simulated, 100x real time, wall-clock figures"
    assert (label in text) is (scale is not None)
    assert (f"<h2>Load (inference-perf on both arms at once): {label}</h2>" in html) is (
        scale is not None
    )
    note = "simulated engines at 100x real time"
    assert (note in " ".join(text.split())) is (scale is not None)
    assert (note in html) is (scale is not None)


def test_the_throughput_gates_line_says_so() -> None:
    gate = ThroughputGainGate(min_ratio=1.0, max_concurrency=64)
    plain = assess_throughput(gate, _summary(None)).result.message
    assert plain.startswith("at production load 64: ") and "simulated" not in plain
    message = assess_throughput(gate, _summary(0.01)).result.message
    assert message == f"{plain}; {sim_time_note(0.01)}"
