"""KV-cache capacity from a model's config.json: bytes per token, tokens per GiB, pool tokens.

Covers grouped-query attention (MHA, GQA, MQA), multi-head latent attention (DeepSeek-V2/V3
style: one latent of `kv_lora_rank + qk_rope_head_dim` per token and layer, not K and V),
hybrid models whose linear-attention / Mamba layers hold no KV, and multimodal configs that
nest the language model under `text_config`.

    >>> layout = parse_kv_layout(json.load(open("config.json")))
    >>> layout.bytes_per_token("fp8")
    73728
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

from kvgate.engines import kvformats
from kvgate.engines import versions as engine_versions
from kvgate.errors import ParseError, SpecError, UnsupportedError, brief

GIB: Final = 1024**3

# Bytes per element of the KV cache. `auto` is the model dtype, which the engines run in
# 16 bits (vLLM downcasts float32 checkpoints to bf16/fp16 as well).
KV_DTYPE_BYTES: Final[Mapping[str, int]] = {
    "auto": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# vLLM sizes each layer's pages in blocks of 16 tokens; the pool is a whole number of blocks.
DEFAULT_BLOCK_SIZE: Final = 16

# Layer types as written in `layer_types` / `layers_block_type` lists.
_FULL_TYPES: Final = frozenset({"full_attention", "attention", "global_attention", "hybrid"})
_SLIDING_TYPES: Final = frozenset(
    {"sliding_attention", "sliding_window_attention", "local_attention", "chunked_attention"}
)
_NO_KV_TYPES: Final = frozenset(
    {"linear_attention", "mamba", "mamba2", "conv", "short_conv", "recurrent", "ssm", "mlp", "moe"}
)
# NemotronH `hybrid_override_pattern`: `*` attention, `M` Mamba-2, `-` MLP, `E` MoE.
_PATTERN_KINDS: Final[Mapping[str, str]] = {"*": "full", "M": "none", "-": "none", "E": "none"}

# Upper bounds of config fields: far above any published model (DeepSeek-V3 has 61 layers,
# 128 heads), low enough that an absurd config is refused before per-layer lists are built.
MAX_LAYERS: Final = 4096
_FIELD_LIMITS: Final[Mapping[str, int]] = {
    "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": 16384,
    "num_key_value_heads": 16384,
    "head_dim": 65536,
    "hidden_size": 1 << 20,
    "kv_lora_rank": 65536,
    "qk_rope_head_dim": 65536,
    "attn_layer_period": MAX_LAYERS,
    "full_attention_interval": MAX_LAYERS,
}
# The largest KV pool kvgate sizes: 1 PiB.
MAX_MEMORY_GIB: Final = float(1 << 20)

# Model types whose config.json leaves out fields that transformers fills from class defaults
# (e.g. the published gemma-3-4b-it text_config has no head counts).
_MODEL_TYPE_DEFAULTS: Final[Mapping[str, Mapping[str, int]]] = {
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window_pattern": 6,
    },
}

# Configs of these model types have no decoder KV cache for kvgate to gate.
_NO_KV_MODEL_TYPES: Final = frozenset(
    {"bert", "roberta", "distilbert", "deberta", "deberta-v2", "electra", "mamba", "mamba2", "rwkv"}
)
_ENCODER_DECODER_MODEL_TYPES: Final = frozenset(
    {"t5", "mt5", "bart", "mbart", "whisper", "pegasus"}
)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What one token costs in the KV cache of one model, independent of the dtype.

    `kv_heads` x `head_dim` elements are stored `tensors_per_layer` times (2: K and V;
    1: the MLA latent) in each of `kv_layers` layers.
    """

    architecture: str
    attention: str  # "mha", "gqa", "mqa", "mla", or "hybrid" when some layers hold no KV
    num_layers: int
    kv_layers: int
    kv_heads: int
    head_dim: int
    tensors_per_layer: int
    kv_layer_indices: tuple[int, ...]
    sliding_window_layers: int
    sliding_window: int | None
    notes: tuple[str, ...]
    sliding_layer_indices: tuple[int, ...] = ()

    def bytes_per_token(
        self,
        dtype: str,
        *,
        skip_layers: Sequence[str] = (),
        engine: str = engine_versions.VLLM,
        backend: str | None = None,
    ) -> int:
        """Bytes one token occupies across all KV-holding layers (`layer_bytes` summed)."""
        layers = self.layer_bytes(dtype, skip_layers=skip_layers, engine=engine, backend=backend)
        return sum(layers.values())

    def layer_bytes(
        self,
        dtype: str,
        *,
        skip_layers: Sequence[str] = (),
        engine: str = engine_versions.VLLM,
        backend: str | None = None,
    ) -> dict[int, int]:
        """Per KV layer index: bytes one token takes there. A layer is skipped (16-bit) when its
        index is in `skip_layers`, when `sliding_window` is and the layer slides
        (vllm/model_executor/layers/attention/attention.py:299-316, vLLM 0.32), or when it is
        one of the format's boundary layers (TurboQuant/UltraQuant on a model without
        linear-attention or Mamba layers: the first and last min(2, layers // 2))."""
        skipped = self.skipped_layers(dtype, skip_layers=skip_layers, engine=engine)
        quantized = _per_layer_bytes(self, dtype, engine, backend)
        baseline = _per_layer_bytes(self, "auto", engine, backend)
        return {i: baseline if i in skipped else quantized for i in self.kv_layer_indices}

    def skipped_layers(
        self, dtype: str, *, skip_layers: Sequence[str] = (), engine: str = engine_versions.VLLM
    ) -> frozenset[int]:
        """The KV layers a format leaves in 16 bits (see `layer_bytes`)."""
        wanted: set[int] = set()
        for i, entry in enumerate(skip_layers):
            text = str(entry).strip()
            if text == "sliding_window":
                wanted.update(self.sliding_layer_indices)
            elif (
                text.isascii()
                and text.isdecimal()
                and len(text) < 8
                and int(text) < self.num_layers
            ):
                wanted.add(int(text))
            else:  # vLLM would start and skip nothing for it (it matches str(layer_idx))
                raise SpecError(
                    f"kvCache.skipLayers[{i}]",
                    f"{brief(entry)} is neither a layer index below {self.num_layers} nor "
                    f"'sliding_window' ({self.architecture}: num_hidden_layers "
                    f"{self.num_layers})",
                )
        fmt = _format(dtype, engine)
        if fmt is not None and fmt.boundary_layers and self.attention != "hybrid":
            n = min(fmt.boundary_layers, self.num_layers // 2)
            wanted.update(range(n))
            wanted.update(range(self.num_layers - n, self.num_layers))
        return frozenset(wanted & set(self.kv_layer_indices))

    def tokens_per_gib(self, dtype: str) -> float:
        return GIB / self.bytes_per_token(dtype)

    def pool_tokens(
        self,
        memory_bytes: int,
        dtype: str,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        skip_layers: Sequence[str] = (),
        engine: str = engine_versions.VLLM,
        backend: str | None = None,
    ) -> int:
        """Tokens a KV pool of `memory_bytes` holds, rounded down to whole blocks."""
        if memory_bytes < 0:
            raise SpecError("memory_bytes", f"{memory_bytes} is negative; use a size >= 0")
        if block_size < 1:
            raise SpecError("block_size", f"{block_size} is below 1; use a positive block size")
        per_token = self.bytes_per_token(
            dtype, skip_layers=skip_layers, engine=engine, backend=backend
        )
        blocks = memory_bytes // (per_token * block_size)
        return blocks * block_size


def _format(dtype: str, engine: str) -> kvformats.KVFormat | None:
    """The engine's format for `dtype`; None for kvgate's own 16/8-bit spellings (bf16...)."""
    if dtype.lower() in KV_DTYPE_BYTES:
        return None
    try:
        return kvformats.lookup(engine, dtype)
    except SpecError:
        known = ", ".join(
            sorted(set(KV_DTYPE_BYTES) | {n for e, n in kvformats.FORMATS if e == engine})
        )
        raise SpecError(
            "kv_cache_dtype", f"'{dtype}' is not a known KV cache dtype; use one of {known}"
        ) from None


def _per_layer_bytes(layout: KVLayout, dtype: str, engine: str, backend: str | None) -> int:
    """Bytes one token takes in one KV layer of `layout` in format `dtype`."""
    fmt = _format(dtype, engine)
    if fmt is None:
        element = KV_DTYPE_BYTES[dtype.lower()]  # _format returned None: a key of the table
        return layout.tensors_per_layer * layout.kv_heads * layout.head_dim * element
    mla = layout.attention == "mla"
    if fmt.mla_only and not mla and backend is None:
        raise UnsupportedError(
            f"KV cache format '{fmt.name}' is for DeepSeek MLA models only; "
            f"this model's attention is {layout.attention}"
        )
    if mla and fmt.quantized and not fmt.mla_only and fmt.policy_class != kvformats.FP8:
        raise UnsupportedError(
            f"KV cache format '{fmt.name}' on an MLA model: its page layout is not modelled"
        )
    if mla:  # one latent per token and layer (head_dim here is kv_lora_rank + rope)
        return fmt.bytes_per_head(layout.head_dim, 0, backend=backend)
    return layout.kv_heads * fmt.bytes_per_head(layout.head_dim, backend=backend)


def parse_kv_layout(config: Mapping[str, Any], source: str = "config.json") -> KVLayout:
    """Read the KV geometry of a model from its config.json contents."""
    if not isinstance(config, Mapping):
        raise ParseError(source, f"expected a JSON object, got {type(config).__name__}")
    architecture = _architecture(config)
    text, prefix = config, ""
    if isinstance(config.get("text_config"), Mapping):
        text, prefix = config["text_config"], "text_config."
    fields = _Fields(text, prefix, source)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if model_type in _NO_KV_MODEL_TYPES:
        raise UnsupportedError(
            f"{source}: model_type '{model_type}' has no decoder KV cache; kvgate gates decoder LLMs"
        )
    if model_type in _ENCODER_DECODER_MODEL_TYPES:
        raise UnsupportedError(
            f"{source}: model_type '{model_type}' is an encoder-decoder model; "
            "kvgate sizes decoder-only KV caches"
        )

    num_layers = fields.positive_int("num_hidden_layers", "n_layer", "num_layers")
    kinds = _layer_kinds(fields, num_layers, model_type)
    kv_layer_indices = tuple(i for i, kind in enumerate(kinds) if kind != "none")
    if not kv_layer_indices:
        raise UnsupportedError(
            f"{source}: none of the {num_layers} layers holds a KV cache; "
            "kvgate gates models with attention layers"
        )
    sliding_layers = sum(1 for kind in kinds if kind == "sliding")
    notes: list[str] = []

    if fields.get("kv_lora_rank") is not None:
        latent = fields.positive_int("kv_lora_rank")
        rope = fields.positive_int("qk_rope_head_dim")
        kv_heads, head_dim, tensors_per_layer = 1, latent + rope, 1
        attention = "mla"
        notes.append(
            f"MLA: one latent of kv_lora_rank {latent} + qk_rope_head_dim {rope} = {head_dim} "
            "values per token and layer, shared by all heads (no separate K and V)"
        )
    else:
        heads = fields.positive_int("num_attention_heads", "n_head")
        if fields.get("num_key_value_heads", "num_kv_heads", "n_head_kv") is None:
            kv_heads = heads
            notes.append(
                f"{prefix}num_key_value_heads not set: every one of the {heads} heads has its own K/V"
            )
        else:
            kv_heads = fields.positive_int("num_key_value_heads", "num_kv_heads", "n_head_kv")
        if fields.get("head_dim") is not None:
            head_dim = fields.positive_int("head_dim")
        else:
            hidden = fields.positive_int("hidden_size", "n_embd", "d_model")
            if hidden % heads:
                raise ParseError(
                    source,
                    f"field '{prefix}hidden_size' {hidden} is not a multiple of "
                    f"'{prefix}num_attention_heads' {heads}; set '{prefix}head_dim'",
                )
            head_dim = hidden // heads
        tensors_per_layer = 2
        attention = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"

    if len(kv_layer_indices) < num_layers:
        notes.append(
            f"hybrid: {len(kv_layer_indices)} of {num_layers} layers hold KV; "
            f"the other {num_layers - len(kv_layer_indices)} keep a fixed-size state instead"
        )
        attention = "hybrid"
    window = fields.get("sliding_window")
    sliding_window = window if isinstance(window, int) and sliding_layers else None
    if sliding_layers:
        notes.append(
            f"{sliding_layers} of {len(kv_layer_indices)} KV layers use a sliding window"
            + (f" of {sliding_window} tokens" if sliding_window else "")
            + ": they hold KV too, so the figures here count them in full (an upper bound for "
            "engines that page sliding-window layers separately)"
        )
    notes.extend(fields.defaults_used)
    return KVLayout(
        architecture=architecture or model_type or "unknown",
        attention=attention,
        num_layers=num_layers,
        kv_layers=len(kv_layer_indices),
        kv_heads=kv_heads,
        head_dim=head_dim,
        tensors_per_layer=tensors_per_layer,
        kv_layer_indices=kv_layer_indices,
        sliding_window_layers=sliding_layers,
        sliding_window=sliding_window,
        notes=tuple(notes),
        sliding_layer_indices=tuple(i for i, kind in enumerate(kinds) if kind == "sliding"),
    )


def _architecture(config: Mapping[str, Any]) -> str:
    architectures = config.get("architectures")
    if isinstance(architectures, Sequence) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return ""


class _Fields:
    """Reads fields from one config level, naming them with their path in errors."""

    def __init__(self, config: Mapping[str, Any], prefix: str, source: str) -> None:
        self.config = config
        self.prefix = prefix
        self.source = source
        self.defaults = _MODEL_TYPE_DEFAULTS.get(str(config.get("model_type", "")), {})
        self.defaults_used: list[str] = []

    def get(self, *names: str) -> object:
        for name in names:
            if self.config.get(name) is not None:
                return self.config[name]
        for name in names:
            if name in self.defaults:
                self.defaults_used.append(
                    f"{self.prefix}{name} not in config.json: used the transformers default "
                    f"{self.defaults[name]} for model_type '{self.config.get('model_type')}'"
                )
                return self.defaults[name]
        return None

    def positive_int(self, *names: str) -> int:
        value = self.get(*names)
        if value is None:
            raise ParseError(self.source, f"field '{self.prefix}{names[0]}' is missing")
        limit = _FIELD_LIMITS.get(names[0])
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < 1
            or (limit is not None and value > limit)
        ):
            bound = f" <= {limit}" if limit is not None else ""
            raise ParseError(
                self.source,
                f"field '{self.prefix}{names[0]}' must be a positive integer{bound}, "
                f"got {brief(value)}",
            )
        return value


