"""The load Job's tokenizer: the served model's where the Job can read it, else kvgate.sim's.

Why a local tokenizer, from the model's own source: inference-perf makes its prompts from token
ids and counts every response's tokens (the count its tok/s and TPOT are computed from) with a
tokenizer *directory* it loads itself, offline; the engine's POST /tokenize (which vLLM serves)
cannot stand in for that, so the served model's tokenizer files must be on the Job's disk. The
operator passes the model source it already knows (`spec.model.name`, else the engine's
`--model`), as it does for the eval's long-context task: a directory the Job can read, or a hub
repo id found in the Job's Hugging Face cache (offline: the load Job's pods reach no hub).

When the source names nothing the Job can read, the Job counts with a word-level tokenizer that
counts exactly as `kvgate.sim` does, and says so in its log. That is not a guess that the
engine is the simulator: every run's counts are checked against the engine's own token counters
(`kvgate.load.counts`), so the word tokenizer passes only where the engine counts words, and a
real model's run with it ends an error naming both counts. The operator never tells the two
apart.

The simulator counts a token per `\\s*(?:\\w+|[^\\w\\s])` piece; the word tokenizer splits on
whitespace and then into `\\w+` runs and single punctuation marks, so both agree on every text
that does not end in whitespace. Its vocabulary comes from GSM8K's train split (14,855 words),
so the build is deterministic and needs no network; it is made at run time, never committed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from kvgate.config import hf_hub_cache

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
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def readable_tokenizer_dir(source: str, environ: Mapping[str, str]) -> Path | None:
    """The directory holding `source`'s tokenizer (a local directory, or a hub repo id's snapshot
    in the Hugging Face cache `environ` names, never downloaded), or None when the Job cannot
    read one."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path if any((path / name).is_file() for name in TOKENIZER_FILES) else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in TOKENIZER_FILES:
        try:
            found = try_to_load_from_cache(source, name, cache_dir=hf_hub_cache(environ))
        except ValueError:  # not a repo id (huggingface_hub validates it)
            return None
        if isinstance(found, str):
            return Path(found).parent
    return None


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
