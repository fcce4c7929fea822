"""Build a tiny, deterministic Qwen3 or Llama checkpoint that real vLLM serves, offline.

No torch: the weights are numpy arrays written as BF16 safetensors by hand, and the tokenizer is
a byte-level BPE trained by the `tokenizers` library on a fixed corpus. The same arguments and
seed give byte-identical files, so tests can pin them by sha256.

Variants (`kv_scales`), for the FP8 KV-cache gate:

- ``none``: a plain BF16 checkpoint; an FP8 KV cache runs with scale 1.0.
- ``calibrated``: per-layer ``model.layers.N.self_attn.{k,v}_scale`` (F32 scalars) and the
  compressed-tensors ``quantization_config`` with a ``kv_cache_scheme``, as llm-compressor saves
  an FP8 KV checkpoint. vLLM 0.32 accepts empty ``config_groups``: layers without a weight
  scheme fall back to the unquantized linear method (CompressedTensorsConfig.get_quant_method).
- ``broken``: as calibrated, but k and v scales are 0.0 in the odd layers (a calibration that
  saw no tokens). vLLM 0.32 (CPU) loads them without a word and starts; the first request
  kills the engine ("k_scale must be positive for FP8 path"; tests/data/real-engine/).

Usage: python hack/tiny_model.py OUT_DIR --arch qwen3 --layers 4 --kv-scales calibrated
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

Arch = Literal["qwen3", "llama"]
KVScales = Literal["none", "calibrated", "broken"]
Corpus = Literal["gsm8k", "words"]

ARCHS: Final = ("qwen3", "llama")
KV_SCALE_VARIANTS: Final = ("none", "calibrated", "broken")
CORPORA: Final = ("gsm8k", "words")

ENDOFTEXT: Final = "<|endoftext|>"
IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
# Order fixes the ids: the trainer puts special tokens first (0, 1, 2).
SPECIAL_TOKENS: Final = (ENDOFTEXT, IM_START, IM_END)

CHATML_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WEIGHT_STD: Final = 0.02
MAX_POSITION_EMBEDDINGS: Final = 4096
GSM8K_ENV: Final = "KVGATE_GSM8K_DIR"
DEFAULT_GSM8K_DIR: Final = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k"

# As llm-compressor / compressed-tensors serialise a kv-cache-only recipe (no weight groups).
KV_CACHE_SCHEME: Final = {
    "num_bits": 8,
    "type": "float",
    "symmetric": True,
    "group_size": None,
    "strategy": "tensor",
    "block_structure": None,
    "dynamic": False,
    "actorder": None,
    "observer": "minmax",
    "observer_kwargs": {},
}

# A fixed word list for the `words` corpus: no files needed, identical on every Python.
_WORD_TEXT: Final = (
    "the a an and or but if then so because when while after before of to in on at by for with "
    "from into over under about between each every some many few more less most least all none "
    "one two three four five six seven eight nine ten hundred thousand half third quarter twice "
    "is are was were be been has have had do does did will would can could should must may "
    "she he they we you it her his their our your its who what which how much many long far "
    "buys sells pays earns spends saves gives takes makes bakes reads writes walks runs drives "
    "apples oranges books pens cookies cakes eggs marbles stickers cards toys shirts shoes hats "
    "dollars cents hours minutes days weeks months years miles meters pounds liters boxes bags "
    "store school farm park class team garden kitchen market library office house city bus car "
    "price cost total amount number sum difference product rate speed time distance profit "
    "each per every remaining left altogether together more than less than times as many "
    "Natalia Weng Betty Julie James Albert Mark Tina Randy Joy Alexis Ken Brian Carla Maria John"
)
_WORDS: Final = tuple(_WORD_TEXT.split())
_PUNCTUATION: Final = (".", ",", "?", "!", ":", ";")


def bf16_bytes(values: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes (little-endian): the upper 16 bits, rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(
    path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...], bytes]]
) -> None:
    """Write {name: (dtype, shape, raw little-endian bytes)} as one safetensors file.

    F32 tensors go first and the header is padded to 8 bytes, so every tensor's offset is a
    multiple of its element size (what safetensors itself does by sorting on alignment).
    """
    order = sorted(tensors, key=lambda name: (tensors[name][0] != "F32", name))
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
        dtype, shape, raw = tensors[name]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for name in order:
            out.write(tensors[name][2])


def read_safetensors_header(path: Path) -> dict[str, dict[str, object]]:
    """The JSON header of a safetensors file (tests and callers use it to check shapes)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


