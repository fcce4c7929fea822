"""kvgate.evaluation.runner pieces that need no server: task configs, data dir, response checks."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pytest
import yaml

from hf_cache_layout import add_to_cache
from kvgate.config import hf_hub_cache, offline_requested
from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.runner import (
    DATA_NEXT_STEP,
    GSM8K_REVISION,
    HF_FILES,
    TASK_FILES,
    EvalSettings,
    HubFiles,
    MalformedResponseError,
    _check_completions,
    _strict_model_classes,
    count_test_questions,
    offline_environment,
    resolve_data_dir,
    resolve_hub_dataset,
    writable_cache_environment,
    write_task_config,
)

STOCK = {"gsm8k": "gsm8k.yaml", "gsm8k_cot": "gsm8k-cot.yaml"}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "gsm8k"
    d.mkdir()
    (d / "test.jsonl").write_text('{"question": "q1", "answer": "#### 1"}\n' * 3 + "\n")
    (d / "train.jsonl").write_text('{"question": "q2", "answer": "#### 2"}\n')
    return d


@pytest.mark.parametrize("task", sorted(TASK_FILES))
def test_pinned_task_matches_lm_eval_stock_config(task: str) -> None:
    ours = yaml.safe_load(
        (resources.files("kvgate.evaluation") / "tasks" / TASK_FILES[task]).read_text()
    )
    stock = yaml.safe_load(
        (resources.files("lm_eval") / "tasks" / "gsm8k" / STOCK[task]).read_text()
    )
    stock.pop("tag", None)
    assert ours == stock


def test_offline_config_reads_local_files(tmp_path: Path, data_dir: Path) -> None:
    settings = EvalSettings(task="gsm8k", data_dir=data_dir)
    path = write_task_config(settings, tmp_path)
    config = yaml.safe_load(path.read_text())
    assert path.name == "kvgate_gsm8k.yaml" and config["task"] == "kvgate_gsm8k"
    assert config["dataset_path"] == "json" and config["dataset_name"] is None
    assert config["dataset_kwargs"]["data_files"] == {
        "test": str(data_dir / "test.jsonl"),
        "train": str(data_dir / "train.jsonl"),
    }
    assert config["num_fewshot"] == 5 and config["fewshot_split"] == "train"


def test_cot_config_needs_only_the_test_split(tmp_path: Path, data_dir: Path) -> None:
    config = yaml.safe_load(
        write_task_config(EvalSettings(task="gsm8k_cot", data_dir=data_dir), tmp_path).read_text()
    )
    assert config["dataset_kwargs"]["data_files"] == {"test": str(data_dir / "test.jsonl")}
    assert config["num_fewshot"] == 8 and config["fewshot_config"]["sampler"] == "first_n"


def test_without_data_dir_the_hub_dataset_is_used(tmp_path: Path) -> None:
    config = yaml.safe_load(write_task_config(EvalSettings(), tmp_path).read_text())
    assert (config["dataset_path"], config["dataset_name"]) == ("openai/gsm8k", "main")
    assert "dataset_kwargs" not in config
    assert offline_environment(EvalSettings()) == {}


def test_offline_environment(data_dir: Path) -> None:
    env = offline_environment(EvalSettings(data_dir=data_dir))
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"


def test_unknown_task(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="--task: 'mmlu' is not one of"):
        write_task_config(EvalSettings(task="mmlu"), tmp_path)


def test_data_dir_flag_wins_over_environment(data_dir: Path, tmp_path: Path) -> None:
    assert resolve_data_dir(str(data_dir), {"KVGATE_GSM8K_DIR": "/nowhere"}) == data_dir
    assert resolve_data_dir(None, {"KVGATE_GSM8K_DIR": str(data_dir)}) == data_dir
    assert resolve_data_dir(None, {}) is None


@pytest.mark.parametrize(
    ("flag", "env", "message"),
    [
        ("/nowhere/gsm8k", {}, "--data-dir: /nowhere/gsm8k is not a directory"),
        (None, {"KVGATE_GSM8K_DIR": "/nowhere"}, "KVGATE_GSM8K_DIR: /nowhere is not a directory"),
    ],
)
def test_data_dir_errors(flag: str | None, env: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        resolve_data_dir(flag, env)
    assert str(err.value).startswith(message)


def test_data_dir_without_train_file(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("{}\n")
    with pytest.raises(SpecError, match=r"has no train\.jsonl"):
        resolve_data_dir(str(tmp_path), {})


def test_count_test_questions(data_dir: Path) -> None:
    assert count_test_questions(data_dir) == 3
    assert count_test_questions(None) == 1319


GOOD_COMPLETION = {"choices": [{"index": 0, "text": "#### 18", "finish_reason": "stop"}]}
GOOD_CHAT = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "18"}}]}


@pytest.mark.parametrize(
    ("outputs", "chat"),
    [
        ({}, False),
        ({"choices": []}, False),
        ({"choices": [{"index": 0}]}, False),
        ({"choices": [{"text": "x"}]}, False),
        ({"error": {"message": "overloaded"}}, False),
        ("not a dict", False),
        ({"choices": [{"index": 0, "text": "x"}]}, True),
        ({"choices": [{"index": 0, "message": {"content": 7}}]}, True),
    ],
)
def test_malformed_responses_raise(outputs: object, chat: bool) -> None:
    with pytest.raises(MalformedResponseError):
        _check_completions(outputs, chat=chat)


def test_well_formed_responses_pass_even_without_a_number() -> None:
    _check_completions(GOOD_COMPLETION, chat=False)
    _check_completions([GOOD_COMPLETION, GOOD_COMPLETION], chat=False)
    _check_completions(GOOD_CHAT, chat=True)
    garbage = {"choices": [{"index": 0, "text": "the the the"}]}
    _check_completions(garbage, chat=False)


def test_strict_models_validate_then_parse() -> None:
    completions, chat = _strict_model_classes()
    assert completions.parse_generations(GOOD_COMPLETION) == ["#### 18"]
    with pytest.raises(MalformedResponseError):
        completions.parse_generations({"object": "error"})
    # lm-eval's own chat parser would turn this into an empty answer; ours refuses it.
    instance = chat.__new__(chat)
    instance.think_end_token = None
    assert instance.parse_generations(GOOD_CHAT) == ["18"]
    with pytest.raises(MalformedResponseError):
        instance.parse_generations({"choices": "oops"})


def test_cache_moves_to_scratch_only_when_home_is_read_only(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    cache = tmp_path / "cache"  # does not exist: its nearest existing parent is probed
    probed: list[Path] = []

    def read_only(path: Path) -> bool:
        probed.append(path)
        return False

    env = {"XDG_CACHE_HOME": str(cache)}
    assert writable_cache_environment(env, scratch, read_only) == {
        "HF_HOME": str(scratch / "hf-home")
    }
    assert probed == [tmp_path]
    assert writable_cache_environment(env, scratch, lambda p: True) == {}
    # An explicit cache setting is always kept.
    assert writable_cache_environment({"HF_HOME": "/x"}, scratch, read_only) == {}


# ---- the Hub dataset from the local HF cache (resolved before any arm is contacted) ----------


def _parquet(rows: list[dict[str, str]]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    """An HF_HOME whose hub cache holds openai/gsm8k's two parquet files (3 test questions)."""
    home = tmp_path / "hf-home"
    add_to_cache(
        home / "hub",
        "openai/gsm8k",
        {
            HF_FILES["test"]: _parquet([{"question": "q1", "answer": "#### 1"}] * 3),
            HF_FILES["train"]: _parquet([{"question": "q2", "answer": "#### 2"}]),
        },
        kind="dataset",
        commit=GSM8K_REVISION,
    )
    return home


