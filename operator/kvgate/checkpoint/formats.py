"""What a KV format holds: bytes per token, tokens per GiB, pool tokens and the capacity gain
over a control format, per engine version and attention backend (kvgate.engines.kvformats for the
formats, kvgate.checkpoint.capacity for the model's layout and vLLM's pool accounting).

    >>> gain = expected_capacity_gain(layout, "auto", "fp8_per_token_head")
    >>> round(gain, 3)   # 2 x 128 bytes + 8 of fp32 scales a head instead of 2 x 256
    1.939
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvgate.checkpoint.capacity import DEFAULT_BLOCK_SIZE, GIB, KVLayout, vllm_pool
from kvgate.engines import kvformats
from kvgate.engines import versions as engine_versions
from kvgate.errors import UnsupportedError


def expected_capacity_gain(
    layout: KVLayout,
    control: str,
    candidate: str,
    *,
    skip_layers: Sequence[str] = (),
    engine: str = engine_versions.VLLM,
    backend: str | None = None,
) -> float:
    """Tokens the candidate's format holds per token of the control's, in the same memory."""
    control_bytes = layout.bytes_per_token(control, engine=engine, backend=backend)
    candidate_bytes = layout.bytes_per_token(
        candidate, skip_layers=skip_layers, engine=engine, backend=backend
    )
    return control_bytes / candidate_bytes


def format_capacity(
    layout: KVLayout,
    name: str,
    *,
    engine: str = engine_versions.VLLM,
    version: tuple[int, ...] | None = None,
    control: str = "auto",
    skip_layers: Sequence[str] = (),
    backend: str | None = None,
    memory_bytes: int | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = 2048,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kernel_block: int | None = None,
) -> dict[str, Any]:
    """One format's row: its class and scale mode, whether `version` offers it (with the floor
    when not), bytes per token (sidecars and skipped layers in), tokens per GiB, the gain over
    `control` and, given memory (and max_model_len, for vLLM), pool tokens."""
    fmt = kvformats.lookup(engine, name)
    row: dict[str, Any] = fmt.to_dict()
    if version is not None:
        offered = name.lower() in engine_versions.facts_for(engine, version).kv_cache_dtypes
        row["offered"] = offered
        if not offered:
            first = kvformats.floor(engine, fmt.name)
            row["floor"] = engine_versions.dotted(first) if first else None
            shown = engine_versions.dotted(version)
            row["note"] = f"{engine} {shown} does not offer {fmt.name}; " + row["note"]
    try:
        per_token = layout.bytes_per_token(
            name, skip_layers=skip_layers, engine=engine, backend=backend
        )
    except UnsupportedError as exc:
        row["error"] = str(exc)
        return row
    skipped = layout.skipped_layers(name, skip_layers=skip_layers, engine=engine)
    row |= {
        "skipped_layers": sorted(skipped),
        "kv_bytes_per_token": per_token,
        "tokens_per_gib": round(GIB / per_token, 1),
        "capacity_gain": expected_capacity_gain(
            layout, control, name, skip_layers=skip_layers, engine=engine, backend=backend
        ),
    }
    if memory_bytes is not None:
        row["pool_tokens"] = layout.pool_tokens(
            memory_bytes, name, block_size, skip_layers=skip_layers, engine=engine, backend=backend
        )
    if (
        memory_bytes is not None
        and max_model_len is not None
        and engine == engine_versions.VLLM
        and layout.attention != "mla"
    ):
        try:
            row["vllm_pool"] = vllm_pool(
                layout,
                memory_bytes,
                name,
                max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens,
                block_size=block_size,
                version=version or engine_versions.NEWEST[engine_versions.VLLM],
                skip_layers=skip_layers,
                kernel_block=kernel_block,
                backend=backend,
            ).to_dict()
        except UnsupportedError as exc:
            row["vllm_pool_error"] = str(exc)
    return row