def _layer_kinds(fields: _Fields, num_layers: int, model_type: str) -> list[str]:
    """One of "full", "sliding" or "none" (no KV) per decoder layer."""
    prefix, source = fields.prefix, fields.source
    for name in ("layer_types", "layers_block_type"):
        types = fields.config.get(name)
        if types is None:
            continue
        _check_length(types, num_layers, f"{prefix}{name}", source)
        return [_kind_of(t, i, f"{prefix}{name}", source) for i, t in enumerate(types)]

    pattern = fields.config.get("hybrid_override_pattern")
    if pattern is not None:
        _check_length(pattern, num_layers, f"{prefix}hybrid_override_pattern", source)
        kinds = []
        for i, char in enumerate(pattern):
            if char not in _PATTERN_KINDS:
                raise UnsupportedError(
                    f"{source}: field '{prefix}hybrid_override_pattern' has unknown layer code "
                    f"'{char}' at index {i}; known codes: {' '.join(_PATTERN_KINDS)}"
                )
            kinds.append(_PATTERN_KINDS[char])
        return kinds

    # MiniMax-Text-01 style: 1 marks a softmax-attention layer, 0 a lightning (linear) one.
    attn_types = fields.config.get("attn_type_list")
    if attn_types is not None:
        _check_length(attn_types, num_layers, f"{prefix}attn_type_list", source)
        return ["full" if t == 1 else "none" for t in attn_types]

    indices = fields.config.get("attn_layer_indices")
    if indices is not None:
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and 0 <= i < num_layers for i in indices
        ):
            raise ParseError(
                source,
                f"field '{prefix}attn_layer_indices' must list layer indices in "
                f"[0, {num_layers}), got {brief(indices)}",
            )
        chosen = set(indices)
        return ["full" if i in chosen else "none" for i in range(num_layers)]

    if fields.config.get("attn_layer_period") is not None:
        # Jamba: attention where index % period == offset
        period = fields.positive_int("attn_layer_period")
        offset = fields.config.get("attn_layer_offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
            raise ParseError(
                source,
                f"field '{prefix}attn_layer_offset' must be an integer in [0, {period}), got {brief(offset)}",
            )
        return ["full" if i % period == offset else "none" for i in range(num_layers)]

    if fields.config.get("full_attention_interval") is not None:
        # Qwen3-Next: every interval-th layer is full attention, the others linear
        interval = fields.positive_int("full_attention_interval")
        return ["none" if (i + 1) % interval else "full" for i in range(num_layers)]

    window_pattern = fields.get("sliding_window_pattern") if fields.get("sliding_window") else None
    if isinstance(window_pattern, int) and window_pattern > 0:
        # Gemma-3: every pattern-th layer is global, the others slide
        return ["sliding" if (i + 1) % window_pattern else "full" for i in range(num_layers)]
    window = fields.config.get("sliding_window")
    if isinstance(window, int) and window > 0 and fields.config.get("use_sliding_window", True):
        max_window_layers = fields.config.get("max_window_layers")
        if model_type.startswith("qwen") and isinstance(max_window_layers, int):
            # Qwen2: layers from max_window_layers on use the window
            return ["sliding" if i >= max_window_layers else "full" for i in range(num_layers)]
        return ["sliding"] * num_layers  # Mistral v0.1 style: the window applies everywhere
    return ["full"] * num_layers


def _check_length(items: object, num_layers: int, field: str, source: str) -> None:
    if not isinstance(items, (list, str)) or len(items) != num_layers:
        length = len(items) if isinstance(items, (list, str)) else type(items).__name__
        raise ParseError(
            source,
            f"field '{field}' must have one entry per layer ({num_layers}), got {length}",
        )


def _kind_of(layer_type: object, index: int, field: str, source: str) -> str:
    name = str(layer_type).lower()
    if name in _FULL_TYPES:
        return "full"
    if name in _SLIDING_TYPES:
        return "sliding"
    if name in _NO_KV_TYPES:
        return "none"
    known = ", ".join(sorted(_FULL_TYPES | _SLIDING_TYPES | _NO_KV_TYPES))
    raise UnsupportedError(
        f"{source}: field '{field}' has unknown layer type {brief(layer_type)} at index {index}; "
        f"known types: {known}"
    )


def gib_to_bytes(gib: float) -> int:
    """GiB (as the engines print them) to bytes; rejects negative and non-finite sizes."""
    if not math.isfinite(gib) or gib < 0:
        raise SpecError("gpu_memory_gib", f"{gib} is not a size in GiB; use a number >= 0")
    if gib > MAX_MEMORY_GIB:
        raise SpecError(
            "gpu_memory_gib", f"{gib:g} GiB is above {MAX_MEMORY_GIB:g} GiB; use a GPU's KV memory"
        )
    return int(gib * GIB)


@dataclass(frozen=True, slots=True)
class VllmPool:
    """A KV pool as vLLM's V1 hybrid allocator sizes it, for a given vLLM version.

    Read in the wheels (vllm/v1/core/kv_cache_utils.py; from 0.29 the grouping and sizing
    live in vllm/v1/core/kv_cache_planning.py; vllm/v1/kv_cache_interface.py for the specs):
    layers are grouped by spec (full / sliding window), each type cut into groups of
    `group_size` layers (padded) -- the smallest type's layer count, or from 0.18 the
    largest when it is below 1.5 x the smallest (`_get_kv_cache_groups_uniform_page_size`,
    0.20.0 kv_cache_utils.py:1127, 0.33.0 kv_cache_planning.py:524). Each block holds one
    page per layer of a group, so `num_blocks = memory // page // group_size` (`get_num_blocks`
    up to 0.28; `memory // bytes_per_block` from 0.29, the same figure: 0.33 rounds
    bytes_per_block up to backend stride alignments that only DeepSeek/MLA specs declare).
    A request at max_model_len holds `cdiv(max_model_len, block)` blocks per full group and
    `cdiv(min(window - 1 + in_flight, max_model_len), block) + 1` per sliding group
    (`SlidingWindowSpec.max_admission_blocks_per_request`), where in_flight is
    max_num_batched_tokens up to 0.25 and from 0.26 `VllmConfig.max_in_flight_tokens` =
    max_concurrent_batches x max_num_batched_tokens (2 batches with async scheduling, which
    0.26-0.33 turn on by default where supported: vllm/config/vllm.py:1685-1719 in 0.33.0).
    `max_concurrency` = num_blocks / (blocks per request), as logged ("Maximum concurrency").
    `kv_tokens` is what the engine logs as "GPU KV cache size": up to 0.20
    `num_blocks // groups * block_size` (a sliding layer costs what a full one does there),
    from 0.21 `int(max_concurrency * max_model_len)` (0.21.0 kv_cache_utils.py:1708; 0.33.0
    `get_kv_cache_capacity`, :1120). `window_tokens` is always the latter: the tokens the
    pool serves counting sliding layers at their window.
    Not modelled: speculative decoding (`extra_retained_tokens`), pipeline parallelism, DCP/PCP,
    per-token-head scale bytes, mixed page sizes (0.33's packed groups), MLA.
    """

    num_blocks: int
    groups: int
    group_size: int
    kv_tokens: int
    max_concurrency: float
    window_tokens: int

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"max_concurrency": round(self.max_concurrency, 2)}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