def _no_probe(endpoint: str) -> str | None:
    raise AssertionError(f"the hub at {endpoint} was probed though the cache has the dataset")


@pytest.mark.parametrize("offline", [{"HF_HUB_OFFLINE": "1"}, {}])
def test_hub_dataset_comes_from_the_cache_without_the_network(
    hf_home: Path, offline: dict[str, str]
) -> None:
    files = resolve_hub_dataset({"HF_HOME": str(hf_home), **offline}, probe=_no_probe)
    snapshot = hf_home / "hub" / "datasets--openai--gsm8k" / "snapshots" / GSM8K_REVISION
    assert files == HubFiles(test=snapshot / HF_FILES["test"], train=snapshot / HF_FILES["train"])
    settings = EvalSettings(hub_files=files)
    assert settings.to_dict()["dataset"] == f"openai/gsm8k ({snapshot})"
    # lm-eval then reads the cached files as local parquet, offline
    config = yaml.safe_load(write_task_config(settings, hf_home).read_text())
    assert config["dataset_path"] == "parquet" and config["dataset_name"] is None
    assert config["dataset_kwargs"]["data_files"] == {
        "test": str(files.test),
        "train": str(files.train),
    }
    assert offline_environment(settings)["HF_DATASETS_OFFLINE"] == "1"


