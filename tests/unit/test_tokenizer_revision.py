"""Hub downloads are pinned (issue 25): the long-context task's tokenizer is read at the commit
`spec.gates.accuracy.longContext.tokenizerRevision` names (40 hex digits; a branch or tag can
move), passed to huggingface_hub as `revision=`; unpinned, the commit the eval Job resolved is
recorded in status. Downloads go to a local hub cache in offline mode: nothing is fetched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_controller import TERMINAL, World

from kvgate.change import manifests
from kvgate.commands import eval as eval_cmd
from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.long_context_runner import load_tokenizer, snapshot_commit
from kvgate.records.evalsummary import AccuracyStatus
from kvgate.records.status import RolloutStatus
from kvgate.spec.rollout import RolloutSpec

CRD = Path(__file__).resolve().parents[2] / "crds" / "kvgate.io_kvcacherollouts.yaml"
PINNED = "0123456789abcdef0123456789abcdef01234567"
HEAD = "89abcdef0123456789abcdef0123456789abcdef"
FIELD = "spec.gates.accuracy.longContext.tokenizerRevision"


def parse(lc: dict[str, Any]) -> RolloutSpec:
    return RolloutSpec.from_dict(
        {"targetRef": {"name": "qwen"}, "gates": {"accuracy": {"longContext": lc}}}
    )


def errors(lc: dict[str, Any]) -> list[str]:
    with pytest.raises(ExceptionGroup) as info:
        parse(lc)
    return [str(e) for e in info.value.exceptions]


# --- the spec ------------------------------------------------------------------------------------


def test_a_commit_is_kept() -> None:
    lc = parse({"tokenizer": "Qwen/Qwen3-8B", "tokenizerRevision": PINNED}).accuracy.long_context
    assert lc is not None and lc.tokenizer_revision == PINNED
    unpinned = parse({}).accuracy.long_context
    assert unpinned is not None and unpinned.tokenizer_revision is None


@pytest.mark.parametrize(
    "value",
    ["main", "v1.0", PINNED[:39], PINNED.upper(), PINNED + "0", PINNED[:39] + "\n", "refs/pr/1"],
)
def test_a_revision_that_is_not_a_commit_is_one_line_naming_the_field(value: str) -> None:
    assert errors({"tokenizerRevision": value}) == [
        f"{FIELD}: {value!r} is not a commit; use the 40 hex digits of a hub commit "
        "(a branch or tag can move)"
    ]


def test_a_revision_for_a_local_tokenizer_is_refused() -> None:
    assert errors({"tokenizer": "/models/tok", "tokenizerRevision": PINNED}) == [
        f"{FIELD}: tokenizer '/models/tok' is a path; a revision pins a hub repo"
    ]


def test_the_crd_pattern_is_the_same_rule() -> None:
    doc = yaml.safe_load(CRD.read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    lc = spec["properties"]["gates"]["properties"]["accuracy"]["properties"]["longContext"]
    pattern = lc["properties"]["tokenizerRevision"]["pattern"]
    for value in [PINNED, "main", PINNED.upper(), PINNED[:39], PINNED + "0"]:
        crd_ok = re.search(pattern, value) is not None  # the apiserver's ECMA search
        try:
            parse({"tokenizerRevision": value})
            spec_ok = True
        except ExceptionGroup:
            spec_ok = False
        assert crd_ok == spec_ok, value


# --- the eval Job's command ----------------------------------------------------------------------


def command(lc: dict[str, Any], tokenizer: str = "Qwen/Qwen3-8B") -> list[str]:
    return manifests.eval_command(
        parse(lc),
        control_url="http://a:8000/v1/completions",
        candidate_url="http://b:8000/v1/completions",
        model="Qwen/Qwen3-8B",
        concurrency=8,
        max_model_len=16384,
        tokenizer=tokenizer,
    )


def test_the_revision_reaches_the_command_and_kvgate_eval_reads_it() -> None:
    cmd = command({"tokenizerRevision": PINNED})
    parser = argparse.ArgumentParser()
    eval_cmd.configure(parser)
    args = parser.parse_args(cmd[2:])
    assert (args.tokenizer, args.tokenizer_revision) == ("Qwen/Qwen3-8B", PINNED)
    request = eval_cmd._long_context_request(args)
    assert request is not None and request["tokenizer_revision"] == PINNED
    assert "--tokenizer-revision" not in command({})
    # the model's tokenizer named by a path in the image: nothing to pin
    assert "--tokenizer-revision" not in command({"tokenizerRevision": PINNED}, "/models/m")


def test_the_revision_reaches_the_job_the_operator_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(
        monkeypatch,
        model={"name": "Qwen/Qwen3-8B"},
        gates={"capacity": {"mode": "off"}, "accuracy": {"longContext": {
            "tokenizer": "Qwen/Qwen3-8B", "tokenizerRevision": PINNED}}},
    )  # fmt: skip
    for _ in range(100):
        w.reconcile()
        w.now += dt.timedelta(seconds=2)
        if w.kube.of_kind("Job"):
            break
    (job,) = w.kube.of_kind("Job")
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--tokenizer") + 1 :][:3] == [
        "Qwen/Qwen3-8B",
        "--tokenizer-revision",
        PINNED,
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tokenizer", "Qwen/Qwen3-8B", "--tokenizer-revision", "main"],
            "--tokenizer-revision: 'main' is not a commit; use the 40 hex digits of a hub commit",
        ),
        (
            ["--tokenizer", "./tok", "--tokenizer-revision", PINNED],
            "--tokenizer-revision: './tok' is a path; a revision pins a hub repo",
        ),
    ],
)
def test_kvgate_eval_refuses_a_bad_revision_before_anything_runs(
    argv: list[str], message: str
) -> None:
    parser = argparse.ArgumentParser()
    eval_cmd.configure(parser)
    base = [
        "--control-url",
        "http://a/v1/completions",
        "--candidate-url",
        "http://b/v1/completions",
    ]
    args = parser.parse_args([*base, "--long-context-tasks", "niah_single_1",
                              "--max-model-len", "8192", *argv])  # fmt: skip
    with pytest.raises(SpecError) as info:
        eval_cmd._long_context_request(args)
    assert str(info.value) == message


# --- the download: huggingface_hub's own cache, offline ------------------------------------------


def save_tokenizer(path: Path, *, spaces: bool) -> None:
    """A word-level tokenizer; with `spaces`, each space is a token of its own."""
    tokenizers = pytest.importorskip("tokenizers")
    pre = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre.Split(" ", "isolated") if spaces else pre.WhitespaceSplit()
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding org/tok at two commits, main at HEAD; the hub is unreachable."""
    from huggingface_hub import constants

    repo = tmp_path / "models--org--tok"
    # the two commits count differently: which one was read shows in the count
    save_tokenizer(repo / "snapshots" / PINNED, spaces=False)
    save_tokenizer(repo / "snapshots" / HEAD, spaces=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HEAD)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path


