"""kvgate.report: what a person sees for a rollout, at every stage of its life."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pytest
import report_states
from evidence import as_scan

from kvgate import report
from kvgate.judge import crash
from kvgate.judge.remedy import Remedy
from kvgate.records.status import ClockRecord
from kvgate.report.fmt import shell_command
from kvgate.report.records import Finding
from kvgate.vocabulary import Phase

PROMOTED: dict[str, Any] = {
    "apiVersion": "kvgate.io/v1alpha1",
    "kind": "KVCacheRollout",
    "metadata": {"name": "qwen3-fp8", "namespace": "demo"},
    "spec": {"targetRef": {"name": "vllm"}, "kvCacheDtype": "fp8", "promotion": {"mode": "auto"}},
    "status": {
        "phase": "Promoted",
        "message": "FP8 KV cache passed every gate; Deployment patched.",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Promoted", "message": "done"},
            {"type": "Reconciling", "status": "False", "reason": "Done", "message": ""},
            {
                "type": "PoolPressure",
                "status": "True",
                "reason": "KVPoolIsLimit",
                "message": "12 requests waiting, KV usage 97%",
            },
            {
                "type": "ScalesPresent",
                "status": "False",
                "reason": "ScalesMissing",
                "message": "no k/v scales; the engine uses 1.0",
            },
        ],
        "accuracy": {
            "kind": "kvgate.eval/summary",
            "verdict": "pass",
            "error": None,
            "task": "gsm8k",
            "margin": 0.02,
            "confidence": 0.95,
            "questions_used": 1319,
            "stopped_early": False,
            "control": {"correct": 1211, "n": 1319, "accuracy": 0.9181, "wilson95": [0.902, 0.932]},
            "candidate": {"correct": 1208, "n": 1319, "accuracy": 0.9158, "wilson95": [0.9, 0.93]},
            "paired": {
                "both": 1199,
                "control_only": 12,
                "candidate_only": 9,
                "neither": 99,
                "difference": -0.0023,
                "tango95": [-0.009, 0.005],
                "mcnemar_p": 0.66,
            },
            "largest_loss_ruled_out": -0.009,
            "advice": {"questions_needed": None},
        },
        "arms": {  # each arm's figures once, in its scan (as the operator stores them)
            "control": {
                "scan": {
                    "kvCacheDtype": "auto",
                    "capacity": {"kvTokens": 58000, "maxConcurrency": 14.2},
                }
            },
            "candidate": {
                "scan": {
                    "kvCacheDtype": "fp8",
                    "attentionBackend": "TRITON_ATTN",
                    "capacity": {"kvTokens": 116000, "maxConcurrency": 28.3},
                }
            },
        },
        "speed": {
            "control": {"tokensPerSecond": 812.5},
            "candidate": {"tokensPerSecond": 1490.0},
        },
        "recommendedArgs": ["--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
    },
}


def _camel(summary: dict[str, Any]) -> dict[str, Any]:
    """The same eval summary with camelCase keys, as a CRD status may store it."""

    def conv(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(w.title() for w in rest)

    if isinstance(summary, dict):
        return {conv(k): _camel(v) for k, v in summary.items()}
    return summary


def test_text_shows_the_accuracy_table_with_wilson_intervals() -> None:
    text = report.render_text(PROMOTED)
    lines = text.splitlines()
    assert lines[0] == "KVCacheRollout demo/qwen3-fp8: Promoted"
    assert "  control      1,211  1,319     91.8%  [90.2, 93.2]" in lines
    assert "  candidate    1,208  1,319     91.6%  [90.0, 93.0]" in lines
    # the fixed-n interval is labelled, beside the sequential bound (first-hour-2 N12)
    assert (
        "  candidate - control: -0.2 pp, 95% CI [-0.9, +0.5] pp (fixed-n, two-sided), "
        "McNemar p=0.66" in lines
    )
    assert "  verdict: pass (the sequential test rules out a loss larger than 0.9 pp)" in lines
    assert "Accuracy (gsm8k, paired, 1,319 questions, margin 2.0 pp, 95% confidence)" in lines


def test_text_shows_capacity_gain_speed_and_recommended_args() -> None:
    lines = report.render_text(PROMOTED).splitlines()
    assert "  candidate holds 2.00x the control's KV tokens" in lines
    assert re.search(r"candidate\s+fp8\s+TRITON_ATTN\s+116,000\s+28\.3x", "\n".join(lines))
    assert re.search(r"Tokens per second\s+812\.5\s+1,490", "\n".join(lines))
    assert lines[-2:] == ["  --kv-cache-dtype fp8 \\", "    --attention-backend TRITON_ATTN"]


def test_findings_come_from_gate_conditions_not_kstatus_ones() -> None:
    findings = report.view.read_findings(PROMOTED["status"])
    assert [f.gate for f in findings] == ["PoolPressure", "ScalesPresent"]
    text = report.render_text(PROMOTED)
    assert re.search(r"ScalesPresent\s+NO\s+ScalesMissing\s+no k/v scales", text)
    assert "Reconciling" not in text


def test_gate_results_win_over_conditions() -> None:
    # (status.findings, which no release wrote, is no longer read: status.gates is the list)
    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["gates"] = {
        "canary": {"outcome": "Failed", "reason": "CanaryCrashed", "message": "x"}
    }
    assert report.view.read_findings(rollout["status"]) == [
        Finding("canary", "Failed", "CanaryCrashed", "x")
    ]


def test_camel_case_summary_reads_the_same_as_snake_case() -> None:
    camel = copy.deepcopy(PROMOTED)
    camel["status"]["accuracy"] = _camel(camel["status"]["accuracy"])
    assert "questionsUsed" in camel["status"]["accuracy"]
    assert report.view.read_accuracy(camel["status"]) == report.view.read_accuracy(
        PROMOTED["status"]
    )


def test_percent_accuracies_are_normalised_to_fractions() -> None:
    status = {
        "accuracy": {"control": {"correct": 9, "n": 10, "accuracy": 90.0, "wilson95": [59.6, 98.2]}}
    }
    arm = report.view.read_accuracy(status).arms["control"]  # type: ignore[union-attr]
    assert arm.accuracy == pytest.approx(0.9)
    assert arm.wilson95 == pytest.approx((0.596, 0.982))


def test_accuracy_is_computed_from_counts_when_missing() -> None:
    status = {"accuracy": {"candidate": {"correct": 3, "n": 4}}}
    assert report.view.read_accuracy(status).arms["candidate"].accuracy == 0.75  # type: ignore[union-attr]


def test_a_fresh_rollout_renders_without_guessing() -> None:
    text = report.render_text({"metadata": {"name": "r", "namespace": "ns"}, "spec": {}})
    assert text == (
        "KVCacheRollout ns/r: Pending\n  target -\n\nCandidate args (under test)\n  (none yet)\n"
    )


def test_rolled_back_rollout_shows_the_remedy_and_no_accuracy() -> None:
    rollout = {
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "vllm"}},
        "status": {
            "phase": "RolledBack",
            "message": "candidate crashed building the FlashInfer kernel; use --attention-backend TRITON_ATTN",
            "capacity": {"control": {"kvTokens": 58000}},
        },
    }
    text = report.render_text(rollout)
    assert "Accuracy" not in text
    assert "use --attention-backend TRITON_ATTN" in text
    assert report.view.read_capacity_gain(rollout["status"]) is None


def test_inconclusive_verdict_says_how_many_questions_would_settle_it() -> None:
    status = {"accuracy": {"verdict": "inconclusive", "advice": {"questions_needed": 2400}}}
    assert (
        "  about 2,400 questions would settle it"
        in report.render_text({"status": status}).splitlines()
    )


@pytest.mark.parametrize("bad", [["x", 1], [float("nan"), 0.5], [0.1], "0.1,0.2", None])
def test_unreadable_intervals_are_shown_as_a_dash(bad: Any) -> None:
    status = {"accuracy": {"control": {"correct": 1, "n": 2, "wilson95": bad}}}
    assert report.view.read_accuracy(status).arms["control"].wilson95 == ()  # type: ignore[union-attr]


def test_html_is_self_contained_and_escapes_text() -> None:
    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["message"] = "<script>alert(1)</script> & more"
    page = report.render_html(rollout)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    # No external fetches: the only URL is the SVG namespace.
    assert re.findall(r"(?:src|href)=", page) == []
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}


def test_svg_draws_both_arms_with_intervals_and_kv_bars() -> None:
    svg = report.svg.render_svg(report.view_of({"status": PROMOTED["status"]}))
    root = ET.fromstring(svg)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    circles = root.findall(f"{ns}circle")
    rects = root.findall(f"{ns}rect")
    assert len(circles) == 2 and len(rects) == 2
    heights = [float(r.get("height")) for r in rects]  # type: ignore[arg-type]
    assert heights[1] / heights[0] == pytest.approx(2.0, rel=1e-3)
    # The candidate's point sits lower (worse accuracy) than the control's.
    ys = [float(c.get("cy")) for c in circles]  # type: ignore[arg-type]
    assert ys[1] > ys[0]
    titles = [c.find(f"{ns}title").text for c in circles]  # type: ignore[union-attr]
    assert titles == ["control: 91.8% [90.2, 93.2]", "candidate: 91.6% [90.0, 93.0]"]


def test_svg_without_data_says_so() -> None:
    svg = report.svg.render_svg(report.view_of({"status": {}}))
    ET.fromstring(svg)
    assert "no accuracy yet" in svg and "no KV figures yet" in svg


def test_header_names_target_mode_and_dtype_from_the_crd_spec() -> None:
    lines = report.render_text(PROMOTED).splitlines()
    assert lines[1] == "  target Deployment/vllm, mode auto, candidate --kv-cache-dtype fp8"
    assert lines[2] == "  FP8 KV cache passed every gate; Deployment patched."


def test_gates_mapping_is_read_as_findings() -> None:
    status = {
        # Stored by name (alphabetical in the API), shown in the order the gates run.
        "gates": {
            "canary": {"outcome": "Failed", "reason": "CanaryCrashed", "message": "JIT build"},
            "custom": {"outcome": "Pending"},
            "poolPressure": {"outcome": "Successful", "message": "queue builds up"},
        },
        "conditions": PROMOTED["status"]["conditions"],
    }
    assert report.view.read_findings(status) == [
        Finding("poolPressure", "Successful", "", "queue builds up"),
        Finding("canary", "Failed", "CanaryCrashed", "JIT build"),
        Finding("custom", "Pending", "", ""),
    ]


def test_every_gate_is_shown_in_the_order_the_operator_runs_it() -> None:
    from kvgate.judge import gates as verdict_gates

    gates = {g: {"outcome": "Skipped"} for g in sorted(verdict_gates.GATE_ORDER, reverse=True)}
    found = report.view.read_findings({"gates": {"zz-unknown": {"outcome": "Skipped"}, **gates}})
    # longContext and divergence ran before speed, but were shown after it (unknown names)
    assert [f.gate for f in found] == [*verdict_gates.GATE_ORDER, "zz-unknown"]


@pytest.mark.parametrize(
    ("phase", "css"),
    [("Promoted", "good"), ("NotNeeded", "good"), ("RolledBack", "bad"), ("Failed", "bad"),
     ("AwaitingApproval", "wait"), ("Reverting", "info"), ("Succeeded", "info"), ("Error", "info")],
)  # fmt: skip
def test_the_phase_colour_comes_from_the_operators_phases(phase: str, css: str) -> None:
    page = report.render_html({"metadata": {"name": "r"}, "status": {"phase": phase}})
    shown = phase if phase in {p.value for p in Phase} else "Pending"  # not a phase: unknown
    assert f"<span class='badge {css}'>{shown}</span>" in page


def test_difference_pp_from_the_crd_field_wins() -> None:
    status = {"accuracy": {"differencePp": -0.5, "paired": {"difference": -0.9}}}
    acc = report.view.read_accuracy(status)
    assert acc is not None and acc.difference == pytest.approx(-0.005)
    assert "  candidate - control: -0.5 pp" in report.render_text({"status": status}).splitlines()


# ---------------------------------------------------------------- `kvgate report`


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kvgate.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_the_text_report_from_a_file(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "kvr.json"
    path.write_text(json.dumps(PROMOTED))
    code, out, _ = _cli(["report", "--file", str(path)], capsys)
    assert code == 0
    assert out == report.render_text(PROMOTED)


def test_cli_reads_yaml_and_writes_html_and_json(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import yaml

    path, page = tmp_path / "kvr.yaml", tmp_path / "r.html"
    path.write_text(yaml.safe_dump(PROMOTED))
    code, out, _ = _cli(["report", "-f", str(path), "--html", str(page), "--json"], capsys)
    assert code == 0
    assert page.read_text() == report.render_html(PROMOTED)
    data = json.loads(out)
    assert data["phase"] == "Promoted"
    assert data["capacityRatio"] == 2.0
    assert data["kvTokens"] == {"control": 58000.0, "candidate": 116000.0}
    assert data["accuracy"]["arms"]["candidate"]["correct"] == 1208
    assert data["recommendedArgs"][-1] == "TRITON_ATTN"


def test_cli_without_name_or_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["report"], capsys)
    assert code == 2
    assert "give a rollout NAME or --file FILE" in err


def test_cli_rejects_a_file_that_is_not_a_rollout(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("kind: Pod\nmetadata: {name: p}\n")
    code, _, err = _cli(["report", "-f", str(path)], capsys)
    assert code == 2
    assert err.strip() == f"kvgate report: error: {path}: expected one KVCacheRollout object"


@pytest.mark.parametrize(
    ("content", "name", "expected"),
    [
        ("{}", None, "expected one KVCacheRollout object"),
        ('{"metadata": {"name": "qwen3-fp8"}, "status": {}}', None, "expected one KVCacheRollout"),
        (None, "other-name", "holds rollout 'qwen3-fp8', not 'other-name'"),
    ],
)
def test_cli_refuses_a_file_that_is_not_the_named_rollout(
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    name: str | None,
    expected: str,
) -> None:
    # GIVEN an empty object, an object of no kind, or one rollout under another name
    import json

    path = tmp_path / "kvr.json"
    path.write_text(content if content is not None else json.dumps(PROMOTED))
    # WHEN it is reported THEN it is bad input naming the file, never an empty report
    code, out, err = _cli(["report", *([name] if name else []), "-f", str(path)], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"kvgate report: error: {path}: ") and expected in err, err


@pytest.mark.parametrize(
    ("phase", "stalled", "code"),
    [
        ("Promoted", False, 0),
        ("NotNeeded", False, 0),
        ("RolledBack", False, 1),
        ("Failed", False, 1),
        ("NotNeeded", True, 1),  # a closed gate (gate mode)
        ("Evaluating", False, 3),
    ],
)
def test_exit_status_answers_like_wait(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], phase: str, stalled: bool, code: int
) -> None:
    # GIVEN a saved rollout in each end (and one still running)
    import json

    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["phase"] = phase
    if stalled:
        rollout["status"]["conditions"] = [{"type": "Stalled", "status": "True"}]
    path = tmp_path / "kvr.json"
    path.write_text(json.dumps(rollout))
    # WHEN it is reported with --exit-status THEN the exit code is the verdict's, as `wait` gives
    assert _cli(["report", "-f", str(path), "--exit-status"], capsys)[0] == code
    # AND without the flag the report exits 0 whatever the phase
    assert _cli(["report", "-f", str(path)], capsys)[0] == 0


def test_cli_without_credentials_is_an_external_error(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    code, _, err = _cli(["report", "r", "-n", "ns"], capsys)
    assert code == 4
    assert err.startswith("kvgate report: error: no cluster credentials")


# ---------------------------------------------------------------- the operator's status shape

ROLLED_BACK: dict[str, Any] = {
    "apiVersion": "kvgate.io/v1alpha1",
    "kind": "KVCacheRollout",
    "metadata": {"name": "qwen3-fp8", "namespace": "demo"},
    "spec": {"targetRef": {"name": "vllm"}, "kvCacheDtype": "fp8"},
    "status": {
        "phase": "RolledBack",
        "reason": "CanaryCrashed",
        "message": "candidate pod crashed: FlashInfer JIT build failed",
        "startedAt": "2026-11-29T20:00:00Z",
        "finishedAt": "2026-11-29T20:03:05Z",
        "verdict": {"decision": "RollBack", "outcome": "Failed", "message": "canary crashed"},
        "preflight": {
            "checkpointHasScales": False,
            "pressure": {
                "pressured": True,
                "samples": 4,
                "max_usage": 0.985,
                "mean_waiting": 23.5,
            },
        },
        "arms": {
            "control": {
                "kvTokens": 57808,
                "attentionBackend": "FLASH_ATTN",
                "scan": {
                    "kv_cache_dtype": "auto",
                    "capacity": {"kv_tokens": 57808, "max_concurrency": 7.06},
                    "findings": [{"code": "ready", "severity": "info", "text": "x", "hint": ""}],
                },
            },
            "candidate": {
                "scan": {
                    "kv_cache_dtype": "fp8",
                    "attention_backend": "FLASHINFER",
                    "capacity": {"kv_tokens": None, "max_concurrency": None},
                    "findings": [
                        {
                            "code": "flashinfer-jit-failed",
                            "severity": "error",
                            "text": "RuntimeError: Ninja build failed",
                            "hint": "pin --attention-backend TRITON_ATTN",
                        }
                    ],
                }
            },
        },
        "capacity": {"control": {"kvTokens": 57808}, "candidate": {"kvTokens": None}},
    },
}


def test_rolled_back_report_shows_the_crash_and_its_remedy() -> None:
    lines = report.render_text(ROLLED_BACK).splitlines()
    assert "  verdict: roll back: canary crashed" in lines  # the decision in words, not its enum
    assert "  production: Deployment vllm unchanged" in lines
    assert "  took 3 min 5 s" in lines
    assert "  candidate error flashinfer-jit-failed: RuntimeError: Ninja build failed" in lines
    assert "    remedy: pin --attention-backend TRITON_ATTN" in lines
    # Info-level log findings are left out.
    assert not [line for line in lines if "ready:" in line]


def test_production_section_reads_pool_pressure_and_scales() -> None:
    assert report.view.read_preflight(ROLLED_BACK["status"]) == [
        "KV pool is the limit (KV usage up to 98.5%, 23.5 requests waiting on average, 4 samples)",
        "checkpoint has no k/v scales: FP8 KV uses scale 1.0",
    ]


def test_capacity_comes_from_the_arms_log_scans() -> None:
    text = report.render_text(ROLLED_BACK)
    assert re.search(r"control\s+auto\s+FLASH_ATTN\s+57,808\s+7\.1x", text)
    assert re.search(r"candidate\s+fp8\s+FLASHINFER\s+-\s+-", text)
    assert report.view.read_capacity_gain(ROLLED_BACK["status"]) is None


def test_long_remedies_are_wrapped() -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    finding = rollout["status"]["arms"]["candidate"]["scan"]["findings"][0]
    finding["hint"] = "word " * 60
    lines = report.render_text(rollout).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum(line.startswith("      word") for line in lines) >= 2


def test_duration_is_omitted_when_unfinished_or_unreadable() -> None:
    assert report.view.read_duration({"startedAt": "2026-11-29T20:00:00Z"}) is None
    assert (
        report.view.read_duration({"startedAt": "x", "finishedAt": "2026-11-29T20:00:00Z"}) is None
    )
    assert (
        report.view.read_duration(
            {"startedAt": "2026-11-29T20:00:00Z", "finishedAt": "2026-11-29T20:00:42Z"}
        )
        == "42 s"
    )


def test_html_has_startup_log_and_production_sections() -> None:
    page = report.render_html(ROLLED_BACK)
    assert "<h2>Startup logs</h2>" in page and "<h2>Production</h2>" in page
    assert "pin --attention-backend TRITON_ATTN" in page
    assert "verdict: roll back: canary crashed · took 3 min 5 s" in page


def test_html_colours_gate_results() -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    rollout["status"]["gates"] = {
        "poolPressure": {"outcome": "Successful", "reason": "PoolPressured", "message": ""},
        "scales": {"outcome": "Warning", "reason": "ScalesMissing", "message": ""},
        "canary": {"outcome": "Failed", "reason": "CanaryCrashed", "message": ""},
    }
    page = report.render_html(rollout)
    assert re.findall(r"<td class='(\w+)'>(\w+)</td>", page) == [
        ("ok", "Successful"),
        ("maybe", "Warning"),
        ("no", "Failed"),
    ]


def test_long_finding_messages_wrap_under_their_column() -> None:
    status = {"gates": {"scales": {"outcome": "Warning", "reason": "R", "message": "m " * 80}}}
    lines = report.render_text({"status": status}).splitlines()
    start = lines.index("Findings")
    table = lines[start + 1 : start + 6]
    assert table[1].startswith("  scales  Warning  R       m m")
    column = table[1].index("m m")
    assert all(len(line) <= 100 for line in table)
    assert table[2].startswith(" " * column + "m") and table[2][column - 1] == " "


def test_cli_picks_a_rollout_from_a_saved_list(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "kvr.json"
    other = copy.deepcopy(ROLLED_BACK)
    other["metadata"]["name"] = "other"
    path.write_text(json.dumps({"kind": "List", "items": [ROLLED_BACK, other, PROMOTED]}))
    code, out, _ = _cli(["report", "qwen3-fp8", "-f", str(path)], capsys)
    assert code == 0
    assert out == report.render_text(ROLLED_BACK)
    code, _, err = _cli(["report", "-f", str(path)], capsys)
    assert code == 2
    assert "3 rollouts in the list; name one of: qwen3-fp8, other, qwen3-fp8" in err
    code, _, err = _cli(["report", "nope", "-f", str(path)], capsys)
    assert code == 2
    assert "no rollout 'nope' in the list" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["vllm", "serve", "M"], "vllm serve M"),
        (
            ["python", "-m", "kvgate.sim", "vllm", "serve", "M", "--port", "8000", "--x"],
            "python -m kvgate.sim vllm serve M \\\n  --port 8000 \\\n  --x",
        ),
        (["--a", "b c", "--d=$HOME"], "--a 'b c' \\\n  '--d=$HOME'"),
        ([], ""),
    ],
)
def test_recommended_args_read_as_a_shell_command(args: list[str], expected: str) -> None:
    assert shell_command(args) == expected


def test_a_rejected_candidate_shows_its_remedy_and_no_recommendation() -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    rollout["status"]["message"] = "candidate crashed: ninja failed; remedy: use TRITON_ATTN"
    rollout["status"]["recommendedArgs"] = ["vllm", "serve", "M", "--kv-cache-dtype", "fp8"]
    lines = report.render_text(rollout).splitlines()
    assert lines[2:4] == ["  candidate crashed: ninja failed", "  remedy: use TRITON_ATTN"]
    assert "Recommended args" not in lines
    assert lines[-3:] == [
        "Rejected candidate args",
        "  vllm serve M \\",
        "    --kv-cache-dtype fp8",
    ]
    page = report.render_html(rollout)
    assert "<p class='msg remedy'><b>Remedy:</b> use TRITON_ATTN</p>" in page
    assert "<h2>Rejected candidate args</h2>" in page


def test_svg_says_a_finished_rollout_never_measured_accuracy() -> None:
    svg = report.svg.render_svg(report.view_of({"status": ROLLED_BACK["status"]}))
    assert "no accuracy (not measured)" in svg
    assert svg.count("<rect") == 1  # the control's KV bar; the candidate crashed first


def test_text_shows_both_attempts_of_a_remediated_rollout() -> None:
    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["remediation"] = {
        "code": "attention-build-failed",
        "engine": "vllm",
        "engineVersion": "0.11.0",
        "args": [],
        "env": {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN", "VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "attempt": 1,
        "firstAttempt": {
            "message": "candidate pod crashed: RuntimeError: Ninja build failed.; starting the "
            "candidate again with the remedy for vllm 0.11.0: ...",
            "attentionBackend": "FLASHINFER",
        },
    }
    lines = report.render_text(rollout).splitlines()
    at = lines.index("Remediation")
    assert (
        lines[at + 1]
        == "  attempt 1 (FLASHINFER): candidate pod crashed: RuntimeError: Ninja build failed."
    )
    assert " ".join(" ".join(lines[at + 2 : at + 4]).split()) == (
        "attempt 2: attention-build-failed remedied for vllm 0.11.0 with "
        "VLLM_ATTENTION_BACKEND=TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0; gated like any "
        "other candidate"
    )
    assert "Remediation" not in report.render_text(PROMOTED).splitlines()


def test_split_remedy_reads_both_remedy_forms_the_operator_writes() -> None:
    from kvgate.report.view import split_remedy

    assert split_remedy("candidate pod crashed: X; remedy: use Triton") == (
        "candidate pod crashed: X",
        "use Triton",
    )
    # The engine-version form (machine._canary): the version stays with the remedy.
    assert split_remedy(
        "candidate pod crashed: X; remedy for vllm 0.11.0: --attention-backend TRITON_ATTN"
    ) == ("candidate pod crashed: X", "--attention-backend TRITON_ATTN (for vllm 0.11.0)")
    assert split_remedy("capacity gain 1.2x; below 1.8x") == (
        "capacity gain 1.2x; below 1.8x",
        None,
    )


# ---------------------------------------------------------------- GPU clocks in the speed table

CLOCKS: dict[str, Any] = {
    "control": {
        "smMHz": 2040.0,
        "memMHz": 6251.0,
        "smRangeMHz": [2010.0, 2040.0],
        "memRangeMHz": [6251.0, 6251.0],
    },
    "candidate": {
        "smMHz": 1410.0,
        "memMHz": 6251.0,
        "smRangeMHz": [1410.0, 1410.0],
        "memRangeMHz": [6251.0, 6251.0],
    },
    "source": "prometheus",
}


def _with_clocks(clocks: Any) -> dict[str, Any]:
    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["speed"]["clocks"] = clocks
    return rollout


def _speed_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("Speed")
    return lines[start + 1 : lines.index("", start)]


def test_speed_table_shows_both_arms_clocks_with_the_range_when_it_moved() -> None:
    rollout = _with_clocks(CLOCKS)
    assert _speed_lines(report.render_text(rollout)) == [
        "  metric                       control  candidate",
        "  Tokens per second              812.5      1,490",
        "  SM clock (MHz)      2040 (2010-2040)       1410",
        "  memory clock (MHz)              6251       6251",
    ]
    assert "GPU clocks:" not in report.render_text(rollout)
    page = report.render_html(rollout)
    assert (
        '<td>SM clock (MHz)</td><td class="n">2040 (2010-2040)</td><td class="n">1410</td>' in page
    )
    assert '<td>memory clock (MHz)</td><td class="n">6251</td><td class="n">6251</td>' in page


def test_unknown_clocks_are_a_dash_with_the_operators_reason_under_the_table() -> None:
    note = "no DCGM series for the arms in Prometheus"
    rollout = _with_clocks({"source": "prometheus", "note": note})
    text = report.render_text(rollout)
    rows = {line[:20].strip(): line[20:].split() for line in _speed_lines(text)}
    assert rows["SM clock (MHz)"] == ["-", "-"] and rows["memory clock (MHz)"] == ["-", "-"]
    lines = text.splitlines()
    assert lines[lines.index("Speed") + 5] == f"  GPU clocks: {note}"
    page = report.render_html(rollout)
    assert f"<p class='sub'>GPU clocks: {note}</p>" in page
    assert page.index("GPU clocks:") > page.index("<td>memory clock (MHz)</td>")


def test_one_arms_clock_missing_shows_a_dash_for_that_arm_only() -> None:
    partial = {
        "control": {"smMHz": 1980, "smRangeMHz": [1980, 1980]},
        "candidate": {"memMHz": 6251},
    }
    rows = {
        line[:20].strip(): line[20:].split()
        for line in _speed_lines(report.render_text(_with_clocks(partial)))
    }
    assert rows["SM clock (MHz)"] == ["1980", "-"]
    assert rows["memory clock (MHz)"] == ["-", "6251"]


def test_a_status_without_clocks_has_no_clock_rows() -> None:
    text = report.render_text(PROMOTED)
    assert "clock" not in text and "clock" not in report.render_html(PROMOTED)


def test_clocks_alone_make_a_speed_section() -> None:
    rollout = copy.deepcopy(PROMOTED)
    rollout["status"]["speed"] = {"clocks": {"note": "DCGM exporter not scraped"}}
    text = report.render_text(rollout)
    assert "Speed" in text.splitlines() and "  GPU clocks: DCGM exporter not scraped" in text


@pytest.mark.parametrize(
    "clocks",
    [
        "fast",
        ["control"],
        {"control": "2040", "candidate": [1, 2]},
        {"control": {"smMHz": "fast", "memMHz": float("nan")}, "candidate": {"smMHz": True}},
        {"control": {"smMHz": float("inf"), "memMHz": -5, "smRangeMHz": "1-2"}},
        {"control": {"smMHz": 10**400, "memMHz": 1e300, "smRangeMHz": list(range(100_000))}},
        {"control": {"smMHz": 1500, "smRangeMHz": [2000, 1000]}},  # min above max
        {"control": {"smMHz": 1500, "smRangeMHz": [None, {"x": 1}]}},
        {"note": ["not", "a", "string"], "source": 7},
        {"note": "   "},
    ],
)
def test_hostile_clocks_read_as_unknown_never_a_traceback(clocks: Any) -> None:
    rollout = _with_clocks(clocks)
    text = report.render_text(rollout)
    page = report.render_html(rollout)
    for line in _speed_lines(text):
        if "clock" in line:
            # nothing unreadable is shown as a figure: a dash, or the one plausible mean
            assert line[20:].split() in (["-", "-"], ["1500", "-"]), line
    assert "GPU clocks:" not in text and "GPU clocks:" not in page
    assert "nan" not in text.lower() and "inf" not in text.lower()


def test_view_reads_clocks_into_the_speed_record() -> None:
    speed = report.view.read_speed(_with_clocks({**CLOCKS, "note": " partial "})["status"])
    assert speed is not None and speed.clocks is not None
    assert speed.clocks.control == ClockRecord(
        sm_mhz=2040.0, mem_mhz=6251.0, sm_range_mhz=(2010.0, 2040.0), mem_range_mhz=(6251.0, 6251.0)
    )
    assert (speed.clocks.source, speed.clocks.note) == ("prometheus", "partial")
    assert [m.key for m in speed.metrics] == ["tokensPerSecond"]
    assert report.view.read_speed({}) is None


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("conditions",), [{"type": ["Ready"], "status": "True"}]),  # unhashable condition type
        (("preflight",), {"pressure": {"pressured": ["yes"]}}),
        (("arms",), {"candidate": {"scan": {"findings": True}}}),
        (("remediation",), {"args": 7, "env": "A=1"}),
        (("startedAt",), "2026-11-29T20:00:00"),  # no zone, while finishedAt has one
        (("capacity",), {"control": {"kvTokens": 10**400}}),
        (("accuracy", "long_context"), {"buckets": [{"context_length": 8192, "control": "x"}]}),
        (("accuracy", "divergence"), {"buckets": [{"bucket": "0-512", "floor": 3}]}),
    ],
)
def test_a_wrong_type_deep_in_the_status_renders_as_a_dash(
    path: tuple[str, ...], value: Any
) -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    rollout["status"].setdefault("accuracy", {})
    target = rollout["status"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    text, page = report.render_text(rollout), report.render_html(rollout)
    assert text.startswith("KVCacheRollout demo/qwen3-fp8: RolledBack\n")
    assert page.rstrip().endswith("</html>")
    assert report.svg.render_long_context_svg(report.view_of({"status": rollout["status"]})) == ""


# ---------------------------------------------------------------- read at a glance (issue 24)

NOW = dt.datetime(2026, 12, 1, 10, 12, 30, tzinfo=dt.UTC)


def test_the_l4_crash_leads_with_its_cause_and_says_where_the_remedy_goes() -> None:
    rollout = report_states.l4_crash()
    lines = report.render_text(rollout).splitlines()
    head = " ".join(" ".join(lines[2:12]).split())
    assert head.startswith(
        "candidate crashed: the attention backend could not JIT-compile its FP8 KV kernels "
        "(FlashInfer without nvcc/ninja in the image: the L4 trap) (attention-build-failed) "
        "remedy: --attention-backend TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0 (for vllm "
        "0.13.0) where: set spec.extraArgs: [--attention-backend, TRITON_ATTN] and "
        'spec.extraEnv: [{name: VLLM_USE_FLASHINFER_SAMPLER, value: "0"}]; or set '
        "spec.canary.remediation: auto and kvgate applies it and tests again "
        "engine log: subprocess.CalledProcessError: Command '['ninja', '-v', '-C', "
    ), head
    page = report.render_html(rollout)
    first = page.index("<p class='msg'>")
    assert page[first:].startswith("<p class='msg'>candidate crashed: the attention backend")
    assert "<p class='msg where'><b>Where:</b> set spec.extraArgs: [--attention-backend, " in page
    # the engine's long line is kept, folded, after the cause and the remedy
    raw = page.index("<details><summary>the engine's line</summary><pre>subprocess.")
    assert raw > page.index("<p class='msg remedy'>")


_NINJA = {"findings": [{"code": "x", "severity": "error", "text": "ninja failed",
                         "hint": "use TRITON_ATTN"}]}  # fmt: skip


def _crashed(arm: str, fix: Remedy | None = None, **kw: Any) -> str:
    return crash.describe(arm, as_scan(_NINJA), "exited with code 1 (Error)", fix, **kw).message


def test_a_remedy_kvgate_cannot_apply_itself_names_the_fields_without_auto() -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    rollout["status"]["message"] = _crashed("candidate")  # a log rule's hint, no known remedy
    lines = report.render_text(rollout).splitlines()
    assert lines[2:6] == [
        "  candidate crashed: exited with code 1 (Error), cause not classified",
        "  remedy: use TRITON_ATTN",
        "  where: the candidate's flags go in spec.extraArgs, its environment in spec.extraEnv",
        "  engine log: ninja failed",
    ]
    # A remedy already applied (or refused by the allowlist) is not offered again as auto.
    fix = Remedy("attention-build-failed", "vllm", "0.13.0", ("--attention-backend", "TRITON_ATTN"),
                 {})  # fmt: skip
    refused = dataclasses.replace(fix, refused="--attention-backend")
    for message in (_crashed("candidate", fix, auto=True, already_applied=True),
                    _crashed("candidate", refused, auto=True)):  # fmt: skip
        rollout["status"]["message"] = message
        text = report.render_text(rollout)
        assert "spec.extraArgs: [--attention-backend, TRITON_ATTN]" in text
        assert "remediation: auto" not in text
    assert "(not applied, the allowlist refuses it: --attention-backend)" in " ".join(text.split())
    rollout["status"]["message"] = _crashed("candidate", fix)
    assert "or set spec.canary.remediation: auto" in " ".join(report.render_text(rollout).split())
    # A control that crashed: nothing of the candidate's spec would help.
    rollout["status"]["message"] = _crashed("control")
    text = report.render_text(rollout)
    assert "control crashed: " in text and "remedy: use TRITON_ATTN" in text
    assert "where:" not in text


def test_long_log_lines_fold_into_details_and_tables_wrap() -> None:
    page = report.render_html(report_states.l4_crash())
    # words stay whole in short columns (first-hour-2 N1: "Successfu/l" under a fixed layout);
    # only message, line and remedy cells may break a word, so nothing overflows either
    assert "table-layout:fixed" not in page
    css = page[page.index("<style>") : page.index("</style>")]
    assert "td.long{overflow-wrap:anywhere}" in css
    assert "overflow-wrap" not in css.split("th,td{", 1)[1].split("}", 1)[0]
    logs = page[page.index("<h2>Startup logs</h2>") :]
    logs = logs[: logs.index("</table>")]
    # the 290-character ninja command shows its first 160 characters, the rest on a click
    assert "<details><summary>subprocess.CalledProcessError: Command &#x27;[&#x27;ninja" in logs
    assert "build.ninja&#x27;]&#x27; returned non-zero exit status 1.</pre></details>" in logs
    # short lines and the remedies (what to do) are never folded
    assert '<td class="long">EngineCore failed to start.</td>' in logs
    assert '<td class="long">FlashInfer could not JIT-compile its FP8 KV kernels' in logs
    assert "<td>candidate</td>" in logs  # the arm: a short column, whole words


@pytest.mark.parametrize(
    ("state", "heading"),
    [
        ("canary", "Candidate args (under test)"),
        ("evaluating", "Candidate args (under test)"),
        ("awaiting-approval", "Recommended args"),
        ("promoted", "Recommended args"),
        ("regressed", "Rejected candidate args"),
        ("l4-crash", "Rejected candidate args"),
    ],
)
def test_args_are_recommended_only_after_a_passing_verdict(state: str, heading: str) -> None:
    rollout = report_states.STATES[state]()
    assert f"\n{heading}\n" in report.render_text(rollout, now=NOW)
    assert f"<h2>{heading}</h2>" in report.render_html(rollout, now=NOW)


def test_not_needed_args_are_not_recommended() -> None:
    assert report.view.args_heading({"phase": "NotNeeded"}) == "Candidate args (not needed)"
    # reverting leads to the end its write-ahead record names
    reverting = {"phase": "Reverting", "revert": {"phase": "RolledBack", "reason": "VerifyFailed"}}
    assert report.view.args_heading(reverting) == "Rejected candidate args"
    reverting["revert"]["phase"] = "NotNeeded"
    assert report.view.args_heading(reverting) == "Candidate args (not needed)"
    # a passing verdict recorded before the phase moved on is enough
    verdict = {"decision": "Promote", "outcome": "Successful", "message": "ok"}
    assert (
        report.view.args_heading({"phase": "Evaluating", "verdict": verdict}) == "Recommended args"
    )


def test_a_running_eval_shows_its_look_questions_difference_and_elapsed_time() -> None:
    rollout = report_states.evaluating()
    lines = report.render_text(rollout, now=NOW).splitlines()
    assert "  eval look 2/5: 200 of 500 questions answered, candidate - control -0.5 pp so far" in (
        lines
    )
    assert "  running 12 min 30 s (in this phase 8 min 30 s)" in lines
    page = report.render_html(rollout, now=NOW)
    assert "eval look 2/5: 200 of 500 questions answered" in page
    assert "running 12 min 30 s (in this phase 8 min 30 s)" in page
    # a finished rollout says how long it took instead; a canary only how long it has run
    assert "running" not in report.render_text(report_states.promoted(), now=NOW)
    canary = report.render_text(report_states.canary(), now=NOW).splitlines()
    assert "  running 12 min 30 s (in this phase 11 min 30 s)" in canary
    assert not [line for line in canary if "eval look" in line]


def test_a_failed_gate_leads_with_what_was_shown() -> None:
    # a fail the headline does not state (here: a rollout aborted after its eval failed)
    rollout = report_states.regressed()
    rollout["status"].update(reason="Aborted", message="aborted by hand: the cluster is moving")
    lines = report.render_text(rollout).splitlines()
    at = lines.index("Accuracy (gsm8k, paired, 300 questions, margin 2.0 pp, 95% confidence)")
    assert lines[at + 4] == (
        "  candidate worse: 82.0% vs control 88.7% (-6.7 pp); shown worse by at least 2.1 pp "
        "(97.5% one-sided, 3 looks)"
    )
    assert "  verdict: fail, stopped early" in lines
    assert not [line for line in lines if "rules out" in line]
    # the rollout ended on it: the headline says it, the section refers to it (#26)
    lines = report.render_text(report_states.regressed()).splitlines()
    at = lines.index("Accuracy (gsm8k, paired, 300 questions, margin 2.0 pp, 95% confidence)")
    assert lines[at + 4].startswith("  candidate - control: -6.7 pp, 95% CI")
    assert "  verdict: fail, stopped early (shown worse: the headline above)" in lines
    assert not [line for line in lines if "rules out" in line]
    # a pass keeps what it ruled out
    assert "  verdict: pass (the sequential test rules out a loss larger than 0.9 pp)" in (
        report.render_text(report_states.promoted()).splitlines()
    )


def test_the_difference_chart_draws_the_bounds_against_the_margin() -> None:
    failed = report.svg.render_difference_svg(
        report.view_of({"status": report_states.regressed()["status"]})
    )
    root = ET.fromstring(failed)
    ns = "{http://www.w3.org/2000/svg}"
    dashed = [el for el in root.iter(f"{ns}line") if el.get("stroke-dasharray")]
    assert len(dashed) == 1 and dashed[0].get("stroke") == "#8a1c17"  # the margin, red: failed
    texts = [el.text for el in root.iter(f"{ns}text")]
    assert "margin -2 pp" in texts and "-6.7 pp" in texts
    assert "look-adjusted one-sided bounds" in texts[0]
    title = next(root.iter(f"{ns}title")).text
    assert title == "candidate - control -6.7 pp [-11.2, -2.1]"
    # the margin line sits left of both bounds: the whole interval is worse than zero
    xs = {el.get("x1") for el in root.iter(f"{ns}line") if el.get("stroke-width") == "2"}
    assert float(dashed[0].get("x1") or 0) > min(float(x or 0) for x in xs)
    passed = report.svg.render_difference_svg(
        report.view_of({"status": report_states.promoted()["status"]})
    )
    assert 'stroke="#17612a" stroke-width="2" stroke-dasharray' in passed  # green: passed
    assert "two-sided 95% interval" in passed  # no look-adjusted bounds in this summary
    assert (
        report.svg.render_difference_svg(
            report.view_of({"status": report_states.canary()["status"]})
        )
        == ""
    )
    assert "<svg" in report.render_html(report_states.regressed()).split("Accuracy (gsm8k")[1]


# ---------------------------------------------------------------- first hour, rows 26 and 27


def _mode(rollout: dict[str, Any], mode: str) -> dict[str, Any]:
    rollout = copy.deepcopy(rollout)
    rollout["spec"]["promotion"] = {"mode": mode}
    return rollout


def _reverted() -> dict[str, Any]:
    """Promoted, then the verify window failed: kvgate's patch was taken out again."""
    rollout = report_states.promoted()
    rollout["status"].update(phase="RolledBack", reason="VerifyFailed", message="verify failed",
                             revert={"phase": "RolledBack", "reason": "VerifyFailed"})  # fmt: skip
    return rollout