DEFAULT_VLLM_VERSION: Final = (0, 11, 0)


def vllm_pool(
    layout: KVLayout,
    memory_bytes: int,
    dtype: str,
    *,
    max_model_len: int,
    max_num_batched_tokens: int = 2048,
    block_size: int = DEFAULT_BLOCK_SIZE,
    version: tuple[int, ...] = DEFAULT_VLLM_VERSION,
    skip_layers: Sequence[str] = (),
    kernel_block: int | None = None,
    backend: str | None = None,
) -> VllmPool:
    """vLLM `version`'s own accounting of a KV pool of `memory_bytes` (see `VllmPool`).

    `dtype` is any vLLM format (its page per layer from `layer_bytes`). With layers of two
    page sizes (`skip_layers`, TurboQuant's boundary layers) on a model whose layers are all
    full attention, every layer keeps one block size and the layers form one group whose page
    is the sum of theirs (`UniformTypeKVCacheSpecs`, vllm/v1/kv_cache_interface.py:1225-1304,
    0.32); the block first grows until the quantized page covers a 16-bit page of the smallest
    kernel block, `kernel_block` (default: `block_size`; CPU_ATTN's is 32, FlashAttention's
    16): `_align_heterogeneous_kv_block_size`, vllm/platforms/interface.py:825-920 (0.32).
    Mixed pages next to sliding-window layers are padded to a shared page: not modelled.
    `backend` is the attention backend (e.g. CPU_ATTN), which owns the page layout (see
    `kvformats.KVFormat.bytes_per_head`).
    """
    if memory_bytes < 0 or max_model_len < 1 or max_num_batched_tokens < 1 or block_size < 1:
        raise SpecError(
            "memory_bytes",
            "memory must be >= 0 and max_model_len, max_num_batched_tokens, block_size >= 1",
        )
    if layout.attention == "mla":
        raise UnsupportedError("vllm_pool: MLA pages are sized differently; not modelled")
    full = layout.kv_layers - layout.sliding_window_layers
    sliding = layout.sliding_window_layers if layout.sliding_window else 0
    full += layout.sliding_window_layers - sliding  # a window kvgate cannot read counts in full
    counts = [n for n in (full, sliding) if n]
    group_size = min(counts)
    if version >= (0, 18, 0) and max(counts) < group_size * 1.5:
        group_size = max(counts)
    full_groups, sliding_groups = _cdiv(full, group_size), _cdiv(sliding, group_size)
    groups = full_groups + sliding_groups
    pages = layout.layer_bytes(dtype, skip_layers=skip_layers, backend=backend)
    if len(set(pages.values())) > 1:
        if sliding_groups:
            raise UnsupportedError(
                "vllm_pool: skipped (16-bit) layers beside sliding-window layers share a padded "
                "page in vLLM; not modelled"
            )
        kernel = kernel_block or block_size
        align = max(kernel, block_size)
        primary, padded = min(pages.values()), max(pages.values())
        block_size = max(block_size, align * _cdiv(padded * kernel, align * primary))
        groups, group_size = 1, len(pages)
        num_blocks = memory_bytes // (block_size * sum(pages.values()))
    else:
        page = block_size * next(iter(pages.values()))
        num_blocks = memory_bytes // page // group_size
    per_request = full_groups * _cdiv(max_model_len, block_size)
    if sliding_groups:
        batches = 2 if version >= (0, 26, 0) else 1  # async scheduling, on by default
        in_flight = batches * max_num_batched_tokens
        window = min((layout.sliding_window or 0) - 1 + in_flight, max_model_len)
        per_request += sliding_groups * (_cdiv(window, block_size) + 1)
    concurrency = num_blocks / per_request
    window_tokens = int(concurrency * max_model_len)
    logged = window_tokens if version >= (0, 21, 0) else num_blocks // groups * block_size
    return VllmPool(
        num_blocks=num_blocks,
        groups=groups,
        group_size=group_size,
        kv_tokens=logged,
        max_concurrency=concurrency,
        window_tokens=window_tokens,
    )
