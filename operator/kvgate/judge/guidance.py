"""What does the engine's own guidance say of this rollout? vLLM's FP8 study's cautions
(`kvgate.checkpoint.advice`) for the checkpoint's config and the spec, as the status keeps them,
and the one Event line that posts them. Advice, never a gate. Pure.
"""

from __future__ import annotations

from kvgate.checkpoint import advice as fp8advice
from kvgate.engines import versions as engine_versions
from kvgate.records.status import CheckpointRecord, GuidanceRecord
from kvgate.spec.rollout import RolloutSpec


def for_rollout(
    spec: RolloutSpec, engine: str | None, checkpoint: CheckpointRecord
) -> tuple[GuidanceRecord, ...]:
    """vLLM's FP8-study cautions that apply, from the checkpoint's config and the spec (none
    without the config). The sliding-window note names a vLLM flag, so an SGLang rollout (no
    --kv-cache-dtype-skip-layers) gets the other notes only. No typical context: the spec
    states none (the CLI's `kvgate preflight --typical-context` takes one)."""
    if checkpoint.head_dim is None:
        return ()
    gain = spec.capacity_gain.throughput_gain
    sglang = (engine or str(spec.engine)) == engine_versions.SGLANG
    notes = fp8advice.fp8_guidance(
        head_dim=checkpoint.head_dim,
        sliding_window_layers=0 if sglang else checkpoint.sliding_window_layers or 0,
        kv_layers=checkpoint.kv_layers or 0,
        ttft_objective=gain is not None and gain.ttft_p99_ms is not None,
        skip_layers=spec.kv_cache.skip_layers,
    )
    return tuple(GuidanceRecord(n.code, n.message, n.source) for n in notes)


def event_line(notes: tuple[GuidanceRecord, ...]) -> str:
    """The advice as one Event line: each note's code and message, then the source once."""
    text = "; ".join(f"{n.code}: {n.message}" for n in notes)
    return f"{text} (advice, not a gate; source: {notes[0].source})"