def _not_needed() -> dict[str, Any]:
    rollout = report_states.canary()
    rollout["status"].update(phase="NotNeeded", reason="PoolHasRoom", message="the pool has room")
    return rollout


@pytest.mark.parametrize(
    ("build", "line"),
    # lambdas: report_states imports this module, so its names are looked up when a test runs
    [
        (lambda: report_states.l4_crash(), "Deployment vllm unchanged"),
        (lambda: report_states.regressed(), "Deployment vllm unchanged"),
        (_not_needed, "Deployment vllm unchanged"),
        (_reverted, "Deployment vllm back on its previous config (kvgate's change reverted)"),
        (lambda: report_states.promoted(), "Deployment vllm now runs the FP8 config"),
        (lambda: report_states.awaiting_approval(), "Deployment vllm unchanged until approved"),
        (
            lambda: report_states.canary(),
            "Deployment vllm unchanged so far (the canary pods run beside it)",
        ),
        (
            lambda: _mode(report_states.promoted(), "report"),
            "Deployment vllm unchanged: report mode writes the verdict and the args; apply them "
            "yourself",
        ),
        (
            lambda: _mode(report_states.regressed(), "gate"),
            "Deployment vllm unchanged: gate mode writes the verdict (the rollout is Ready only on "
            "a pass); your GitOps change applies the args",
        ),
    ],
)
def test_every_state_says_what_happened_to_production(
    build: Callable[[], dict[str, Any]], line: str
) -> None:
    rollout = build()
    text = " ".join(report.render_text(rollout, now=NOW).split())
    assert f"production: {line}" in text
    page = " ".join(report.render_html(rollout, now=NOW).split())
    assert f"<p class='msg prod'><b>Production:</b> {html.escape(line)}</p>" in page


