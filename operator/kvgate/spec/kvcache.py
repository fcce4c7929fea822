"""What KV policy does a KVCacheRollout ask for? `spec.kvCache`, read and checked.

    kvCache:
      format: int8_per_token_head     # one of the engine's own --kv-cache-dtype names
      engineVersion: "0.32.0"         # the candidate's engine version: the format must exist there
      skipLayers: ["0", "5", "sliding_window"]  # vLLM --kv-cache-dtype-skip-layers, any number
      scaleMode: dynamic-per-token-head     # optional; must be the format's own (kvgate.engines.kvformats)
      control:
        format: auto                  # what production (the control) runs: `auto` reads it from
                                      # the container and the checkpoint; a name states it, and
                                      # preflight fails the rollout when production runs another

`spec.kvCacheDtype` (v1alpha1) is one documented alias of `kvCache.format`: alone it means
`kvCache: {format: <it>}`. Beside `kvCache`, it must name the same format or be the CRD's
default (`fp8`, which the apiserver writes into every object); anything else is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvgate.engines import kvformats
from kvgate.engines import versions as engine_versions
from kvgate.errors import SpecError, brief
from kvgate.spec.reader import SpecReader

LEGACY_DEFAULT: Final = "fp8"  # the CRD's default for kvCacheDtype
SKIP_LAYERS_FLAG: Final = "--kv-cache-dtype-skip-layers"
SLIDING_WINDOW: Final = "sliding_window"
# The layers of the largest config kvgate reads (kvgate.checkpoint.capacity.MAX_LAYERS, which sits above
# this module; a unit test holds them equal): no index reaches it, and no more skipLayers
# entries than that are read (the CRD's maxItems is the same).
MAX_LAYERS: Final = 4096
MAX_SKIP_ENTRIES: Final = MAX_LAYERS
# scaleMode spellings a user may state, per the format's own mode (kvgate.engines.kvformats): FP8 with
# checkpoint scales may also be run per attention head (llm-compressor attn_head) or at 1.0.
_STATABLE: Final = {
    kvformats.SCALES_CHECKPOINT: ("checkpoint", "per-head", "none"),
    kvformats.SCALES_DYNAMIC: (kvformats.SCALES_DYNAMIC,),
    kvformats.SCALES_NONE: ("none",),
    kvformats.SCALES_BLOCK: (kvformats.SCALES_BLOCK,),
    kvformats.SCALES_PACKED: (kvformats.SCALES_PACKED,),
}


@dataclass(frozen=True, slots=True)
class KVCachePolicy:
    """The candidate's KV format and how it is run; `control_format` what the spec states
    production (the control arm) runs, `auto` when it states nothing."""

    format: str = LEGACY_DEFAULT
    policy_class: str = kvformats.FP8
    scale_mode: str = kvformats.SCALES_CHECKPOINT
    skip_layers: tuple[str, ...] = ()
    engine_version: str | None = None
    control_format: str = "auto"

    def candidate_args(self) -> tuple[str, ...]:
        """Flags beside --kv-cache-dtype the candidate needs: vLLM's skip list as one flag and
        its values (`--kv-cache-dtype-skip-layers 0 5 sliding_window`), the only form that
        carries several: the flag is `nargs="+"` (vllm/engine/arg_utils.py:252 and :1384 in
        0.32.0); `--flag=0 5` is refused ("unrecognized arguments: 5") and `--flag=0,5` is one
        entry '0,5' that names no layer (vllm/model_executor/layers/attention/attention.py:312
        compares `str(layer_idx)`); a second `--flag` replaces the first ("Found duplicate
        keys"). Read from the CPU build of 0.32.0's parser; tests/unit/test_skip_layers.py."""
        return (SKIP_LAYERS_FLAG, *self.skip_layers) if self.skip_layers else ()


def read_kv_cache(r: SpecReader, engine: str | None, legacy: str | None) -> KVCachePolicy:
    """`spec.kvCache` (or the alias `spec.kvCacheDtype` = `legacy`) for `engine` (None: auto,
    the format must be one some engine knows). Errors are recorded on `r`, not raised."""
    k = r.section("kvCache")
    engines = (engine,) if engine else (engine_versions.VLLM, engine_versions.SGLANG)
    if not k.present:
        name = legacy or LEGACY_DEFAULT  # its enum and the sglang rule are checked in spec
        fmt = next(
            (kvformats.FORMATS[e, name] for e in engines if (e, name) in kvformats.FORMATS), None
        )
        return KVCachePolicy(
            format=name,
            policy_class=fmt.policy_class if fmt else kvformats.FP8,
            scale_mode=fmt.scale_mode if fmt else kvformats.SCALES_CHECKPOINT,
        )
    name = k.string("format", required=True) or LEGACY_DEFAULT
    if legacy is not None and legacy not in (name, LEGACY_DEFAULT):
        r.error(
            "kvCacheDtype",
            f"'{legacy}' contradicts kvCache.format '{name}': kvCacheDtype is the v1alpha1 alias "
            "of kvCache.format; set kvCache.format alone",
        )
    fmt = _lookup(k, "format", name, engines)
    version = k.string("engineVersion")
    if version is not None and engine is None:
        k.error("engineVersion", "needs spec.engine (vllm or sglang) to know whose version")
    elif version is not None and fmt is not None and engine is not None:
        try:  # an unreadable version is a ValueError of its parse, inside
            kvformats.require(engine, version, name, field="format")
        except SpecError as exc:
            k.error("format", str(exc).removeprefix("format: "))
        except ValueError as exc:
            k.error("engineVersion", str(exc))
    skip = read_skip_layers(k)
    if skip and engine == engine_versions.SGLANG:
        k.error("skipLayers", "sglang has no --kv-cache-dtype-skip-layers; it is a vLLM flag")
    mode = fmt.scale_mode if fmt else kvformats.SCALES_CHECKPOINT
    stated = k.string("scaleMode")
    if stated is not None and fmt is not None:
        allowed = _STATABLE[fmt.scale_mode]
        if stated not in allowed:
            k.error(
                "scaleMode",
                f"'{stated}' is not how {fmt.name} is scaled; use {' or '.join(allowed)}",
            )
        else:
            mode = stated
    control = k.section("control")
    control_format = control.string("format") or "auto"
    _lookup(control, "format", control_format, engines)
    return KVCachePolicy(
        format=name,
        policy_class=fmt.policy_class if fmt else kvformats.FP8,
        scale_mode=mode,
        skip_layers=skip,
        engine_version=version,
        control_format=control_format,
    )


def read_skip_layers(k: SpecReader) -> tuple[str, ...]:
    """`kvCache.skipLayers`: layer indices (decimal strings, as vLLM compares them) and/or
    `sliding_window`, each at most once. The first bad entry is one error naming it (a hostile
    list of 10,000 junk entries is one line, not 10,000); () then. Whether each index is a layer
    of the model is checked once its config is read (`kvgate.checkpoint.capacity`, at preflight)."""
    entries = k.list_of(
        "skipLayers",
        str,
        "a string; write a layer index as a string ('3'), as vLLM's "
        "--kv-cache-dtype-skip-layers reads it",
        at_most=MAX_SKIP_ENTRIES,
        why="; give layer indices and/or sliding_window, one per layer of the largest model "
        "kvgate reads, e.g. ['0', 'sliding_window']",
    )
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        problem = _skip_entry_problem(entry, seen)
        if problem is not None:
            k.error(f"skipLayers[{i}]", problem)
            return ()
        seen[entry] = i
    return tuple(entries)


def _skip_entry_problem(entry: str, seen: dict[str, int]) -> str | None:
    shown = brief(entry, 40)  # repr: one line whatever the entry holds
    if entry in seen:
        return f"{shown} is already skipLayers[{seen[entry]}]; give each layer once"
    if entry == SLIDING_WINDOW:
        return None
    if entry.startswith("-") and entry[1:].isascii() and entry[1:].isdecimal():
        return f"{shown} is negative; layer indices count from 0"
    if not (entry.isascii() and entry.isdecimal()):
        return f"{shown} is neither a layer index nor sliding_window"
    if len(entry) > 1 and entry.startswith("0"):
        return f"{shown} names no layer: vLLM matches str(layer_index), so write '{int(entry)}'"
    if len(entry) > len(str(MAX_LAYERS)) or int(entry) >= MAX_LAYERS:  # no int() of 10k digits
        return f"{shown} is past any model's layers (kvgate reads at most {MAX_LAYERS})"
    return None


def _lookup(
    r: SpecReader, key: str, name: str, engines: tuple[str, ...]
) -> kvformats.KVFormat | None:
    """The format `name` of the first of `engines` that has it; else an error on `key`."""
    for engine in engines:
        if (engine, name) in kvformats.FORMATS:
            return kvformats.FORMATS[engine, name]
    known = sorted({n for e, n in kvformats.FORMATS if e in engines})
    r.error(key, f"'{name[:40]}' is not a KV cache format of {' or '.join(engines)}; use one of "
            + ", ".join(known))  # fmt: skip
    return None
