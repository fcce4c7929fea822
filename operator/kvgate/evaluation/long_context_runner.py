"""Runs the long-context needle task through lm-eval against both arms, and loads tokenizers.

The items are generated once (`long_context.generate_items`), written to a JSONL file, and
evaluated by lm-eval's task machinery (a `kvgate_niah` task: dataset `json`, the RULER prompt
fields, `generate_until` with 128 tokens) with the same strict local-completions model as GSM8K.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import yaml

from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.job import on_both_arms
from kvgate.evaluation.long_context import (
    TOKENS_TO_GENERATE,
    NeedleAnswer,
    NeedleItem,
    answers_from_samples,
    write_items,
)
from kvgate.evaluation.runner import Arm, EvalSettings, LmEvalTask, writable_cache_environment
from kvgate.spec.rollout import is_commit, is_local_path

TASK_NAME: Final = "kvgate_niah"
_UTILS: Final = "from kvgate.evaluation.long_context import process_results  # noqa: F401\n"


def load_tokenizer(
    spec: str, revision: str | None = None
) -> tuple[Callable[[str], int], str | None]:
    """A token counter from a tokenizer directory, a tokenizer.json, or a hub repo id, and the
    hub commit it was read at (None for a local one).

    A repo id downloads only `tokenizer.json` at `revision` (a 40-hex commit; None: the main
    branch's head, whose commit is returned so the caller can record it). HF_TOKEN / the
    rollout's token is honoured by huggingface_hub; tests pass a directory built locally.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - the eval extra installs it
        raise SpecError("--tokenizer", "the `tokenizers` package is not installed") from exc
    if revision is not None and not is_commit(revision):
        raise SpecError("--tokenizer-revision", f"{revision[:60]!r} is not a 40-hex commit")
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    commit: str | None = None
    if not path.is_file():
        if Path(spec).expanduser().exists() or is_local_path(spec):
            raise SpecError("--tokenizer", f"{spec}: no tokenizer.json there")
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(spec, "tokenizer.json", revision=revision))
        except Exception as exc:  # the hub client raises many kinds; all mean "not had"
            where = f"{spec}@{revision}" if revision else spec
            raise EvalError(f"tokenizer {where}: cannot download tokenizer.json: {exc}") from exc
        commit = snapshot_commit(path) or revision
    elif revision is not None:
        raise SpecError(
            "--tokenizer-revision", f"tokenizer {spec!r} is local; a revision pins a hub repo"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise SpecError("--tokenizer", f"{path}: not a tokenizer.json ({exc})") from exc

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    if count("The quick brown fox jumps over the lazy dog.") == 0:
        raise SpecError("--tokenizer", f"{spec} encodes text to 0 tokens")
    return count, commit


def snapshot_commit(path: Path) -> str | None:
    """The commit of a file huggingface_hub cached: `.../snapshots/<commit>/<filename>`."""
    parent = path.parent
    if parent.parent.name == "snapshots" and is_commit(parent.name):
        return parent.name
    return None


def write_task(items: Sequence[NeedleItem], directory: Path) -> None:
    """The lm-eval task (YAML + its process_results module) and the items it reads."""
    data = directory / "niah_items.jsonl"
    write_items(items, data)
    config = {
        "task": TASK_NAME,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "output_type": "generate_until",
        "test_split": "test",
        "doc_to_text": "{{input}}",
        "doc_to_target": "{{outputs}}",
        "gen_prefix": "{{gen_prefix}}",
        "target_delimiter": " ",
        "process_results": "__PROCESS__",
        "metric_list": [{"metric": "score", "aggregation": "mean", "higher_is_better": True}],
        "generation_kwargs": {
            "do_sample": False,
            "temperature": 0.0,
            "max_gen_toks": TOKENS_TO_GENERATE,
            "until": [],
        },
        "repeats": 1,
        "metadata": {"version": 1.0, "source": "lm-eval 0.4.13 ruler niah_single_1.yaml"},
    }
    text = yaml.safe_dump(config, sort_keys=False)
    assert "process_results: __PROCESS__\n" in text
    text = text.replace("__PROCESS__", "!function kvgate_niah_utils.process_results")
    (directory / f"{TASK_NAME}.yaml").write_text(text, encoding="utf-8")
    (directory / "kvgate_niah_utils.py").write_text(_UTILS, encoding="utf-8")


class NeedleRunner(LmEvalTask):
    """Both arms through lm-eval on the same item file, in parallel."""

    def __init__(
        self,
        settings: EvalSettings,
        arms: Sequence[Arm],
        workdir: Path,
        items: Sequence[NeedleItem],
    ) -> None:
        include = workdir / "niah"
        include.mkdir(parents=True, exist_ok=True)
        os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        os.environ.update(writable_cache_environment(os.environ, workdir))
        write_task(items, include)
        super().__init__(
            settings,
            arms,
            include,
            TASK_NAME,
            chat=False,
            max_gen_toks=TOKENS_TO_GENERATE,
            doing=" on the needle task",
        )

    def run(self) -> dict[str, dict[int, NeedleAnswer]]:
        def run_arm(name: str) -> dict[int, NeedleAnswer]:
            return answers_from_samples(self.samples(name), name)

        return on_both_arms(run_arm, self._arms, "kvgate-niah")