def test_hf_hub_cache_overrides_hf_home(hf_home: Path, tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "elsewhere"), "HF_HUB_CACHE": str(hf_home / "hub")}
    assert resolve_hub_dataset(env, probe=_no_probe).test.is_file()
    assert hf_hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hf_hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")


def test_offline_cache_miss_names_the_dataset_and_the_fix(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    with pytest.raises(EvalError) as err:
        resolve_hub_dataset(env, probe=_no_probe)
    message = str(err.value)
    assert message.startswith("GSM8K dataset openai/gsm8k: no local copy")
    assert str(tmp_path / "empty" / "hub") in message and "HF_HUB_OFFLINE" in message
    assert message.endswith(DATA_NEXT_STEP)


def test_unreachable_hub_is_probed_once_and_named(tmp_path: Path) -> None:
    probed: list[str] = []

    def probe(endpoint: str) -> str | None:
        probed.append(endpoint)
        return "ConnectError: [Errno -2] Name or service not known"

    env = {"HF_HOME": str(tmp_path / "empty"), "HF_ENDPOINT": "https://hub.example/"}
    with pytest.raises(EvalError, match=r"the Hub at https://hub\.example is unreachable"):
        resolve_hub_dataset(env, probe=probe)
    assert probed == ["https://hub.example"]


@pytest.mark.parametrize(
    ("env", "offline"),
    [
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_DATASETS_OFFLINE": "true"}, True),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({}, False),
    ],
)
def test_offline_requested(env: dict[str, str], offline: bool) -> None:
    assert offline_requested(env) is offline


def test_a_cache_of_another_gsm8k_revision_is_not_used(tmp_path: Path) -> None:
    """The download is pinned: a cached `main` of another commit is not the pinned dataset."""
    home = tmp_path / "hf-home"
    add_to_cache(home / "hub", "openai/gsm8k", {name: b"x" for name in HF_FILES.values()},
                 kind="dataset", commit="f" * 40)  # fmt: skip
    with pytest.raises(EvalError, match="not in the Hugging Face cache"):
        resolve_hub_dataset({"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}, probe=_no_probe)


def test_the_hub_download_asks_for_the_pinned_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    asked: list[tuple[str, str | None]] = []

    def download(repo_id: str, filename: str, **kw: object) -> str:
        asked.append((filename, kw.get("revision")))  # type: ignore[arg-type]
        if kw.get("local_files_only"):
            raise FileNotFoundError(filename)
        path = tmp_path / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    resolve_hub_dataset({"HF_HOME": str(tmp_path / "h")}, probe=lambda endpoint: None)
    assert {revision for _, revision in asked} == {GSM8K_REVISION}
    assert len(asked) >= 3  # the cache first, then the download of both files


def test_lm_eval_runs_no_git_and_draws_no_bars_into_a_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """first-hour-2 #14: "fatal: not a git repository" twice per look, and tqdm bars in the
    Job's log."""
    import io
    import subprocess
    import sys

    import lm_eval.evaluator

    from kvgate.evaluation.runner import quiet_lm_eval

    def no_git(*args: object, **kwargs: object) -> bytes:
        raise AssertionError(f"lm-eval ran {args}")

    monkeypatch.setattr(subprocess, "check_output", no_git)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log, not a terminal
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"})
    monkeypatch.chdir(tmp_path)  # not a git checkout, as the Job's /tmp is not
    quiet_lm_eval()
    assert lm_eval.evaluator.get_git_commit_hash() is None
    assert os.environ.get("TQDM_DISABLE") == "1"
