"""Rollouts at the end states (and the running ones) a report is read in, for the report tests.

Built from the report tests' own fixtures (`test_report.PROMOTED`, `ROLLED_BACK`) and, for the
L4 crash, from the real vLLM 0.13 log of FlashInfer failing to JIT-compile on an L4: its scan
and the message the operator writes for it (`kvgate.judge.crash`: the cause, the remedy, where it
goes, and the ninja command with its ~200-character cache path, cut short).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import test_report
from evidence import as_scan

from kvgate.engines import versions as engine_versions
from kvgate.evidence import logs
from kvgate.judge import crash
from kvgate.judge.remedy import Remedy

DATA = Path(__file__).resolve().parents[1] / "data"
L4_LOG = DATA / "logs" / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
STARTED = "2026-12-01T10:00:00Z"


def _rollout(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(test_report.PROMOTED)
    body["spec"].update(spec)
    body["status"] = status
    return body


def l4_crash() -> dict[str, Any]:
    """The candidate crashed building FlashInfer's FP8 kernels; kvgate knows the remedy."""
    scan = logs.scan_log(L4_LOG.read_text()).to_dict()
    found = engine_versions.remedy_for("vllm", "0.13.0", "attention-build-failed")
    assert found is not None
    fix = Remedy("attention-build-failed", "vllm", "0.13.0", *found)
    message = crash.describe("candidate", as_scan(scan), "exited with code 1 (Error)", fix).message
    control = copy.deepcopy(test_report.ROLLED_BACK["status"]["arms"]["control"])
    return _rollout(
        {
            "phase": "RolledBack",
            "reason": "CanaryCrashed",
            "message": message,
            "startedAt": STARTED,
            "finishedAt": "2026-12-01T10:04:12Z",
            "gates": {
                "canary": {"outcome": "Failed", "reason": "CanaryCrashed", "message": message}
            },
            "arms": {"control": control, "candidate": {"scan": scan}},
            "recommendedArgs": ["vllm", "serve", "Qwen/Qwen3-8B", "--kv-cache-dtype", "fp8"],
        }
    )


REGRESSED_SUMMARY: dict[str, Any] = {
    "kind": "kvgate.eval/summary",
    "verdict": "fail",
    "task": "gsm8k",
    "margin": 0.02,
    "confidence": 0.95,
    "fail_confidence": 0.975,
    "questions_used": 300,
    "questions_planned": 600,
    "stopped_early": True,
    "looks": 3,
    "looks_planned": 6,
    "control": {"correct": 266, "n": 300, "accuracy": 0.8867, "wilson95": [0.845, 0.918]},
    "candidate": {"correct": 246, "n": 300, "accuracy": 0.82, "wilson95": [0.773, 0.859]},
    "paired": {
        "both": 240,
        "control_only": 26,
        "candidate_only": 6,
        "neither": 28,
        "difference": -0.0667,
        "tango95": [-0.101, -0.034],
        "mcnemar_p": 0.00049,
        "lower_bound": -0.112,
        "upper_bound": -0.021,
    },
    "bounds": {
        "lower": -0.112,
        "lower_confidence": 0.95,
        "upper": -0.021,
        "upper_confidence": 0.975,
        "look": 3,
        "look_adjusted": True,
    },
    "largest_loss_ruled_out": 0.112,
    "smallest_loss_shown": 0.021,
    "advice": {"questions_needed": 1277},
}


def regressed() -> dict[str, Any]:
    """The accuracy gate showed the candidate worse: rolled back."""
    status = copy.deepcopy(test_report.PROMOTED["status"])
    status.update(
        phase="RolledBack",
        reason="AccuracyRegressed",
        message="candidate worse: 82.0% vs control 88.7%, difference -6.7 pp; shown worse by at "
        "least 2.1 pp (97.5% one-sided, adjusted for 3 looks) (margin 2 pp, n=300)",
        accuracy=copy.deepcopy(REGRESSED_SUMMARY),
        startedAt=STARTED,
        finishedAt="2026-12-01T10:31:40Z",
        verdict={"decision": "RollBack", "outcome": "Failed", "message": "accuracy regressed"},
    )
    return _rollout(status)


def promoted() -> dict[str, Any]:
    status = copy.deepcopy(test_report.PROMOTED["status"])
    status.update(
        startedAt=STARTED,
        finishedAt="2026-12-01T10:52:03Z",
        verdict={"decision": "Promote", "outcome": "Successful", "message": "every gate passed"},
    )
    return _rollout(status)


APPROVE = "all gates passed; approve with annotation kvgate.io/approve=18cab288d5712cfa"


def awaiting_approval() -> dict[str, Any]:
    """Manual mode: every gate passed, the Deployment waits for an approval."""
    status = copy.deepcopy(test_report.PROMOTED["status"])
    status.update(
        phase="AwaitingApproval",
        reason="AwaitingApproval",
        message=APPROVE,
        startedAt=STARTED,
        phaseSince="2026-12-01T10:48:00Z",
        approvalExpiresAt="2026-12-04T10:48:00Z",  # phaseSince + the default 72 h
        configHash="18cab288d5712cfa",
        verdict={"decision": "Hold", "outcome": "Successful", "message": APPROVE},
    )
    status["conditions"][0] = {
        "type": "Ready",
        "status": "False",
        "reason": "AwaitingApproval",
        "message": "waiting",
    }
    return _rollout(status, promotion={"mode": "manual"})


def canary() -> dict[str, Any]:
    """Both canary pods starting; nothing measured yet."""
    return _rollout(
        {
            "phase": "Canary",
            "reason": "WaitingForCanary",
            "message": "waiting for canary pods Ready (95/900 s): control pod Pending, "
            "candidate pod Running",
            "startedAt": STARTED,
            "phaseSince": "2026-12-01T10:01:00Z",
            "recommendedArgs": ["vllm", "serve", "Qwen/Qwen3-8B", "--kv-cache-dtype", "fp8"],
        }
    )


def evaluating() -> dict[str, Any]:
    """The eval Job has taken its second look of five."""
    status = copy.deepcopy(canary()["status"])
    status.update(
        phase="Evaluating",
        reason="Evaluating",
        message="eval attempt 1 running: look 2/5, 200 of 500 questions, candidate -0.5 pp so "
        "far; 8 min elapsed, at most 60 min an attempt",
        progress="200/500 q, look 2/5, -0.5 pp",
        phaseSince="2026-12-01T10:04:00Z",
        eval={
            "attempt": 1,
            "progress": {
                "kind": "kvgate.eval/progress",
                "look": 2,
                "looks_planned": 5,
                "questions": 200,
                "difference": -0.005,
            },
        },
    )
    return _rollout(status, accuracy={"questions": 500})


STATES: dict[str, Callable[[], dict[str, Any]]] = {
    "l4-crash": l4_crash,
    "regressed": regressed,
    "promoted": promoted,
    "awaiting-approval": awaiting_approval,
    "canary": canary,
    "evaluating": evaluating,
}
