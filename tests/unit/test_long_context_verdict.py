"""The accuracy gate over several tasks (GSM8K + long context) and the divergence screen gate.

Blocks are built with the real judges (`long_context.judge`, `divergence.screen`) in the shape
`kvgate eval` prints them, then taken apart by the pure decision (`verdict.assess_*`,
`next_step`). Fail closed: a block that was asked for and is missing, malformed or contradicts
itself never passes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from evidence import as_summary

from kvgate.change import manifests
from kvgate.commands.diverge import ScreenOptions, summary_header
from kvgate.evaluation.long_context import LongContextPlan, judge
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import machine, steps
from kvgate.flow.steps import Observation, State
from kvgate.judge import verdict as v
from kvgate.judge.accuracy import (
    LONG_CONTEXT_KIND,
    assess_divergence,
    assess_long_context,
    bucket_label,
)
from kvgate.judge.divergence import BucketStats, ScreenSettings, screen
from kvgate.judge.stats import PairedCounts
from kvgate.records.status import RolloutStatus
from kvgate.spec.rollout import DivergenceGate, LongContextTask, RolloutSpec
from kvgate.vocabulary import GateMode, Outcome, Phase

CRD = Path(__file__).resolve().parents[2] / "crds" / "kvgate.io_kvcacherollouts.yaml"
GSM8K_PASS: dict[str, Any] = {
    "kind": "kvgate.eval/summary",
    "verdict": "pass",
    "error": None,
    "margin": 0.03,
    "questions_used": 150,
    "control": {"accuracy": 0.91, "correct": 137, "n": 150},
    "candidate": {"accuracy": 0.90, "correct": 135, "n": 150},
    "paired": {"difference": -0.013, "tango95": [-0.04, 0.01]},
}
SOUND = {8192: PairedCounts(29, 0, 0, 1), 32768: PairedCounts(29, 0, 0, 1)}
# fine at 8k, collapsed at 32k (the 16k-32k bucket), a smaller loss at 16k
COLLAPSED = {
    8192: PairedCounts(29, 0, 0, 1),
    16384: PairedCounts(10, 19, 0, 1),
    32768: PairedCounts(1, 28, 0, 1),
}
LC = LongContextTask(tasks=("niah_single_1",), items=30, margin_pp=15.0)


def lc_block(per_length: dict[int, PairedCounts], task: LongContextTask = LC) -> dict[str, Any]:
    """The `long_context` block as `kvgate eval` prints it, judged by the real judge."""
    plan = LongContextPlan(margin=task.margin_pp / 100, recovery_floor=task.recovery_floor)
    verdict, reason, bucket, rows = judge(per_length, plan)
    return {
        "kind": LONG_CONTEXT_KIND,
        "verdict": str(verdict),
        "reason": reason,
        "error": None,
        "failing_bucket": None if str(verdict) == "pass" else bucket,
        "tasks": list(task.tasks),
        "context_lengths": sorted(per_length),
        "buckets": rows,
    }


def stats(low: int, high: int, agreement: float, kl: float) -> BucketStats:
    return BucketStats(low, high, 400, agreement, kl, kl * 3, kl * 5)


def div_block(candidate_kl_at_16k: float) -> dict[str, Any]:
    """The `divergence` block as `kvgate diverge` / `kvgate eval` print it, screened for real."""
    edges = [(0, 512), (512, 1024), (1024, 16384), (16384, 32768)]
    floor = [stats(lo, hi, 0.98, 3e-4) for lo, hi in edges]
    cand = [stats(lo, hi, 0.97, 6e-4) for lo, hi in edges[:-1]]
    collapsed = candidate_kl_at_16k > 0.1
    cand.append(stats(16384, 32768, 0.2 if collapsed else 0.97, candidate_kl_at_16k))
    verdict, table = screen(floor, cand, ScreenSettings())
    flagged = [row for row in table if row.flagged]
    block = summary_header(ScreenOptions(documents=2, max_tokens=32768))
    block.update(
        verdict=str(verdict),
        positions=sum(row.candidate.positions for row in table),
        flagged_buckets=[f"{row.low}-{row.high}" for row in flagged],
        first_flagged=flagged[0].to_dict() if flagged else None,
        buckets=[row.to_dict() for row in table],
    )
    return block


# --- the spec ---------------------------------------------------------------------------------


def parse(gates: dict[str, Any]) -> RolloutSpec:
    return RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "gates": gates})


def errors(gates: dict[str, Any]) -> list[str]:
    with pytest.raises(ExceptionGroup) as info:
        parse(gates)
    return [str(e) for e in info.value.exceptions]


def test_gsm8k_only_and_divergence_off_by_default() -> None:
    spec = parse({})
    assert spec.accuracy.long_context is None
    assert spec.divergence == DivergenceGate(mode=GateMode.OFF)


def test_long_context_defaults_and_values() -> None:
    assert parse({"accuracy": {"longContext": {}}}).accuracy.long_context == LongContextTask()
    got = parse(
        {
            "accuracy": {
                "longContext": {
                    "tasks": ["niah_multikey_3", "niah_single_1", "niah_multikey_3"],
                    "items": 20,
                    "margin": 15,
                    "recoveryFloor": 0.9,
                    "contextLengths": [32768, 8192, 8192],
                    "tokenizer": "/models/qwen",
                }
            },
            "divergence": {"mode": "warn", "documents": 2, "maxTokens": 16000, "factor": 5},
        }
    )
    assert got.accuracy.long_context == LongContextTask(
        tasks=("niah_multikey_3", "niah_single_1"),
        items=20,
        margin_pp=15.0,
        recovery_floor=0.9,
        context_lengths=(8192, 32768),
        tokenizer="/models/qwen",
    )
    assert got.divergence == DivergenceGate(GateMode.WARN, 2, 16000, 5.0, 5)


def test_bad_long_context_and_divergence_fields_are_named_all_at_once() -> None:
    found = errors(
        {
            "accuracy": {
                "longContext": {
                    "tasks": ["niah_single_1", "ruler_qa"],
                    "items": 2,
                    "margin": 0,
                    "contextLengths": [100, 8192],
                    "tokenizer": "a\nb",
                }
            },
            "divergence": {"mode": "always", "documents": 0, "maxTokens": 10, "logprobs": 50},
        }
    )
    fields = sorted(e.split(":")[0] for e in found)
    p = "spec.gates.accuracy.longContext"
    assert fields == sorted(
        [
            f"{p}.tasks[1]",
            f"{p}.items",
            f"{p}.margin",
            f"{p}.contextLengths[0]",
            f"{p}.tokenizer",
            "spec.gates.divergence.mode",
            "spec.gates.divergence.documents",
            "spec.gates.divergence.maxTokens",
            "spec.gates.divergence.logprobs",
        ]
    )
    assert any("[] is empty" in e or "is empty" in e for e in errors(
        {"accuracy": {"longContext": {"tasks": []}}}
    ))  # fmt: skip


def test_crd_schema_knows_the_new_fields() -> None:
    import yaml

    doc = yaml.safe_load(CRD.read_text())
    gates = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["gates"]["properties"]
    lc = gates["accuracy"]["properties"]["longContext"]["properties"]
    assert set(lc) == {
        "tasks",
        "items",
        "margin",
        "recoveryFloor",
        "contextLengths",
        "tokenizer",
        "tokenizerRevision",
    }
    assert lc["tasks"]["items"]["enum"] == ["niah_single_1", "niah_multikey_2", "niah_multikey_3"]
    assert gates["divergence"]["properties"]["mode"]["default"] == "off"


# --- the eval Job's command --------------------------------------------------------------------


def command(gates: dict[str, Any], **kw: Any) -> list[str]:
    return manifests.eval_command(
        parse(gates),
        control_url="http://a:8000/v1/completions",
        candidate_url="http://b:8000/v1/completions",
        model="Qwen/Qwen3-8B",
        concurrency=8,
        **kw,
    )


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_gsm8k_only_command_has_no_long_context_or_divergence_flags() -> None:
    cmd = command({}, max_model_len=32768, tokenizer="Qwen/Qwen3-8B")
    assert not [c for c in cmd if c.startswith(("--long-context", "--divergence", "--tokenizer"))]
    assert "--max-model-len" not in cmd


def test_long_context_buckets_come_from_the_engine_unless_the_spec_lists_them() -> None:
    cmd = command({"accuracy": {"longContext": {"margin": 15}}}, max_model_len=32768,
                  tokenizer="Qwen/Qwen3-8B")  # fmt: skip
    assert flag(cmd, "--long-context-tasks") == "niah_single_1"
    assert flag(cmd, "--max-model-len") == "32768" and "--context-lengths" not in cmd
    assert flag(cmd, "--long-context-margin") == "0.15"
    assert flag(cmd, "--recovery-floor") == "0.95"
    assert flag(cmd, "--long-context-items") == "50"
    assert flag(cmd, "--tokenizer") == "Qwen/Qwen3-8B"  # the model's by default
    listed = command(
        {"accuracy": {"longContext": {"contextLengths": [8192, 32768], "tokenizer": "/tok"}}},
        max_model_len=40960,
        tokenizer="Qwen/Qwen3-8B",
    )
    assert flag(listed, "--context-lengths") == "8192,32768" and "--max-model-len" not in listed
    assert flag(listed, "--tokenizer") == "/tok"


def test_divergence_command_follows_the_mode() -> None:
    assert "--divergence-documents" not in command({"divergence": {"mode": "off"}})
    cmd = command({"divergence": {"mode": "warn", "documents": 2}}, max_model_len=32768)
    assert (flag(cmd, "--divergence-documents"), flag(cmd, "--divergence-max-tokens")) == (
        "2",
        "32768",
    )
    assert (flag(cmd, "--divergence-factor"), flag(cmd, "--divergence-logprobs")) == ("10", "5")
    own = command({"divergence": {"mode": "require", "maxTokens": 4096}}, max_model_len=32768)
    assert flag(own, "--divergence-max-tokens") == "4096"


def test_the_command_parses_with_kvgate_eval() -> None:
    """Every flag the operator writes is one `kvgate eval` accepts, with the same meaning."""
    import argparse

    from kvgate.commands import eval as eval_cmd

    parser = argparse.ArgumentParser()
    eval_cmd.configure(parser)
    cmd = command(
        {
            "accuracy": {"longContext": {"tasks": ["niah_single_1", "niah_multikey_2"]}},
            "divergence": {"mode": "require", "documents": 3, "factor": 4},
        },
        max_model_len=16384,
        tokenizer="/tok",
    )
    args = parser.parse_args(cmd[2:])
    assert args.long_context_tasks == "niah_single_1,niah_multikey_2"
    assert (args.max_model_len, args.tokenizer, args.recovery_floor) == (16384, "/tok", 0.95)
    assert (args.divergence_documents, args.divergence_max_tokens) == (3, 16384)
    assert args.divergence_factor == 4.0


# --- the long-context decision -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "label"), [(4096, "2k-4k"), (16384, "8k-16k"), (32768, "16k-32k"), (3000, "1,500-3,000")]
)  # fmt: skip
def test_bucket_label(length: int, label: str) -> None:
    assert bucket_label(length) == label


def test_off_when_not_asked() -> None:
    assert assess_long_context(None, as_summary(GSM8K_PASS)).outcome is Outcome.SKIPPED


def test_collapse_fails_naming_the_worst_bucket() -> None:
    got = assess_long_context(LC, as_summary({**GSM8K_PASS, "long_context": lc_block(COLLAPSED)}))
    assert (got.gate, got.outcome, got.reason) == ("longContext", Outcome.FAILED,
                                                  "LongContextRegressed")  # fmt: skip
    # 16k and 32k both fail; the 32k bucket lost most and is named
    assert got.message.startswith("long-context bucket 16k-32k (32,768 tokens): worse than")
    assert "control 97% vs candidate 3% on 30 items" in got.message
    assert "recovery 0.03 (floor 0.95)" in got.message


def test_sound_candidate_passes_every_bucket() -> None:
    got = assess_long_context(LC, as_summary({**GSM8K_PASS, "long_context": lc_block(SOUND)}))
    assert (got.outcome, got.reason) == (Outcome.SUCCESSFUL, "LongContextNonInferior")
    assert "every bucket (4k-8k, 16k-32k)" in got.message


def test_too_few_items_is_inconclusive_and_names_the_bucket() -> None:
    few = {8192: PairedCounts(9, 0, 0, 1), 32768: PairedCounts(29, 0, 0, 1)}
    got = assess_long_context(LC, as_summary({**GSM8K_PASS, "long_context": lc_block(few)}))
    assert (got.outcome, got.reason) == (Outcome.INCONCLUSIVE, "LongContextInconclusive")
    assert got.message.startswith("long-context bucket 4k-8k (8,192 tokens): not shown")


def _broken(block: Any) -> v.GateResult:
    return assess_long_context(LC, as_summary({**GSM8K_PASS, "long_context": block}))


def test_missing_or_malformed_block_fails_closed() -> None:
    good = lc_block(SOUND)
    cases: list[Any] = [None, "pass", {**good, "kind": "other"}, {**good, "verdict": "ok"}]
    cases.append({**good, "verdict": "error", "error": "tokenizer not found"})
    cases.append({**good, "tasks": ["niah_multikey_3"]})  # not what was asked
    cases.append({**good, "buckets": []})
    contradicting = copy.deepcopy(lc_block(COLLAPSED))
    contradicting["verdict"] = "pass"  # a pass whose buckets failed
    cases.append(contradicting)
    no_rows = copy.deepcopy(good)
    del no_rows["buckets"][0]["paired"]
    cases.append(no_rows)
    fail_without_failing_row = copy.deepcopy(good)
    fail_without_failing_row["verdict"] = "fail"
    cases.append(fail_without_failing_row)
    for block in cases:
        got = _broken(block)
        assert (got.outcome, got.reason) == (Outcome.ERROR, "LongContextError"), block
    assert "no long_context block" in _broken(None).message
    assert "tokenizer not found" in _broken(cases[4]).message
    assert assess_long_context(None, as_summary({**GSM8K_PASS})).outcome is Outcome.SKIPPED


def test_lengths_other_than_the_spec_lists_fail_closed() -> None:
    task = LongContextTask(items=30, margin_pp=15.0, context_lengths=(8192, 16384, 32768))
    got = assess_long_context(
        task, as_summary({**GSM8K_PASS, "long_context": lc_block(SOUND, task)})
    )
    assert (got.outcome, got.reason) == (Outcome.ERROR, "LongContextError")
    assert "not [8192, 16384, 32768]" in got.message


# --- the divergence decision --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kl", "outcome", "reason"),
    [
        (GateMode.OFF, 3.0, Outcome.SKIPPED, "GateOff"),
        (GateMode.WARN, 6e-4, Outcome.SUCCESSFUL, "DivergenceWithinFloor"),
        (GateMode.REQUIRE, 6e-4, Outcome.SUCCESSFUL, "DivergenceWithinFloor"),
        (GateMode.WARN, 3.0, Outcome.WARNING, "DivergenceFlagged"),
        (GateMode.REQUIRE, 3.0, Outcome.FAILED, "DivergenceFlagged"),
    ],
)
def test_divergence_modes(mode: GateMode, kl: float, outcome: Outcome, reason: str) -> None:
    got = assess_divergence(
        DivergenceGate(mode=mode), as_summary({**GSM8K_PASS, "divergence": div_block(kl)})
    )
    assert (got.gate, got.outcome, got.reason) == ("divergence", outcome, reason)
    if reason == "DivergenceFlagged":
        assert got.message.startswith(
            "token divergence above 10x the A/A floor from position bucket 16,384-32,768: "
            "mean KL 3 vs floor 0.0003, top-1 agreement 20% vs 98%"
        )


@pytest.mark.parametrize(("mode", "outcome"), [(GateMode.WARN, Outcome.WARNING),
                                               (GateMode.REQUIRE, Outcome.ERROR)])  # fmt: skip
def test_divergence_that_did_not_run_never_passes(mode: GateMode, outcome: Outcome) -> None:
    gate = DivergenceGate(mode=mode)
    errored = summary_header(ScreenOptions())
    errored["error"] = "candidate endpoint: HTTP 400: logprobs above max_logprobs"
    lying = div_block(3.0)
    lying["verdict"] = "pass"  # a pass whose bucket is flagged
    empty = div_block(6e-4)
    empty["buckets"] = []
    for block in (None, {"kind": "x", "verdict": "pass"}, errored, lying, empty):
        got = assess_divergence(gate, as_summary({**GSM8K_PASS, "divergence": block}))
        assert (got.outcome, got.reason) == (outcome, "DivergenceUnknown"), block
    got = assess_divergence(gate, as_summary({**GSM8K_PASS, "divergence": errored}))
    assert "max_logprobs" in got.message


# --- the transition: the worst task decides ---------------------------------------------------

READY = PodHealth(True, ready=True, ip="127.0.0.9")


def evaluated(gates: dict[str, Any], summary: dict[str, Any]) -> steps.Step:
    spec = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "gates": gates})
    obs = Observation(
        control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(summary)
    )
    return machine.next_step(spec, State(phase=Phase.EVALUATING, eval_attempts=1), obs, poll_s=2.0)


GATES = {
    "accuracy": {"longContext": {"items": 30, "margin": 15}},
    "divergence": {"mode": "require"},
}


def test_gsm8k_pass_long_context_fail_rolls_back_naming_the_bucket() -> None:
    summary = {**GSM8K_PASS, "long_context": lc_block(COLLAPSED), "divergence": div_block(3.0)}
    s = evaluated(GATES, summary)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "LongContextRegressed")
    assert "long-context bucket 16k-32k" in s.message
    gates = {g.gate: g for g in s.gates}
    assert gates["accuracy"].outcome is Outcome.SUCCESSFUL  # GSM8K alone is blind
    assert gates["divergence"].reason == "DivergenceFlagged"
    assert s.verdict is not None and [r.reason for r in s.verdict.reasons] == [
        "LongContextRegressed",
        "DivergenceFlagged",
    ]
    assert {e.reason for e in s.events} >= {"LongContextRegressed", "RolledBack",
                                           "DivergenceFlagged"}  # fmt: skip


def test_sound_candidate_passes_all_three() -> None:
    summary = {**GSM8K_PASS, "long_context": lc_block(SOUND), "divergence": div_block(6e-4)}
    s = evaluated(GATES, summary)
    assert s.phase is Phase.PROMOTING
    assert {g.gate: g.outcome for g in s.gates} == {
        "accuracy": Outcome.SUCCESSFUL,
        "longContext": Outcome.SUCCESSFUL,
        "divergence": Outcome.SUCCESSFUL,
        "speed": Outcome.SKIPPED,
    }


def test_a_warn_screen_flag_promotes_with_a_warning_event() -> None:
    gates = {**GATES, "divergence": {"mode": "warn"}}
    summary = {**GSM8K_PASS, "long_context": lc_block(SOUND), "divergence": div_block(3.0)}
    s = evaluated(gates, summary)
    assert s.phase is Phase.PROMOTING
    assert [e.reason for e in s.events if e.warning] == ["DivergenceFlagged"]
    assert s.verdict is not None and "warnings: token divergence" in s.verdict.message


def test_asked_for_long_context_but_eval_printed_gsm8k_only_rolls_back() -> None:
    s = evaluated(GATES, {**GSM8K_PASS, "divergence": div_block(6e-4)})
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "LongContextError")
    s = evaluated(GATES, {**GSM8K_PASS, "long_context": lc_block(SOUND)})
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "DivergenceUnknown")


def test_gsm8k_failure_still_leads() -> None:
    summary = {**GSM8K_PASS, "verdict": "fail", "long_context": lc_block(COLLAPSED),
               "divergence": div_block(3.0)}  # fmt: skip
    s = evaluated(GATES, summary)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "AccuracyRegressed")


# --- what the eval Job is given -----------------------------------------------------------------


def test_max_model_len_is_the_controls_logged_one() -> None:
    from kvgate.controller.act import engine_max_model_len

    def of(arms: object) -> RolloutStatus:
        return RolloutStatus.from_dict({"arms": arms})

    arms = {"control": {"scan": {"capacity": {"max_model_len": 32768}}}}
    assert engine_max_model_len(of(arms)) == 32768
    for bad in ({}, {"control": {"scan": None}}, {"control": {"scan": {"capacity": {
            "max_model_len": True}}}}, {"control": {"scan": {"capacity": {"max_model_len": -1}}}}):  # fmt: skip
        assert engine_max_model_len(of(bad)) is None


def test_a_hub_tokenizer_gets_the_rollouts_token_by_reference() -> None:
    from kvgate.controller.act import eval_secret_env

    secret = {"tokenSecretRef": {"name": "hf", "key": "tok"}}

    def spec(lc: dict[str, Any] | None, model: dict[str, Any]) -> RolloutSpec:
        gates = {"accuracy": {"longContext": lc}} if lc is not None else {}
        return RolloutSpec.from_dict({"targetRef": {"name": "q"}, "model": model, "gates": gates})

    assert eval_secret_env(spec({}, secret), "Qwen/Qwen3-8B") == {"HF_TOKEN": ("hf", "tok")}
    assert eval_secret_env(spec({"tokenizer": "Qwen/Qwen3-8B"}, secret), "/m") == {
        "HF_TOKEN": ("hf", "tok")
    }
    assert eval_secret_env(spec(None, secret), "Qwen/Qwen3-8B") == {}  # no long context
    assert eval_secret_env(spec({}, {}), "Qwen/Qwen3-8B") == {}  # no token
    assert eval_secret_env(spec({"tokenizer": "/models/tok"}, secret), "Qwen/Qwen3-8B") == {}
    job = manifests.build_eval_job(
        rollout="r", namespace="n", attempt=1, image="i", command=["kvgate"], env={"A": "1"},
        resources={}, deadline_s=60, config_hash="h", secret_env={"HF_TOKEN": ("hf", "tok")},
    )  # fmt: skip
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "A", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}},
    ]


# --- the report -----------------------------------------------------------------------------------


def test_report_shows_the_bucket_tables_and_the_plot() -> None:
    from kvgate import report

    rollout = {
        "metadata": {"name": "r", "namespace": "n"},
        "spec": {"targetRef": {"name": "qwen"}},
        "status": {
            "phase": "RolledBack",
            "accuracy": {
                **GSM8K_PASS,
                "long_context": lc_block(COLLAPSED),
                "divergence": div_block(3.0),
            },
        },
    }
    text = report.render_text(rollout)
    lines = text.splitlines()
    start = lines.index("Long context (paired, per context length)")
    table = lines[start + 1 : start + 5]
    assert table[0].split() == ["context", "control", "candidate", "recovery", "at", "least",
                                "verdict"]  # fmt: skip
    assert table[1].split()[:3] == ["8,192", "tokens", "96.7%"]
    assert "fail (worse_than_margin)" in table[3] and table[3].split()[:4] == [
        "32,768", "tokens", "96.7%", "3.3%"
    ]  # fmt: skip
    start = lines.index("Token divergence (teacher-forced, per position bucket)")
    rows = lines[start + 2 : start + 6]
    assert [r.split()[0] for r in rows] == ["0-512", "512-1024", "1024-16384", "16384-32768"]
    assert [r.rstrip().endswith("FLAG") for r in rows] == [False, False, False, True]
    page = report.render_html(rollout)
    assert "aria-label='score against context length'" in page and page.count("<polyline") == 2
    assert ">32k</text>" in page and "16384-32768" in page
    # no blocks: no sections, no plot
    plain = {**rollout, "status": {"phase": "Promoted", "accuracy": GSM8K_PASS}}
    assert "Long context" not in report.render_text(plain)
    assert "score against context length" not in report.render_html(plain)


def test_a_task_that_errored_is_retried_then_rolls_back() -> None:
    spec = RolloutSpec.from_dict(
        {"targetRef": {"name": "qwen"}, "gates": GATES, "canary": {"evalRetries": 1}}
    )
    errored = lc_block(SOUND)
    errored.update(verdict="error", error="candidate endpoint: ReadTimeout", buckets=[])
    summary = {**GSM8K_PASS, "long_context": errored, "divergence": div_block(6e-4)}
    obs = Observation(
        control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(summary)
    )
    first = machine.next_step(spec, State(phase=Phase.EVALUATING, eval_attempts=1), obs, poll_s=2.0)
    assert (first.phase, first.reason, first.eval_attempts) == (Phase.EVALUATING, "EvalRetry", 2)
    assert "long-context task: candidate endpoint: ReadTimeout" in first.message
    last = machine.next_step(spec, State(phase=Phase.EVALUATING, eval_attempts=2), obs, poll_s=2.0)
    assert (last.phase, last.reason) == (Phase.ROLLED_BACK, "EvalError")
    # a required screen that errored is retried the same way; a warn-mode one is not
    screen_error = summary_header(ScreenOptions())
    screen_error["error"] = "HTTP 400"
    broken = {**GSM8K_PASS, "long_context": lc_block(SOUND), "divergence": screen_error}
    obs = Observation(
        control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(broken)
    )
    again = machine.next_step(spec, State(phase=Phase.EVALUATING, eval_attempts=1), obs, poll_s=2.0)
    assert (again.reason, "divergence screen: HTTP 400" in again.message) == ("EvalRetry", True)
    warn = RolloutSpec.from_dict(
        {"targetRef": {"name": "qwen"}, "gates": {**GATES, "divergence": {"mode": "warn"}}}
    )
    step = machine.next_step(warn, State(phase=Phase.EVALUATING, eval_attempts=1), obs, poll_s=2.0)
    assert step.phase is Phase.PROMOTING  # warn: the screen's error is a warning only