@dataclass(frozen=True)
class Shape:
    """What sizes a tiny model: its architecture and every dimension the weights depend on."""

    arch: Arch = "qwen3"
    layers: int = 4
    hidden_size: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 4096

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, not {self.arch!r}")
        dims = (self.layers, self.hidden_size, self.heads, self.kv_heads, self.head_dim)
        if min(*dims, self.intermediate_size) <= 0:
            raise ValueError("every shape parameter must be positive")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"vocab_size must hold the 256 bytes and {len(SPECIAL_TOKENS)} specials"
            )


def weight_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes as transformers and vLLM name them (lm_head tied, not stored)."""
    arch, layers, hidden_size, heads = shape.arch, shape.layers, shape.hidden_size, shape.heads
    kv_heads, head_dim, intermediate_size = shape.kv_heads, shape.head_dim, shape.intermediate_size
    vocab_size = shape.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, hidden_size),
        "model.norm.weight": (hidden_size,),
    }
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (hidden_size,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (hidden_size,)
        shapes[f"{p}.self_attn.q_proj.weight"] = (heads * head_dim, hidden_size)
        shapes[f"{p}.self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden_size)
        shapes[f"{p}.self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden_size)
        shapes[f"{p}.self_attn.o_proj.weight"] = (hidden_size, heads * head_dim)
        if arch == "qwen3":  # Qwen3 normalises q and k per head before RoPE
            shapes[f"{p}.self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{p}.self_attn.k_norm.weight"] = (head_dim,)
        shapes[f"{p}.mlp.gate_proj.weight"] = (intermediate_size, hidden_size)
        shapes[f"{p}.mlp.up_proj.weight"] = (intermediate_size, hidden_size)
        shapes[f"{p}.mlp.down_proj.weight"] = (hidden_size, intermediate_size)
    return shapes


def kv_scale_values(kv_scales: KVScales, layers: int, seed: int) -> dict[int, tuple[float, float]]:
    """Per layer (k_scale, v_scale); empty for `none`. Own rng stream: weights stay the same."""
    if kv_scales == "none":
        return {}
    rng = np.random.default_rng([seed, 1])
    # Plausible per-tensor FP8 scales (amax / 448) for small activations.
    drawn = rng.uniform(0.005, 0.05, size=(layers, 2)).astype(np.float32)
    values = {i: (float(drawn[i, 0]), float(drawn[i, 1])) for i in range(layers)}
    if kv_scales == "broken":
        for i in range(1, layers, 2):  # a calibration that never reached these layers
            values[i] = (0.0, 0.0)
    return values


def build_config(
    shape: Shape, *, kv_scales: KVScales, bos_token_id: int, eos_token_id: int
) -> dict[str, object]:
    arch, layers = shape.arch, shape.layers
    config: dict[str, object] = {
        "architectures": ["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": WEIGHT_STD,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if arch == "qwen3":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    else:
        config.update(mlp_bias=False, pretraining_tp=1)
    if kv_scales != "none":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "dense",
            "quantization_status": "compressed",
            "config_groups": {},  # weights stay BF16: only the KV cache is quantized
            "ignore": [],
            "kv_cache_scheme": dict(KV_CACHE_SCHEME),
            "global_compression_ratio": None,
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.12.2",
        }
    return config


def gsm8k_dir() -> Path:
    return Path(os.environ.get(GSM8K_ENV) or DEFAULT_GSM8K_DIR).resolve()


def corpus_lines(corpus: Corpus, seed: int) -> list[str]:
    """The tokenizer's training text, in a fixed order."""
    if corpus == "gsm8k":
        path = gsm8k_dir() / "train.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found (set {GSM8K_ENV}, or build with corpus='words')"
            )
        lines = []
        for row in path.read_text(encoding="utf-8").splitlines():
            if row.strip():
                record = json.loads(row)
                lines.extend((record["question"], record["answer"]))
        return lines
    return list(_word_sentences(seed))


def _word_sentences(seed: int, count: int = 20000) -> Iterator[str]:
    """Sentences from the fixed word list, numbers and punctuation (numpy's PCG64 stream)."""
    rng = np.random.default_rng([seed, 2])
    for _ in range(count):
        length = int(rng.integers(4, 16))
        picks = rng.integers(0, len(_WORDS), size=length)
        words = [_WORDS[int(i)] for i in picks]
        if rng.random() < 0.5:  # numbers, as GSM8K-like prompts are full of them
            words.insert(int(rng.integers(0, length)), str(int(rng.integers(0, 10000))))
        yield " ".join(words).capitalize() + _PUNCTUATION[int(rng.integers(0, len(_PUNCTUATION)))]