def test_a_pinned_revision_is_the_one_read(hub_cache: Path) -> None:
    count, commit = load_tokenizer("org/tok", PINNED)
    assert commit == PINNED
    head_count, head_commit = load_tokenizer("org/tok")
    assert head_commit == HEAD  # unpinned: main's head, resolved and returned
    # the pinned snapshot's vocabulary, not main's: the revision reached huggingface_hub
    assert (count("the quick brown fox"), head_count("the quick brown fox")) == (4, 7)


def test_a_commit_the_cache_does_not_have_is_an_eval_error_naming_it(hub_cache: Path) -> None:
    missing = "f" * 40
    with pytest.raises(EvalError) as info:
        load_tokenizer("org/tok", missing)
    assert str(info.value).startswith(f"tokenizer org/tok@{missing}: cannot download")


def test_a_local_tokenizer_has_no_commit(tmp_path: Path) -> None:
    save_tokenizer(tmp_path / "tok", spaces=False)
    assert load_tokenizer(str(tmp_path / "tok"))[1] is None
    with pytest.raises(SpecError, match="a revision pins a hub repo"):
        load_tokenizer(str(tmp_path / "tok"), PINNED)


def test_snapshot_commit_reads_the_cache_layout() -> None:
    assert snapshot_commit(Path(f"/c/models--a--b/snapshots/{PINNED}/tokenizer.json")) == PINNED
    assert snapshot_commit(Path("/c/models--a--b/snapshots/main/tokenizer.json")) is None
    assert snapshot_commit(Path(f"/models/{PINNED}/tokenizer.json")) is None


# --- the status ----------------------------------------------------------------------------------


def test_the_resolved_commit_is_a_typed_status_field() -> None:
    summary = {"verdict": "pass", "long_context": {"verdict": "pass", "tokenizer": "org/tok",
                                                   "tokenizer_revision": HEAD}}  # fmt: skip
    acc = AccuracyStatus.from_summary(summary)  # where the operator reads the Job's summary
    assert acc.long_context is not None
    assert (acc.long_context.tokenizer, acc.long_context.tokenizer_revision) == ("org/tok", HEAD)
    written = RolloutStatus(accuracy=acc).to_dict()["accuracy"]["longContext"]
    assert written["tokenizerRevision"] == HEAD


def test_the_operator_records_the_commit_the_eval_job_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch, gates={"capacity": {"mode": "off"},
                                  "accuracy": {"longContext": {"tokenizer": "org/tok"}}})  # fmt: skip
    block = {"kind": "kvgate.eval/long_context", "verdict": "error", "error": "x",
             "tokenizer": "org/tok", "tokenizer_revision": HEAD, "buckets": []}  # fmt: skip
    w.kube.eval_summary = {**w.kube.eval_summary, "long_context": block}
    for _ in range(300):
        w.reconcile()
        if (w.obj.get("status") or {}).get("accuracy") or w.phase in TERMINAL:
            break
        w.now += dt.timedelta(seconds=2)
    lc = RolloutStatus.from_dict(w.obj["status"]).accuracy
    assert lc is not None and lc.long_context is not None
    assert lc.long_context.tokenizer_revision == HEAD


@pytest.mark.parametrize(("revision", "read"), [(None, HEAD), (PINNED, PINNED)])
def test_kvgate_eval_reports_the_commit_it_read(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch, revision: str | None, read: str
) -> None:
    """The long_context block names the commit, even when the task fails after the download."""
    from kvgate.evaluation import long_context_runner

    def no_run(*_: Any) -> Any:
        raise EvalError("no endpoint here")

    monkeypatch.setattr(long_context_runner.NeedleRunner, "run", no_run)
    parser = argparse.ArgumentParser()
    eval_cmd.configure(parser)
    argv = ["--control-url", "http://a/v1/completions", "--candidate-url", "http://b/v1/completions",
            "--long-context-tasks", "niah_single_1", "--context-lengths", "256",
            "--tokenizer", "org/tok", *(["--tokenizer-revision", revision] if revision else [])]  # fmt: skip
    request = eval_cmd._long_context_request(parser.parse_args(argv))
    assert request is not None
    block = eval_cmd._run_long_context(request, None, [], hub_cache, 0)  # type: ignore[arg-type]
    assert block["error"] == "no endpoint here"
    assert (block["tokenizer"], block["tokenizer_revision"]) == ("org/tok", read)
