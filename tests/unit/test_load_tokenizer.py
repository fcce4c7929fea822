"""The offline tokenizer for inference-perf counts exactly as the simulator does."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kvgate.load.tokenizer import TokenizerBuildError, build_word_tokenizer
from kvgate.sim.config import default_gsm8k_dir
from kvgate.sim.textgen import count_tokens

TRAIN = Path(os.environ.get("KVGATE_GSM8K_DIR") or default_gsm8k_dir()) / "train.jsonl"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_tokenizer(TRAIN, tmp_path_factory.mktemp("tok") / "simword")


def test_build_is_deterministic(built: Path, tmp_path: Path) -> None:
    again = build_word_tokenizer(TRAIN, tmp_path / "again")
    assert (again / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    config = json.loads((built / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_counts_match_the_simulator_on_gsm8k_and_random_text(built: Path) -> None:
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    assert vocab > 10000  # GSM8K's words, not a stub
    rows = [json.loads(line) for line in TRAIN.read_text().splitlines()[:200]]
    texts = [row["question"] + "\n" + row["answer"] for row in rows]
    rng = random.Random(7)
    for length in (1, 7, 64, 500, 2000):
        ids = [rng.randrange(4, vocab) for _ in range(length)]
        texts.append(tokenizer.decode(ids))
    texts += ["Unseen words: zyzzyva, qwertyuiop!", "x=3.5; y=(x+1)/2 -- done?"]
    mismatched = [
        text for text in texts if len(tokenizer.encode(text).ids) != count_tokens(text.rstrip())
    ]
    assert mismatched == []
    assert len(tokenizer.encode(texts[-1]).ids) == 19  # x = 3 . 5 ; y = ( x + 1 ) / 2 - - done ?


def test_missing_or_empty_corpus_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TokenizerBuildError, match=r"nowhere\.jsonl: cannot read"):
        build_word_tokenizer(tmp_path / "nowhere.jsonl", tmp_path / "out")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TokenizerBuildError, match=r"empty\.jsonl: no questions"):
        build_word_tokenizer(tmp_path / "empty.jsonl", tmp_path / "out")
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    with pytest.raises(TokenizerBuildError, match=r"junk\.jsonl:1: not a JSON line"):
        build_word_tokenizer(tmp_path / "junk.jsonl", tmp_path / "out")