def train_tokenizer(lines: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE as Qwen's and Llama 3's tokenizers are (no unknown token)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tokenizer


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, dict[str, object]]:
    """tokenizer_config.json, special_tokens_map.json (the tokens by name, for transformers)."""
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    tokens = {"bos_token": ENDOFTEXT, "eos_token": IM_END, "pad_token": ENDOFTEXT}
    tokenizer_config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "unk_token": None,
        **tokens,
    }
    special_tokens_map: dict[str, object] = {
        **tokens,
        "additional_special_tokens": [IM_START, IM_END],
    }
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special_tokens_map,
    }


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(
    out: Path | str,
    *,
    arch: Arch = "qwen3",
    layers: int = 4,
    hidden_size: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 512,
    vocab_size: int = 4096,
    kv_scales: KVScales = "none",
    corpus: Corpus = "gsm8k",
    seed: int = 0,
) -> Path:
    """Write a servable tiny checkpoint into `out` (created if missing); returns `out`."""
    shape = Shape(
        arch, layers, hidden_size, heads, kv_heads, head_dim, intermediate_size, vocab_size
    )
    if kv_scales not in KV_SCALE_VARIANTS:
        raise ValueError(f"kv_scales must be one of {KV_SCALE_VARIANTS}, not {kv_scales!r}")
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, not {corpus!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(corpus_lines(corpus, seed), vocab_size)
    tokenizer.save(str(out / "tokenizer.json"))
    for name, content in tokenizer_files(tokenizer).items():
        _write_json(out / name, content)
    bos_id, eos_id = tokenizer.token_to_id(ENDOFTEXT), tokenizer.token_to_id(IM_END)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": [eos_id, bos_id], "pad_token_id": bos_id},
    )

    shapes = weight_shapes(shape)
    rng = np.random.default_rng(seed)
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for name in sorted(shapes):  # draw in name order: the stream does not depend on dict order
        dims = shapes[name]
        if name.endswith("norm.weight"):
            values = np.ones(dims, dtype=np.float32)
        else:
            values = rng.standard_normal(dims, dtype=np.float32) * np.float32(WEIGHT_STD)
        tensors[name] = ("BF16", dims, bf16_bytes(values))
    for layer, (k_scale, v_scale) in kv_scale_values(kv_scales, layers, seed).items():
        p = f"model.layers.{layer}.self_attn"
        tensors[f"{p}.k_scale"] = ("F32", (), struct.pack("<f", k_scale))
        tensors[f"{p}.v_scale"] = ("F32", (), struct.pack("<f", v_scale))
    write_safetensors(out / "model.safetensors", tensors)

    config = build_config(shape, kv_scales=kv_scales, bos_token_id=bos_id, eos_token_id=eos_id)
    _write_json(out / "config.json", config)
    return out


# Where `cached` keeps built models: beside the other built things kvgate's tests reuse, and not
# under /tmp, which the load and eval Jobs' pods mount an emptyDir over (a model there is out
# of their sight, and a load Job that cannot read the served model's tokenizer cannot measure).
CACHE: Final = Path(os.environ.get("KVGATE_CACHE") or Path.home() / ".cache" / "kvgate") / "models"


def cached(name: str, **options: Any) -> Path:
    """`build(..., **options)` once into the model cache, named `name`-<key of this builder's
    source and the options>; a model already there is the same bytes (the build is
    deterministic) and is reused. Made in a sibling directory, then renamed into place, so a
    half-built model is never found."""
    source = Path(__file__).read_bytes()
    key = hashlib.sha256(source + json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]
    out = CACHE / f"{name}-{key}"
    if (out / "config.json").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=CACHE) as scratch:
        build(Path(scratch) / "model", **options)
        try:
            (Path(scratch) / "model").rename(out)
        except OSError:  # another process put the same model there first
            if not (out / "config.json").is_file():
                raise
    return out


def tree_sha256(directory: Path | str) -> dict[str, str]:
    """sha256 of every file in a built model directory, by file name."""
    directory = Path(directory)
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--arch", choices=ARCHS, default="qwen3")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--kv-scales", choices=KV_SCALE_VARIANTS, default="none")
    parser.add_argument("--corpus", choices=CORPORA, default="gsm8k")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build(
        args.out,
        arch=args.arch,
        layers=args.layers,
        hidden_size=args.hidden_size,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        kv_scales=args.kv_scales,
        corpus=args.corpus,
        seed=args.seed,
    )
    for name, digest in tree_sha256(out).items():
        print(f"{digest}  {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
