"""`kvgate preflight ORG/NAME` offline: the local Hugging Face cache serves, else a next step.

The cache is built in tmp_path in huggingface_hub's own layout (tests/hf_cache_layout.py) and
found through huggingface_hub's cache API; the hub reader is replaced by one that fails the
test if it is called, so "offline" is checked, not assumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

import kvgate.adapters.hub as hub
from hf_cache_layout import COMMIT, add_to_cache
from kvgate.cli import main
from kvgate.commands.preflight import OFFLINE_NEXT_STEP
from kvgate.errors import HubError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
REPO = "acme/qwen3-8b-kv"
LAYERS = 36


def _shard(layers: range) -> bytes:
    return save(
        {
            f"model.layers.{i}.self_attn.{name}": np.ones((), np.float32)
            if name.endswith("scale")
            else np.zeros((8, 8), np.float16)
            for i in layers
            for name in ("k_proj.weight", "k_scale", "v_scale")
        }
    )


def _sharded_model() -> dict[str, bytes]:
    """config.json, an index and two shards holding every layer's k and v scales."""
    halves = {"model-00001-of-00002.safetensors": range(0, 18),
              "model-00002-of-00002.safetensors": range(18, LAYERS)}  # fmt: skip
    weight_map = {
        f"model.layers.{i}.self_attn.{name}": shard
        for shard, layers in halves.items()
        for i in layers
        for name in ("k_proj.weight", "k_scale", "v_scale")
    }
    return {
        "config.json": (CONFIGS / "qwen3-8b.json").read_bytes(),
        "model.safetensors.index.json": json.dumps({"weight_map": weight_map}).encode(),
        **{shard: _shard(layers) for shard, layers in halves.items()},
    }


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """HF_HOME in tmp_path (its hub cache is returned, empty), nothing else of the user's."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                 "HF_DATASETS_OFFLINE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return tmp_path / "hf-home" / "hub"


def _hub_must_not_be_read(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the hub was read under HF_HUB_OFFLINE")


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise HubError(
        f"{REPO}@main: cannot reach the hub (ConnectError: [Errno -2] Name or service not known)",
        unreachable=True,
    )


def _preflight(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["preflight", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_offline_reads_a_cached_sharded_checkpoint(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = add_to_cache(env, REPO, _sharded_model())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "read_hub_checkpoint", _hub_must_not_be_read)
    code, out, err = _preflight(capsys, REPO, "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["source"] == f"{REPO}@main (cached {snapshot})"
    assert result["commit"] == COMMIT
    assert result["kv_bytes_per_token"] == {"bf16": 147_456, "fp8": 73_728}
    scales = result["scales"]
    assert (scales["present"], scales["k"], scales["v"]) == (True, LAYERS, LAYERS)
    assert result["read"]["files"] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    # a pinned revision is found by its snapshot, without refs
    code, out, _ = _preflight(capsys, REPO, "--revision", COMMIT, "--json")
    assert code == 0 and json.loads(out)["scales"]["present"] is True


def test_offline_with_only_config_cached_gives_capacity(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _sharded_model()
    snapshot = add_to_cache(env, REPO, {"config.json": files["config.json"]})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "read_hub_checkpoint", _hub_must_not_be_read)
    code, out, _ = _preflight(capsys, REPO, "--json")
    result = json.loads(out)
    assert code == 0
    assert result["source"] == str(snapshot / "config.json")
    assert result["kv_bytes_per_token"]["fp8"] == 73_728
    assert result["scales"]["coverage"] == "unknown"


def test_offline_cache_miss_says_what_to_do(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "read_hub_checkpoint", _hub_must_not_be_read)
    code, out, err = _preflight(capsys, REPO)
    assert (code, out) == (4, "")
    assert err == (
        f"kvgate preflight: error: {REPO}@main: HF_HUB_OFFLINE is set and the Hugging Face cache "
        f"{env} does not have the model's config.json; {OFFLINE_NEXT_STEP}\n"
    )
    assert "--config-file" not in err and "local checkpoint directory" in err


def test_unreachable_hub_falls_back_to_the_cache(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hub, "read_hub_checkpoint", _unreachable)
    code, _, err = _preflight(capsys, REPO)
    assert code == 4 and err.count("\n") == 1
    assert "cannot reach the hub (ConnectError" in err and err.endswith(OFFLINE_NEXT_STEP + "\n")
    add_to_cache(env, REPO, _sharded_model())
    code, out, _ = _preflight(capsys, REPO, "--json")
    assert code == 0 and json.loads(out)["scales"]["present"] is True


def test_a_hub_that_answers_no_is_not_hidden_by_the_cache(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_to_cache(env, REPO, _sharded_model())

    def gated(*args: Any, **kwargs: Any) -> Any:
        raise HubError(f"{REPO}@main: the repo is gated; accept its terms on the hub")

    monkeypatch.setattr(hub, "read_hub_checkpoint", gated)
    code, out, err = _preflight(capsys, REPO)
    assert (code, out) == (4, "")
    assert (
        err
        == f"kvgate preflight: error: {REPO}@main: the repo is gated; accept its terms on the hub\n"
    )


def test_an_index_entry_outside_the_snapshot_is_refused(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _sharded_model()
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {"x": "../../../../etc/passwd"}}
    ).encode()
    add_to_cache(env, REPO, files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = _preflight(capsys, REPO)
    assert code == 2 and "outside the snapshot" in err