def test_the_verdict_is_not_repeated_nor_named_by_its_enum() -> None:
    # GIVEN a rollout whose verdict message is its status message (what the operator writes)
    rollout = report_states.awaiting_approval()
    assert rollout["status"]["verdict"]["message"] == rollout["status"]["message"]
    # THEN the report says it once, and no internal decision word appears
    for rendered in (report.render_text(rollout, now=NOW), report.render_html(rollout, now=NOW)):
        # once, without the annotation the two approve commands below carry (#26)
        assert rendered.count("all gates passed") == 1
        assert "approve with annotation" not in rendered
        assert "verdict: hold" not in rendered and "verdict: promote" not in rendered
        assert not re.search(r"\b(Promote|RollBack|Hold)\b", rendered)
    # a verdict that adds something is said in words
    rolled = copy.deepcopy(ROLLED_BACK)
    assert report.view.read_verdict(rolled["status"]) == "roll back: canary crashed"


def test_manual_approval_prints_both_commands_and_the_expiry() -> None:
    rollout = report_states.awaiting_approval()
    text = report.render_text(rollout, now=NOW).splitlines()
    at = text.index("  approve with either command:")
    assert text[at + 1 : at + 4] == [
        "    kvgate approve qwen3-fp8 -n demo",
        "    kubectl annotate kvr/qwen3-fp8 -n demo kvgate.io/approve=18cab288d5712cfa",
        "    expires 2026-12-04 10:48 UTC",
    ]
    page = report.render_html(rollout, now=NOW)
    assert (
        "<p class='msg where'><b>Approve</b> with either command (expires 2026-12-04 10:48 UTC):"
        "</p><pre>kvgate approve qwen3-fp8 -n demo\n"
        "kubectl annotate kvr/qwen3-fp8 -n demo kvgate.io/approve=18cab288d5712cfa</pre>"
    ) in page
    # report mode's end is AwaitingApproval too, but there is nothing to approve
    reported = copy.deepcopy(rollout)
    reported["status"]["reason"] = "VerdictReported"
    assert report.view_of(reported).approval == []
    assert "kvgate approve" not in report.render_text(reported, now=NOW)
    # without the operator's expiry (an older operator, or no TTL) the commands still show
    del rollout["status"]["approvalExpiresAt"]
    assert len(report.view_of(rollout).approval) == 2


