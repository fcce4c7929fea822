"""The report's load section: throughput and TPOT against concurrency, production's load marked."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from kvgate import report
from kvgate.records.loadresult import ArmLoad, LoadSummary, LoadVerdict, StagePoint, StageStatus
from kvgate.records.status import ClockRecord, ClocksRecord, LoadStatus, RolloutStatus

OOM = "40 of 128 requests failed (Server Error: 40)"


def ok(concurrency: int, tok_s: float, tpot_ms: float) -> StagePoint:
    return StagePoint(
        concurrency=concurrency, status=StageStatus.MEASURED, output_tokens_per_s=tok_s,
        tpot_p50_ms=tpot_ms, ttft_p99_ms=900.0,
    )  # fmt: skip


ERR = StagePoint(concurrency=64, status=StageStatus.ERROR, reasons=(OOM,))
SUMMARY = LoadSummary(
    verdict=LoadVerdict.PARTIAL,
    production_concurrency=64,
    control=ArmLoad(stages=(ERR, ok(1, 61.0, 16.4), ok(8, 410.0, 19.5), ok(32, 1558.0, 20.5))),
    candidate=ArmLoad(
        stages=(ok(64, 2192.0, 29.2), ok(1, 59.0, 16.9), ok(8, 398.0, 20.1), ok(32, 1512.0, 21.1))
    ),
)


def rollout(load: LoadStatus | None) -> dict[str, Any]:
    status = RolloutStatus(load=load).to_dict()
    return {"metadata": {"name": "r", "namespace": "ns"}, "spec": {}, "status": status}


LOADED = rollout(LoadStatus(attempt=1, throughput_gain=1.4069, best_gain=1.4069, summary=SUMMARY))


def test_the_text_report_tabulates_both_arms_by_concurrency() -> None:
    text = report.render_text(LOADED)
    lines = text.splitlines()
    start = lines.index(
        "Load (inference-perf on both arms at once; tok/s and TPOT against concurrency)"
    )
    table = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 : start + 7]]
    assert table[0][:3] == ["concurrent", "control tok/s", "candidate tok/s"]
    body = [row for row in table if row[0][0].isdigit()]
    assert body == [
        ["1", "61", "59", "16.4", "16.9", "900", "900"],
        ["8", "410", "398", "19.5", "20.1", "900", "900"],
        ["32", "1,558", "1,512", "20.5", "21.1", "900", "900"],
        ["64 (production)", "error", "2,192", "error", "29.2", "error", "900"],
    ]
    assert "  throughput gain at production load 64: 1.41x" in lines
    assert f"  control at 64: {OOM}" in lines


def test_the_html_report_draws_both_curves_with_production_marked() -> None:
    html = report.render_html(LOADED)
    assert "<h2>Load (inference-perf on both arms at once)</h2>" in html
    svg = report.svg.render_load_svg(report.view_of({"status": LOADED["status"]}))
    assert svg in html
    root = ET.fromstring(svg)  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    # two panels, each with one line per arm (the control's joins its 3 measured stages)
    assert len(root.findall(f"{ns}polyline")) == 4
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert texts.count("production 64") == 2
    assert "Output tok/s against concurrency" in texts
    assert "TPOT p50 (ms) against concurrency" in texts
    # the control's error at 64 is drawn as an error, not as a point at zero
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert titles.count(f"control at 64: error: {OOM}") == 2
    assert "candidate at 64: 2,192.0" in titles and "control at 32: 1,558.0" in titles


def test_the_report_says_what_lengths_the_load_ran_and_where_they_were_read() -> None:
    # GIVEN a load whose request lengths came from production's histograms in Prometheus
    said = (
        "production's request lengths from Prometheus over 40 requests: prompt mean 1800, "
        "output mean 400 tokens"
    )
    loaded = rollout(LoadStatus(attempt=1, throughput_gain=1.4069, summary=SUMMARY, lengths=said))
    # THEN both reports say so under the load table
    text = " ".join(line.strip() for line in report.render_text(loaded).splitlines())
    assert said in text
    assert "<li>production&#x27;s request lengths from Prometheus over 40 requests" in (
        report.render_html(loaded)
    )
    assert "request lengths" not in report.render_text(LOADED)  # none recorded: none shown


def test_without_a_load_there_is_no_section() -> None:
    bare = rollout(None)
    assert report.svg.render_load_svg(report.view_of({"status": bare["status"]})) == ""
    assert "Load (" not in report.render_text(bare)
    assert "<h2>Load" not in report.render_html(bare)
    assert report.view.read_load(bare["status"]) is None


def test_the_text_report_draws_both_charts_scaled_to_their_largest_value() -> None:
    lines = report.render_text(LOADED).splitlines()
    tok = lines.index(
        "  output tok/s against concurrency (# control, = candidate; * production's load)"
    )
    tpot = lines.index(
        "  TPOT p50 ms against concurrency (# control, = candidate; * production's load)"
    )
    chart = lines[tok + 1 : tok + 9]
    # FP8 at production's 64 is the largest throughput: the full width; BF16 errs there
    assert chart[6:] == ["  64* control   error", "      candidate " + "=" * 32 + " 2,192"]
    # a bar is proportional to its value: 1,558 of 2,192 is 23 of 32 marks
    assert chart[4] == "  32  control   " + "#" * 23 + " 1,558"
    assert chart[0] == "   1  control   # 61"  # never less than one mark
    # TPOT: FP8 at 64 is the slowest per token; at equal concurrency FP8's bar is the longer
    tpot_chart = lines[tpot + 1 : tpot + 9]
    assert tpot_chart[7] == "      candidate " + "=" * 32 + " 29.2"
    assert len(tpot_chart[5]) > len(tpot_chart[4])  # 21.1 ms against 20.5 ms at 32


def test_no_chart_without_a_measured_stage() -> None:
    failed = ArmLoad(stages=(ERR,))
    summary = LoadSummary(
        verdict=LoadVerdict.ERROR, production_concurrency=64, control=failed, candidate=failed
    )
    text = report.render_text(rollout(LoadStatus(attempt=1, summary=summary)))
    assert "against concurrency (#" not in text
    assert report.render_text(rollout(None)).find("against concurrency") == -1


def test_the_load_notes_give_the_arms_clocks_over_the_load_or_why_unknown() -> None:
    clocks = ClocksRecord(
        source="prometheus",
        control=ClockRecord(sm_mhz=2040.0),
        candidate=ClockRecord(sm_mhz=1410.0, sm_range_mhz=(1410.0, 1980.0)),
    )
    loaded = LoadStatus(attempt=1, throughput_gain=1.4, summary=SUMMARY, clocks=clocks)
    lines = report.render_text(rollout(loaded)).splitlines()
    assert (
        "  GPU SM clocks during the load: control 2040 MHz, candidate 1410 (1410-1980) MHz"
    ) in lines
    note = ClocksRecord(source="prometheus", control=ClockRecord(sm_mhz=2040.0), note="no DCGM")
    text = report.render_text(rollout(LoadStatus(attempt=1, summary=SUMMARY, clocks=note)))
    assert "  GPU clocks during the load: no DCGM" in text.splitlines()
    assert "during the load" not in report.render_text(LOADED)  # not read: nothing said


def test_the_load_notes_say_how_often_each_engine_preempted() -> None:
    from dataclasses import replace

    assert SUMMARY.control is not None and SUMMARY.candidate is not None
    counted = replace(
        SUMMARY,
        control=replace(SUMMARY.control, preemptions=1234.0),
        candidate=replace(SUMMARY.candidate, preemptions=0.0),
    )
    text = report.render_text(rollout(LoadStatus(attempt=1, summary=counted)))
    assert "  preemptions during the load: control 1,234, candidate 0" in text.splitlines()
    # one arm's count unknown: nothing is said
    half = replace(counted, candidate=replace(SUMMARY.candidate, preemptions=None))
    assert "preemptions" not in report.render_text(rollout(LoadStatus(attempt=1, summary=half)))


def test_the_engines_side_of_each_stage_is_a_column_only_when_the_load_job_read_it() -> None:
    from dataclasses import replace

    assert SUMMARY.control is not None and SUMMARY.candidate is not None
    assert "preemptions ctl/cand" not in report.render_text(LOADED)  # not read: no column
    control = tuple(
        replace(s, preemptions=412.0 if s.concurrency == 64 else 0.0, max_waiting=56.0)
        for s in SUMMARY.control.stages
    )
    candidate = tuple(
        replace(s, preemptions=0.0, max_waiting=None) for s in SUMMARY.candidate.stages
    )
    seen = replace(
        SUMMARY,
        control=replace(SUMMARY.control, stages=control),
        candidate=replace(SUMMARY.candidate, stages=candidate),
    )
    text = report.render_text(rollout(LoadStatus(attempt=1, summary=seen)))
    header = next(line for line in text.splitlines() if "concurrent" in line and "tok/s" in line)
    assert header.rstrip().endswith("preemptions ctl/cand  waiting max ctl/cand")
    row_64 = next(line for line in text.splitlines() if line.strip().startswith("64 (production)"))
    # the control's stage at 64 is an error, and what the engine did under it is still shown
    assert "error" in row_64 and row_64.split()[-6:] == ["412", "/", "0", "56", "/", "-"]
    html = report.render_html(rollout(LoadStatus(attempt=1, summary=seen)))
    assert "preemptions ctl/cand</th>" in html and "412 / 0</td>" in html


def test_goodput_is_a_column_only_when_the_slos_made_inference_perf_count_it() -> None:
    # GIVEN a load run with SLOs: each measured stage counted the requests that met them
    with_goodput = LoadSummary(
        verdict=LoadVerdict.MEASURED,
        production_concurrency=8,
        control=ArmLoad(stages=(replace(ok(8, 410.0, 19.5), goodput_percent=62.5),)),
        candidate=ArmLoad(stages=(replace(ERR, concurrency=8),)),
    )
    loaded = rollout(LoadStatus(attempt=1, summary=with_goodput))
    lines = report.render_text(loaded).splitlines()
    header = next(line for line in lines if line.strip().startswith("concurrent"))
    assert re.split(r"\s{2,}", header.strip())[-2:] == ["control goodput %", "candidate goodput %"]
    row = next(line for line in lines if line.strip().startswith("8 (production)"))
    assert re.split(r"\s{2,}", row.strip())[-2:] == ["62.5", "error"]
    assert re.search(r"<th[^>]*>control goodput %</th>", report.render_html(loaded))
    # AND without SLOs the table is the one it always was
    assert "goodput" not in report.render_text(LOADED)
    assert "goodput" not in report.render_html(LOADED)
