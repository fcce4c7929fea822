"""Per-version engine knowledge in one place: how a backend is chosen, its names, KV dtypes, flags.

Every row was read out of the published wheels (tests/fixtures_from_wheels.py writes what it
read to tests/data/engine-source/facts.json; tests/unit/test_engine_versions.py checks the
rows below against it). A row holds from its `since` version until the next row's. vLLM: the
wheels of every x.y.0 release from 0.6.0 to 0.33.0, of 0.10.1, 0.10.2 and 0.8.5 were read, so
each `since` is exact to the minor release (other patch releases, e.g. 0.20.1, were not read);
versions before 0.6.0 were not read and get no remedy.
SGLang: every release from 0.4.6 to 0.5.23 was read (the base release of each, e.g. 0.5.6
not 0.5.6.post2; 0.4.10 as 0.4.10.post2), so each `since` is exact to that; versions before
0.4.6 were not read and get the 0.4.6 row.

    >>> remedy_for("vllm", "0.10.2", "attention-build-failed")
    ((), {'VLLM_ATTENTION_BACKEND': 'TRITON_ATTN_VLLM_V1', 'VLLM_USE_FLASHINFER_SAMPLER': '0'})
    >>> remedy_for("vllm", "0.8.5", "attention-build-failed")
    ((), {'VLLM_ATTENTION_BACKEND': 'XFORMERS', 'VLLM_USE_FLASHINFER_SAMPLER': '0'})

Sources (vLLM): `CacheDType` in vllm/config/cache.py; backend names: `_Backend` in
vllm/platforms/interface.py (0.10-0.11), `AttentionBackendEnum` in
vllm/attention/backends/registry.py / vllm/v1/attention/backends/registry.py (0.12+); the env
variable: `VLLM_ATTENTION_BACKEND` in vllm/envs.py (present 0.10-0.14, gone in 0.15: 0.33 only
warns "Unknown vLLM environment variable detected", vllm/platforms/interface.py:1469); the
flags `--attention-backend` and `--attention-config`/`-ac` in vllm/engine/arg_utils.py (0.13+);
`calculate_kv_scales` in vllm/config/cache.py (a validator warns it is deprecated from 0.19,
vllm/config/cache.py:240 in 0.20.0; the field is gone from 0.28).
0.10 rejects a name missing from `_Backend` in vllm/attention/selector.py:200 (`Invalid
attention backend: 'TRITON_ATTN'`), so the Triton backend is `TRITON_ATTN_VLLM_V1` there.
Before 0.10 (V0 attention): the `--kv-cache-dtype` choices are the argparse `choices=` in
vllm/engine/arg_utils.py (0.6.0:255, 0.7.0:348, 0.8.0:369; `CacheDType` in vllm/config.py
from 0.8.5, :1291), backend names `_Backend` in vllm/attention/selector.py (0.6) and
vllm/platforms/interface.py (0.7+), `VLLM_ATTENTION_BACKEND` and `VLLM_USE_FLASHINFER_SAMPLER`
in vllm/envs.py (0.6.0:267/271), `--calculate-kv-scales` from 0.7.0 (arg_utils.py:953).
There is no Triton backend for an FP8 KV cache there (`TRITON_ATTN_VLLM_V1` arrives in 0.8.5
but 0.8-0.9 send FP8 KV to V0 unless FlashAttention takes it, vllm/engine/arg_utils.py:1480 in
0.8.0, :1257 in 0.9.0), and V0 itself moves an FP8 KV cache off FlashAttention to XFormers
("Cannot use FlashAttention-2 backend for FP8 KV cache", vllm/attention/selector.py:228 in
0.6.0, vllm/platforms/cuda.py:246 in 0.8.0, :274 in 0.9.0): so XFORMERS is the remedy's
backend before 0.10 (and 0.10.0-0.10.1, below). Caveat: a pod that forces `VLLM_USE_V1=1` on 0.8-0.9 makes that V0
fallback an error (`_raise_or_fallback`); the remedy does not unset it.
0.10.0/0.10.1 still send FP8 KV to V0 unless FlashAttention takes it or the GPU is SM 10.x
(`is_kv_cache_dtype_supported`, vllm/platforms/cuda.py:460 in 0.10.0, :498 in 0.10.1), and V0
there rejects `TRITON_ATTN_VLLM_V1` ("Invalid attention backend for ...", cuda.py:340 in
0.10.0): so their remedy is XFORMERS too (on an SM 10.x GPU, whose FP8 KV stays on V1, V1
ignores XFORMERS there and picks its default). They also lack FLASHINFER_MLA (and 0.10.0
TREE_ATTN), so the 0.10.2 row, with the Triton remedy, starts at 0.10.2.
SGLang: `--kv-cache-dtype` / `--attention-backend` choices in sglang/srt/server_args.py
(0.5.23: sglang/srt/arg_groups/fields/model.py and arg_groups/choices.py); no env variable
chooses the backend; `--sampling-backend pytorch` avoids FlashInfer's sampler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

VLLM: Final = "vllm"
SGLANG: Final = "sglang"

# Finding codes of kvgate.evidence.logs that remedy_for knows a remedy for.
REMEDIABLE_CODES: Final = ("attention-build-failed", "fp8-unsupported")
# vLLM older than the table's first row (0.6.0) is not extrapolated to: no remedy there.
_VLLM_FIRST_REMEDY: Final = (0, 6, 0)


@dataclass(frozen=True, slots=True)
class VersionFacts:
    """What one engine accepts from `since` until the next row."""

    engine: str
    since: tuple[int, ...]
    kv_cache_dtypes: frozenset[str]
    # How a backend is chosen: a flag (`--attention-backend`), a JSON flag (`-ac`), an env var.
    backend_flag: str | None
    backend_json_flag: str | None
    backend_env: str | None
    # Canonical name (kvgate's, vLLM >= 0.11 spelling) -> this version's spelling, for the
    # backends kvgate may pick; names absent here are passed through only if in `backends`.
    backend_names: Mapping[str, str]
    backends: frozenset[str]  # every name this version accepts (the subset kvgate uses)
    calculate_kv_scales: str  # "yes", "deprecated", "removed" or "never" (SGLang, vLLM 0.6)
    flashinfer_sampler_env: str | None = None
    sampling_backend_flag: str | None = None
    # The backend (canonical name) a remedy moves an FP8 KV cache to: Triton from 0.10.2, where
    # V1's Triton backend stores FP8 KV; V0's XFormers before (see the module docstring).
    fp8_backend: str = "TRITON_ATTN"

    def backend_name(self, backend: str) -> str:
        """This version's spelling of `backend` (canonical or native); ValueError if unknown."""
        native = backend.lower() if self.engine == SGLANG else backend
        name = self.backend_names.get(backend.upper(), native)
        if name not in self.backends:
            known = ", ".join(sorted(self.backends))
            raise ValueError(
                f"{self.engine} {dotted(self.since)}+ has no attention backend '{backend}' "
                f"(known here: {known})"
            )
        return name