def test_skipped_is_grey_not_the_amber_of_a_warning() -> None:
    rollout = copy.deepcopy(ROLLED_BACK)
    rollout["status"]["gates"] = {
        "speed": {"outcome": "Skipped", "reason": "NoSpeedGate", "message": "off"},
        "scales": {"outcome": "Warning", "reason": "ScalesMissing", "message": "1.0"},
    }
    page = report.render_html(rollout)
    assert "<td>speed</td><td class='skip'>Skipped</td>" in page
    assert "<td>scales</td><td class='maybe'>Warning</td>" in page
    css = page[page.index("<style>") : page.index("</style>")]
    assert "td.skip{color:#5b6475}" in css and "td.maybe{color:#7a5500" in css


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45 s"), (252, "4 min 12 s"), (7500, "2 h 5 min"), (6782 * 60 + 18, "4 d 17 h")],
)
def test_long_durations_read_in_hours_and_days(seconds: float, text: str) -> None:
    """first-hour-2 N10: a rollout awaiting approval for days read "6782 min 18 s"."""
    from kvgate.records.timestamps import duration

    assert duration(seconds) == text


def test_the_fixed_n_interval_says_it_ignores_the_looks() -> None:
    """first-hour-2 N12: "95% CI [-0.6, +1.6] pp" beside the look-adjusted "rules out a loss
    larger than 1.6 pp", unlabelled."""
    rollout = report_states.promoted()
    rollout["status"]["accuracy"]["bounds"] = {"look": 10}  # the look it stopped at
    text = " ".join(report.render_text(rollout).split())
    assert "pp (fixed-n, two-sided, ignores the 10 looks)" in text


