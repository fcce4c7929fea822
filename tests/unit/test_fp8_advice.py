"""Preflight advice from vLLM's own FP8 study (kvgate.checkpoint.advice, issue 39 item 6): each note
applies at its threshold and not below, states its figure and its source, and `kvgate
preflight` shows them (gemma-3-4b: head_dim 256, 29 of 34 layers sliding-window)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.checkpoint.advice import STUDY, fp8_guidance
from kvgate.cli import main

GEMMA = Path(__file__).resolve().parents[1] / "data" / "configs" / "gemma-3-4b-it.json"
QWEN = GEMMA.with_name("qwen3-8b.json")


def codes(**kw: object) -> list[str]:
    base: dict[str, object] = {"head_dim": 128, "sliding_window_layers": 0, "kv_layers": 36}
    return [g.code for g in fp8_guidance(**{**base, **kw})]  # type: ignore[arg-type]


def test_nothing_applies_to_a_long_context_dense_model() -> None:
    assert codes(typical_context=20_000, ttft_objective=True) == []
    assert codes() == []  # no workload known: no context note


@pytest.mark.parametrize(("tokens", "short"), [(6_999, True), (7_000, False), (1, True)])
def test_the_break_even_is_7k_tokens(tokens: int, short: bool) -> None:
    assert ("ShortContexts" in codes(typical_context=tokens)) is short


def test_head_dim_256_needs_a_ttft_objective_to_matter() -> None:
    assert codes(head_dim=256) == []
    assert codes(head_dim=256, ttft_objective=True) == ["HeadDim256Ttft"]
    assert codes(head_dim=128, ttft_objective=True) == []


def test_sliding_window_layers_suggest_skipping_them_unless_already_skipped() -> None:
    (note,) = fp8_guidance(head_dim=256, sliding_window_layers=29, kv_layers=34)
    assert note.code == "SlidingWindowLayers" and note.source == STUDY
    assert note.message.startswith("29 of 34 layers are sliding-window: keep them in 16 bits")
    assert "`kvCache.skipLayers: [sliding_window]`" in note.message and "+4.8%" in note.message
    assert codes(sliding_window_layers=29, skip_layers=("sliding_window",)) == []
    assert codes(sliding_window_layers=29, skip_layers=("0",)) == ["SlidingWindowLayers"]


def test_every_note_names_the_study_and_its_figure() -> None:
    notes = fp8_guidance(
        head_dim=256, sliding_window_layers=5, kv_layers=30, typical_context=3_000,
        ttft_objective=True,
    )  # fmt: skip
    assert [g.code for g in notes] == ["ShortContexts", "HeadDim256Ttft", "SlidingWindowLayers"]
    assert all(g.to_dict()["source"] == STUDY for g in notes)
    assert "2026-04-22" in STUDY and "When to avoid FP8" in STUDY
    assert "3,000 tokens are under the ~7k-token decode break-even" in notes[0].message
    assert "about 1.6x prefill TTFT" in notes[1].message


def test_preflight_shows_the_studys_notes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["preflight", str(GEMMA), "--typical-context", "2000", "--ttft-objective", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [g["code"] for g in result["fp8_guidance"]] == [
        "ShortContexts", "HeadDim256Ttft", "SlidingWindowLayers",
    ]  # fmt: skip
    skip = ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
    assert main(["preflight", str(GEMMA), "--json", *skip]) == 0
    assert json.loads(capsys.readouterr().out)["fp8_guidance"] == []
    assert main(["preflight", str(QWEN), "--typical-context", "9000"]) == 0
    assert "vllm says" not in capsys.readouterr().out
    assert main(["preflight", str(GEMMA), "--typical-context", "3000"]) == 0
    text = capsys.readouterr().out
    assert "vllm says  typical contexts of 3,000 tokens" in text and STUDY in text
    assert main(["preflight", str(QWEN), "--typical-context", "0"]) == 2
