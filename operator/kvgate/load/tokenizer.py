"""A word-level tokenizer that counts exactly as `kvgate.sim` does, built offline from GSM8K.

inference-perf needs a local tokenizer directory (offline it cannot fetch one). The
simulator counts a token per `\\s*(?:\\w+|[^\\w\\s])` piece; this tokenizer splits on
whitespace and then into `\\w+` runs and single punctuation marks, so both agree on every
text that does not end in whitespace. The vocabulary comes from GSM8K's train split (14,855
words), so the build is deterministic and needs no network; it is made at run time, never
committed. A real engine's own tokenizer files go in its place.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
VOCAB_SIZE = 30000
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "model_max_length": 131072,
    "clean_up_tokenization_spaces": False,
}


class TokenizerBuildError(ValueError):
    """The corpus is missing or empty; the message names the file."""


def corpus_lines(train_jsonl: Path) -> list[str]:
    """Every question and answer of GSM8K's train.jsonl, in file order."""
    try:
        raw = train_jsonl.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenizerBuildError(f"{train_jsonl}: cannot read ({exc.strerror})") from None
    lines: list[str] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise TokenizerBuildError(f"{train_jsonl}:{number}: not a JSON line") from None
        if not isinstance(row, dict):
            raise TokenizerBuildError(f"{train_jsonl}:{number}: not a JSON object")
        lines += [str(row.get("question", "")), str(row.get("answer", ""))]
    if not lines:
        raise TokenizerBuildError(f"{train_jsonl}: no questions")
    return lines


def build_word_tokenizer(train_jsonl: Path, out_dir: Path) -> Path:
    """Write tokenizer.json and tokenizer_config.json to `out_dir` (what AutoTokenizer loads)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated"),
        ]
    )
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), vocab_size=VOCAB_SIZE)
    tokenizer.train_from_iterator(corpus_lines(train_jsonl), trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=1) + "\n")
    return out_dir