def test_the_header_says_each_thing_once() -> None:
    """first-hour-2 #26: "verdict: promote: every gate passed" under "passed every gate", and
    "approve with annotation ...=HASH" right above the two approve commands."""
    promoted = report.render_text(report_states.promoted())
    assert "passed every gate" in promoted and "verdict: promote" not in promoted
    awaiting = report.render_text(report_states.awaiting_approval())
    assert "approve with annotation" not in awaiting
    assert "approve with either command:" in awaiting
    assert awaiting.count("kvgate.io/approve=18cab288d5712cfa") == 1  # in the kubectl command


def test_a_failed_accuracy_gate_is_said_once_in_the_headline() -> None:
    """first-hour-2 #26: the fail was stated in the header, the Findings row and the Accuracy
    section; now in the headline only, which the other two point at."""
    rollout = report_states.regressed()
    status = rollout["status"]
    status["gates"] = {
        "scales": {"outcome": "Warning", "reason": "ScalesMissing",
                   "message": "no k/v scales; the engine uses 1.0"},
        "accuracy": {"outcome": "Failed", "reason": "AccuracyRegressed",
                     "message": status["message"]},
    }  # fmt: skip
    shown = "shown worse by at least 2.1 pp"
    text = report.render_text(rollout)
    page = report.render_html(rollout)
    for rendered in (" ".join(text.split()), page):  # unwrapped
        assert rendered.count(shown) == 1 and rendered.count("candidate worse") == 1
        assert rendered.count("shown worse: the headline above") == 2  # Findings and Accuracy
    lines = text.splitlines()
    assert lines[2].startswith("  candidate worse: 82.0% vs control 88.7%")  # the headline
    (row,) = [line for line in lines if line.startswith("  accuracy ")]
    assert row.endswith("AccuracyRegressed  shown worse: the headline above; the figures under "
                        "Accuracy")  # fmt: skip
    # the other gates' rows keep their own words
    assert "no k/v scales; the engine uses 1.0" in text
    # with two blocking gates the headline joins both messages: still said there once
    status.update(reason="CapacityNotGained", message=f"capacity 1.0x; {status['message']}")
    assert " ".join(report.render_text(rollout).split()).count(shown) == 1  # unwrapped
