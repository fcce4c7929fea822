"""kvgate.judge.crash: a crashed canary's message leads with its cause; the report reads it back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from evidence import as_scan

from kvgate.engines import versions as engine_versions
from kvgate.evidence import logs
from kvgate.judge import crash
from kvgate.judge.remedy import Remedy

L4_LOG = (
    Path(__file__).resolve().parents[1] / "data/logs/vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
)


def l4_fix(**kw: Any) -> Remedy:
    found = engine_versions.remedy_for("vllm", "0.13.0", "attention-build-failed")
    assert found is not None
    return Remedy("attention-build-failed", "vllm", "0.13.0", *found, **kw)


def test_the_l4_crash_leads_with_its_cause_and_cuts_the_ninja_line() -> None:
    scan = logs.scan_log(L4_LOG.read_text()).to_dict()
    got = crash.describe("candidate", as_scan(scan), "exited with code 1 (Error)", l4_fix())
    assert got.headline == (
        "candidate crashed: the attention backend could not JIT-compile its FP8 KV kernels "
        "(FlashInfer without nvcc/ninja in the image: the L4 trap) (attention-build-failed)"
    )
    # the generic "EngineCore failed to start." is not the cause; the ninja line is, cut short
    assert got.raw is not None and got.raw.startswith("subprocess.CalledProcessError: Command ")
    assert len(got.raw) == crash.RAW_CHARS and got.raw.endswith("…")
    assert got.where == (
        "set spec.extraArgs: [--attention-backend, TRITON_ATTN] and spec.extraEnv: "
        '[{name: VLLM_USE_FLASHINFER_SAMPLER, value: "0"}]; ' + crash.AUTO_HINT
    )
    assert crash.read(got.message) == got


def test_an_unclassified_crash_leads_with_how_the_pod_ended() -> None:
    tail = {"findings": [], "tail": ["x", "OSError: [Errno 98] Address already in use"]}
    got = crash.describe("candidate", as_scan(tail), "exited with code 1 (Error)")
    assert got.message == (
        "candidate crashed: exited with code 1 (Error), cause not classified; "
        "log: OSError: [Errno 98] Address already in use"
    )
    assert crash.describe("control", None, "").message == "control crashed: cause not classified"
    assert crash.read(got.message) == got


@pytest.mark.parametrize(
    ("kw", "note", "auto_offered"),
    [
        ({}, "", True),
        ({"auto": True, "already_applied": True}, crash.APPLIED_NOTE, False),
    ],
)
def test_auto_is_offered_only_for_a_remedy_kvgate_may_still_apply(
    kw: dict[str, Any], note: str, auto_offered: bool
) -> None:
    got = crash.describe("candidate", None, "exited with code 1", l4_fix(), **kw)
    assert got.note == note
    assert (crash.AUTO_HINT in (got.where or "")) is auto_offered
    assert crash.read(got.message) == got


def test_a_refused_remedy_says_so_and_offers_no_auto() -> None:
    fix = l4_fix(refused="VLLM_USE_FLASHINFER_SAMPLER is not an allowed variable")
    got = crash.describe("candidate", None, "exited with code 1", fix, auto=True)
    assert got.note == (
        " (not applied, the allowlist refuses it: VLLM_USE_FLASHINFER_SAMPLER is not an allowed "
        "variable)"
    )
    assert got.where is not None and crash.AUTO_HINT not in got.where
    assert crash.read(got.message) == got
    # with remediation off the refusal is no news, but auto is still not offered
    off = crash.describe("candidate", None, "exited with code 1", fix)
    assert off.note == "" and off.where is not None and crash.AUTO_HINT not in off.where


def test_an_env_only_remedy_names_spec_extra_env() -> None:
    fix = dataclasses.replace(l4_fix(), args=(), env={"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"})
    got = crash.describe("candidate", None, "exited with code 1", fix)
    assert got.where == (
        'set spec.extraEnv: [{name: VLLM_ATTENTION_BACKEND, value: "TRITON_ATTN"}]; '
        + crash.AUTO_HINT
    )


def test_the_control_gets_no_where() -> None:
    scan = {"findings": [{"code": "out-of-memory", "severity": "error", "text": "CUDA OOM",
                          "hint": "lower --max-model-len"}]}  # fmt: skip
    got = crash.describe("control", as_scan(scan), "exited with code 1")
    assert got.message == (
        "control crashed: the GPU ran out of memory (out-of-memory); remedy: lower "
        "--max-model-len; log: CUDA OOM"
    )


@pytest.mark.parametrize(
    "message",
    ["", "candidate pod crashed: X", "waiting for canary pods Ready", "crashed: X"],
)
def test_read_answers_none_for_other_messages(message: str) -> None:
    assert crash.read(message) is None


def test_the_where_line_pastes_into_the_spec_as_the_crd_takes_it() -> None:
    """first-hour-2 N11: `spec.extraEnv: {name: ..., value: '0'}` was a mapping; the CRD's
    extraEnv is a list, so the pasted line was refused by the schema."""
    import yaml

    text = crash.where("candidate", ["--attention-backend TRITON_ATTN"],
                       {"VLLM_USE_FLASHINFER_SAMPLER": "0", "X": "a: b"}, offer_auto=False)  # fmt: skip
    assert text is not None
    env = text.split("spec.extraEnv: ", 1)[1]
    assert yaml.safe_load(f"extraEnv: {env}") == {
        "extraEnv": [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"},
                     {"name": "X", "value": "a: b"}]
    }  # fmt: skip
    args = text.split("spec.extraArgs: ", 1)[1].split(" and ", 1)[0]
    assert yaml.safe_load(f"extraArgs: {args}") == {
        "extraArgs": ["--attention-backend", "TRITON_ATTN"]
    }
