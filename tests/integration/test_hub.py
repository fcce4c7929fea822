"""kvgate.adapters.hub against a loopback hub: the real huggingface_hub client code path.

Every test counts the body bytes the fake hub sent, to prove only headers were read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubserver import FakeHub, header_bytes, write_checkpoint
from huggingface_hub import constants

from kvgate.adapters.hub import read_hub_checkpoint
from kvgate.checkpoint.scales import scan_scales
from kvgate.errors import HubError, ParseError, SpecError

pytestmark = pytest.mark.integration

REPO = "kvgate-test/tiny-qwen"
QWEN3_8B = Path(__file__).resolve().parents[1] / "data" / "configs" / "qwen3-8b.json"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    # an empty cache and online mode, whatever the machine has configured
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub() as server:
        yield server


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, list[Path]]:
    # weights of 256x256 fp16 make each of the 4 shards about 3 MB
    config = json.loads(QWEN3_8B.read_text())
    directory = tmp_path / "repo"
    files = write_checkpoint(directory, layers=36, shards=4, config=config, weight_shape=(256, 256))
    return directory, files


def test_sharded_repo_reads_exactly_the_headers(
    hub: FakeHub, sharded: tuple[Path, list[Path]]
) -> None:
    directory, files = sharded
    hub.add_repo(REPO, directory)
    headers = read_hub_checkpoint(REPO, endpoint=hub.endpoint)

    expected = sum(header_bytes(p) for p in files)
    assert headers.header_bytes == expected
    assert headers.bytes_read == expected
    for path in files:
        # each shard: 8 length bytes + the JSON header, nothing of the weights
        assert hub.served[path.name] == header_bytes(path)
        assert hub.served[path.name] < path.stat().st_size / 100
    assert headers.files == tuple(p.name for p in files)
    assert headers.commit == hub.repos[REPO].sha
    assert len(headers.tensors) == 3 + 36 * 13

    report = scan_scales(headers.tensors, config=headers.config, source=headers.source)
    assert (report.coverage, report.total_layers, len(report.covered_layers)) == ("all", 36, 36)


def test_range_requests_are_what_the_client_sent(
    hub: FakeHub, sharded: tuple[Path, list[Path]]
) -> None:
    directory, files = sharded
    hub.add_repo(REPO, directory)
    read_hub_checkpoint(REPO, endpoint=hub.endpoint)
    shard_ranges = sorted(r.range for r in hub.requests if r.path.endswith(files[0].name))
    assert shard_ranges == sorted(["bytes=0-7", f"bytes=8-{header_bytes(files[0]) - 1}"])
    assert all(r.status in (200, 206) for r in hub.requests)


def test_single_file_repo_at_a_branch_and_a_commit(hub: FakeHub, tmp_path: Path) -> None:
    directory = tmp_path / "single"
    [path] = write_checkpoint(
        directory, layers=4, single_file=True, scales=(), weight_shape=(128, 128)
    )
    repo = hub.add_repo(REPO, directory, branches=("main", "v1"))
    by_branch = read_hub_checkpoint(REPO, revision="v1", endpoint=hub.endpoint)
    by_commit = read_hub_checkpoint(REPO, revision=repo.sha, endpoint=hub.endpoint)
    assert by_branch.files == by_commit.files == ("model.safetensors",)
    assert by_branch.source == f"{REPO}@v1"
    assert hub.bytes_served("model.safetensors") == 2 * header_bytes(path)
    report = scan_scales(by_branch.tensors, config=by_branch.config)
    assert [f.code for f in report.findings] == ["ScalesMissing"]


def test_private_repo_needs_the_token(hub: FakeHub, sharded: tuple[Path, list[Path]]) -> None:
    directory, _ = sharded
    hub.add_repo(REPO, directory, token="hf_secret")
    with pytest.raises(SpecError) as caught:
        read_hub_checkpoint(REPO, endpoint=hub.endpoint, token=False)
    assert str(caught.value) == (
        f"model: hub repo '{REPO}' not found (a private repo needs a token: --token-env)"
    )
    headers = read_hub_checkpoint(REPO, endpoint=hub.endpoint, token="hf_secret")
    assert len(headers.files) == 4
    assert all(r.authorized for r in hub.requests if r.status in (200, 206))


ERRORS = [
    # repo setup, revision, error, message
    (
        "missing",
        None,
        SpecError,
        "model: hub repo 'kvgate-test/tiny-qwen' not found (a private repo needs a token: --token-env)",
    ),
    (
        "plain",
        "nope",
        SpecError,
        "revision: 'nope' is not a revision of hub repo 'kvgate-test/tiny-qwen'",
    ),
    (
        "gated",
        None,
        HubError,
        "kvgate-test/tiny-qwen@main: the repo is gated; accept its terms on the hub and pass a token (--token-env)",
    ),
    (
        "no-weights",
        None,
        ParseError,
        "kvgate-test/tiny-qwen@main: no model.safetensors or model.safetensors.index.json; "
        "kvgate reads safetensors checkpoints",
    ),
]


@pytest.mark.parametrize(("setup", "revision", "error", "message"), ERRORS)
def test_hub_errors(
    hub: FakeHub,
    sharded: tuple[Path, list[Path]],
    tmp_path: Path,
    setup: str,
    revision: str | None,
    error: type[Exception],
    message: str,
) -> None:
    directory, _ = sharded
    if setup == "gated":
        hub.add_repo(REPO, directory, gated=True)
    elif setup == "plain":
        hub.add_repo(REPO, directory)
    elif setup == "no-weights":
        bare = tmp_path / "bare"
        bare.mkdir()
        (bare / "config.json").write_text("{}")
        hub.add_repo(REPO, bare)
    with pytest.raises(error) as caught:
        read_hub_checkpoint(REPO, revision=revision, endpoint=hub.endpoint)
    assert str(caught.value) == message
    # nothing but JSON was ever sent
    assert hub.bytes_served(".safetensors") == 0


def test_shard_listed_in_index_but_missing(hub: FakeHub, tmp_path: Path) -> None:
    directory = tmp_path / "holes"
    files = write_checkpoint(directory, layers=4, shards=2)
    files[1].unlink()
    repo = hub.add_repo(REPO, directory)
    with pytest.raises(ParseError) as caught:
        read_hub_checkpoint(REPO, endpoint=hub.endpoint)
    assert str(caught.value) == (
        f"{REPO}@main: a file the repo lists is missing on the hub (404 Client Error. Entry Not "
        f"Found for url: {hub.endpoint}/{REPO}/resolve/{repo.sha}/{files[1].name}.)"
    )


def test_server_that_ignores_range_cannot_push_a_whole_shard(hub: FakeHub, tmp_path: Path) -> None:
    directory = tmp_path / "big"
    [path] = write_checkpoint(directory, layers=2, single_file=True, weight_shape=(1024, 1024))
    hub.add_repo(REPO, directory, honour_range=False)
    headers = read_hub_checkpoint(REPO, endpoint=hub.endpoint)
    assert len(headers.tensors) == 3 + 2 * 13
    # the client stops reading once it has the header
    assert headers.bytes_read is not None
    assert headers.bytes_read < path.stat().st_size / 4


def test_offline_mode_and_unreachable_hub(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError) as caught:
        read_hub_checkpoint(REPO, endpoint=hub.endpoint)
    assert str(caught.value) == f"{REPO}@main: HF_HUB_OFFLINE is set; unset it to read the hub"
    assert caught.value.unreachable  # preflight then tries the local HF cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    endpoint = hub.endpoint
    hub.stop()
    with pytest.raises(HubError) as caught:
        read_hub_checkpoint(REPO, endpoint=endpoint)
    assert str(caught.value).startswith(f"{REPO}@main: cannot reach the hub (ConnectError: ")
    assert caught.value.unreachable


def test_hfapi_reader_agrees_but_fetches_100kb_per_shard(
    hub: FakeHub, sharded: tuple[Path, list[Path]]
) -> None:
    directory, files = sharded
    hub.add_repo(REPO, directory)
    ranges = read_hub_checkpoint(REPO, endpoint=hub.endpoint)
    hub.reset_counts()
    library = read_hub_checkpoint(REPO, endpoint=hub.endpoint, reader="hfapi")
    assert library.tensors == ranges.tensors
    for path in files:
        # HfApi.parse_safetensors_file_metadata asks for bytes=0-100000 up front
        assert hub.served[path.name] == min(100_001, path.stat().st_size)


def test_preflight_cli_uses_hf_endpoint(
    hub: FakeHub, sharded: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    # GIVEN a private repo on the loopback hub, found through HF_ENDPOINT in a fresh process
    directory, files = sharded
    hub.add_repo(REPO, directory, token="hf_secret")
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf-home"),
        "MY_TOKEN": "hf_secret",
        "NO_PROXY": "127.0.0.1",
    }
    env.pop("HF_TOKEN", None)
    # WHEN preflight reads it
    done = subprocess.run(
        [sys.executable, "-m", "kvgate", "preflight", REPO, "--token-env", "MY_TOKEN", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    # THEN capacity and scales come back and only header bytes left the hub
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kv_bytes_per_token"] == {"bf16": 147_456, "fp8": 73_728}
    assert result["scales"]["present"] is True
    assert result["read"]["bytes_read"] == sum(header_bytes(p) for p in files)
    assert hub.bytes_served(".safetensors") == sum(header_bytes(p) for p in files)
    assert "hf_secret" not in done.stdout + done.stderr