def dotted(version: tuple[int, ...]) -> str:
    """(0, 11, 0) -> "0.11.0"."""
    return ".".join(str(p) for p in version)


_V06_DTYPES: Final = frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"})
_V010_DTYPES: Final = _V06_DTYPES | {"fp8_inc"}
_V011_DTYPES: Final = _V010_DTYPES | {"bfloat16"}
_V012_DTYPES: Final = _V011_DTYPES | {"fp8_ds_mla"}
_V018_DTYPES: Final = _V012_DTYPES | {"float16"}
_V020_DTYPES: Final = (
    _V018_DTYPES
    | {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"}
    | {"int8_per_token_head", "fp8_per_token_head", "nvfp4"}
)
_V025_DTYPES: Final = _V020_DTYPES | {"int4_per_token_head"}
_V028_DTYPES: Final = _V025_DTYPES | {"nvfp4_4over6"}
_V030_DTYPES: Final = _V028_DTYPES | {"nvfp4_ds_mla"}
_V032_DTYPES: Final = _V030_DTYPES | {"ultraquant_4bit"}
_V033_DTYPES: Final = _V032_DTYPES | {"octave_k3v4", "octave_k3v3", "octave_k3v3_compact"}

_V_COMMON_BACKENDS: Final = frozenset({"FLASH_ATTN", "FLASHINFER", "FLEX_ATTENTION", "TREE_ATTN"})
_V06_BACKENDS: Final = frozenset({"FLASH_ATTN", "FLASHINFER", "XFORMERS"})
_V0100_BACKENDS: Final = _V06_BACKENDS | {"FLEX_ATTENTION", "TRITON_ATTN_VLLM_V1"}
_V010_BACKENDS: Final = _V_COMMON_BACKENDS | {"TRITON_ATTN_VLLM_V1", "XFORMERS", "FLASHINFER_MLA"}
_V011_BACKENDS: Final = _V_COMMON_BACKENDS | {"TRITON_ATTN", "XFORMERS", "FLASHINFER_MLA"}
_V012_BACKENDS: Final = _V_COMMON_BACKENDS | {"TRITON_ATTN", "FLASHINFER_MLA"}
_V021_BACKENDS: Final = _V012_BACKENDS - {"TREE_ATTN"}  # TREE_ATTN is gone in 0.21
_V010_NAMES: Final = {"TRITON_ATTN": "TRITON_ATTN_VLLM_V1"}
_V_SAMPLER: Final = "VLLM_USE_FLASHINFER_SAMPLER"


def _rows(first: VersionFacts, *changes: Mapping[str, Any]) -> tuple[VersionFacts, ...]:
    """`first`, then each row as the one before with what changed."""
    rows = [first]
    for change in changes:
        rows.append(replace(rows[-1], **change))
    return tuple(rows)


# One row per change point; every x.y.0 release from 0.6 to 0.33 (and 0.8.5, 0.10.1, 0.10.2)
# was read.
VLLM_ROWS: Final = _rows(
    # 0.6: V0 attention; no `--calculate-kv-scales` yet.
    VersionFacts(
        VLLM,
        (0, 6, 0),
        _V06_DTYPES,
        None,
        None,
        "VLLM_ATTENTION_BACKEND",
        {},
        _V06_BACKENDS,
        "never",
        _V_SAMPLER,
        fp8_backend="XFORMERS",
    ),
    # 0.7-0.9: `--calculate-kv-scales` arrives (vllm/engine/arg_utils.py:953 in 0.7.0).
    {"since": (0, 7, 0), "calculate_kv_scales": "yes"},
    # 0.10.0-0.10.1: `fp8_inc`; FP8 KV still falls back to V0 (see the module docstring).
    {
        "since": (0, 10, 0),
        "kv_cache_dtypes": _V010_DTYPES,
        "backend_names": _V010_NAMES,
        "backends": _V0100_BACKENDS,
    },
    {"since": (0, 10, 2), "backends": _V010_BACKENDS, "fp8_backend": "TRITON_ATTN"},
    {
        "since": (0, 11, 0),
        "kv_cache_dtypes": _V011_DTYPES,
        "backend_names": {},
        "backends": _V011_BACKENDS,
    },
    {"since": (0, 12, 0), "kv_cache_dtypes": _V012_DTYPES, "backends": _V012_BACKENDS},
    # 0.13-0.14: the flag arrives; the env variable still works.
    {
        "since": (0, 13, 0),
        "backend_flag": "--attention-backend",
        "backend_json_flag": "--attention-config",
    },
    # 0.15: VLLM_ATTENTION_BACKEND is gone from vllm/envs.py.
    {"since": (0, 15, 0), "backend_env": None},
    {"since": (0, 18, 0), "kv_cache_dtypes": _V018_DTYPES},
    # 0.19: `--calculate-kv-scales` warns that it is deprecated (vllm/config/cache.py).
    {"since": (0, 19, 0), "calculate_kv_scales": "deprecated"},
    {"since": (0, 20, 0), "kv_cache_dtypes": _V020_DTYPES},
    {"since": (0, 21, 0), "backends": _V021_BACKENDS},
    {"since": (0, 25, 0), "kv_cache_dtypes": _V025_DTYPES},
    # 0.28: `calculate_kv_scales` is gone from CacheConfig.
    {"since": (0, 28, 0), "kv_cache_dtypes": _V028_DTYPES, "calculate_kv_scales": "removed"},
    {"since": (0, 30, 0), "kv_cache_dtypes": _V030_DTYPES},
    {"since": (0, 32, 0), "kv_cache_dtypes": _V032_DTYPES},
    {"since": (0, 33, 0), "kv_cache_dtypes": _V033_DTYPES},
)

_S_NAMES: Final = {"TRITON_ATTN": "triton", "FLASHINFER": "flashinfer", "FLASH_ATTN": "fa3"}
_S_BACKENDS: Final = frozenset({"triton", "flashinfer", "fa3", "torch_native", "flashmla"})
_S046_DTYPES: Final = frozenset({"auto", "fp8_e5m2", "fp8_e4m3"})
_S054_DTYPES: Final = _S046_DTYPES | {"bf16", "bfloat16"}
_S055_DTYPES: Final = _S054_DTYPES | {"fp4_e2m1"}
_S0516_DTYPES: Final = _S055_DTYPES | {"mxfp8", "nvfp4", "fp4_mx_block16"}
_S0521_DTYPES: Final = _S0516_DTYPES - {"fp4_e2m1"}  # fp4_e2m1 is gone in 0.5.21
_S053_BACKENDS: Final = _S_BACKENDS | {"fa4", "flex_attention"}

# One row per change point; every release from 0.4.6 to 0.5.23 (0.4.10 as 0.4.10.post2) was read.
SGLANG_ROWS: Final = _rows(
    VersionFacts(
        SGLANG,
        (0, 4, 6),
        _S046_DTYPES,
        "--attention-backend",
        None,
        None,
        _S_NAMES,
        _S_BACKENDS,
        "never",
        sampling_backend_flag="--sampling-backend",
    ),
    {"since": (0, 5, 3), "backends": _S053_BACKENDS},
    {"since": (0, 5, 4), "kv_cache_dtypes": _S054_DTYPES},
    {"since": (0, 5, 5), "kv_cache_dtypes": _S055_DTYPES},
    {"since": (0, 5, 16), "kv_cache_dtypes": _S0516_DTYPES},
    {"since": (0, 5, 21), "kv_cache_dtypes": _S0521_DTYPES},
)

ROWS: Final[Mapping[str, tuple[VersionFacts, ...]]] = {VLLM: VLLM_ROWS, SGLANG: SGLANG_ROWS}
# The newest row per engine (for vLLM the newest wheel read; later wheels read changed nothing).
NEWEST: Final[Mapping[str, tuple[int, ...]]] = {
    engine: max(row.since for row in rows) for engine, rows in ROWS.items()
}


def parse(version: str) -> tuple[int, ...]:
    """`v0.11.0`, `0.4.6.post5`, `0.11.0rc1+cu128` -> (0, 11, 0) / (0, 4, 6); ValueError else.

    Short forms are padded (`0.21` -> (0, 21, 0)): unpadded, (0, 21) < (0, 21, 0) would put
    0.21 in the row before 0.21.0's."""
    numbers = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if numbers is None:
        raise ValueError(f"'{version}' is not a version like 0.11.0")
    parts = tuple(int(part) for part in numbers.group(1).split("."))
    return parts + (0,) * (3 - len(parts))


def facts_for(engine: str, version: str | tuple[int, ...]) -> VersionFacts:
    """The row in force for `version` (the oldest row for a version older than all rows)."""
    rows = ROWS[_engine(engine)]
    wanted = parse(version) if isinstance(version, str) else version
    chosen = rows[0]
    for row in rows:
        if row.since <= wanted:
            chosen = row
    return chosen


def all_rows(engine: str) -> tuple[VersionFacts, ...]:
    return ROWS[_engine(engine)]


def kv_cache_dtypes(engine: str, version: str | None) -> frozenset[str]:
    """Valid `--kv-cache-dtype` values for `version`; for None, those every known version takes."""
    if version is None:
        return frozenset.intersection(*(row.kv_cache_dtypes for row in ROWS[_engine(engine)]))
    return facts_for(engine, version).kv_cache_dtypes


def backend_settings(
    engine: str, backend: str, version: str
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(args, env) that select `backend` on this engine version, in this version's spelling."""
    row = facts_for(engine, version)
    name = row.backend_name(backend)
    if row.backend_flag is not None:
        return (row.backend_flag, name), {}
    if row.backend_env is not None:
        return (), {row.backend_env: name}
    raise ValueError(f"{engine} {version} has no way to choose the attention backend")


def remedy_for(
    engine: str, version: str | None, finding_code: str
) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """The documented remedy for a known crash signature, valid for `version`; None if none.

    `attention-build-failed` (FlashInfer cannot JIT-compile its FP8 kernels, no nvcc/ninja)
    and `fp8-unsupported` (FlashAttention refuses an FP8 KV cache on this GPU) both move to the
    Triton backend, which stores FP8 KV on every GPU kvgate targets (before vLLM 0.10.2: V0's
    XFormers, the row's `fp8_backend`), and stop the FlashInfer sampler (vLLM:
    VLLM_USE_FLASHINFER_SAMPLER=0; SGLang: --sampling-backend pytorch), which JIT-compiles as
    well. Without a version there is no remedy: the flag that picks the backend does not exist
    before vLLM 0.13 and the env variable is ignored from 0.15 on (SGLang's flags are the same
    in every version, so there it needs none).
    """
    if finding_code not in REMEDIABLE_CODES:
        return None
    if version is None and _engine(engine) == SGLANG:
        version = dotted(SGLANG_ROWS[0].since)  # every SGLang version has these flags
    if version is None:
        return None
    try:
        if _engine(engine) == VLLM and parse(version) < _VLLM_FIRST_REMEDY:
            return None
        row = facts_for(engine, version)
        args, env = backend_settings(engine, row.fp8_backend, version)
    except ValueError:
        return None
    if row.flashinfer_sampler_env is not None:
        env[row.flashinfer_sampler_env] = "0"
    if row.sampling_backend_flag is not None and finding_code == "attention-build-failed":
        args = (*args, row.sampling_backend_flag, "pytorch")
    return args, env


def remedy_text(engine: str | None, version: str | None, finding_code: str) -> str:
    """The remedy of `remedy_for` as words for a hint ("Set ... and ..."); "" without one."""
    if engine is None:
        return ""
    remedy = remedy_for(engine, version, finding_code)
    if remedy is None:
        return ""
    args, env = remedy
    parts = [" ".join(args)] if args else []
    return " and ".join([*parts, *(f"{k}={v}" for k, v in env.items())])


def _engine(engine: str) -> str:
    name = str(engine).lower()
    if name not in ROWS:
        raise ValueError(f"engine '{engine}' is not known; use vllm or sglang")
    return name
