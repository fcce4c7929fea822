"""A verdict goes stale when the config that runs is neither the tested one nor the one before
the rollout: a backend env edit in Git (or by hand) after the verdict, another arg beside FP8.
Until Git applies the tested change (gate, report, pullRequest modes) the Deployment still runs
the config before the rollout, which is not a new config."""

from __future__ import annotations

from typing import Any

import pytest
from test_controller import World, _argocd_health, _drift_check, passing_gate

from kvgate.change import container as promotion
from kvgate.judge import verdictkey
from kvgate.judge.verdictkey import LiveKey
from kvgate.records.status import VerdictKey

PREVIOUS = {"command": ["vllm", "serve", "m"], "args": ["--max-model-len", "8192"],
            "env": [{"name": "HF_HOME", "value": "/data"}]}  # fmt: skip
CANDIDATE = {
    "command": ["vllm", "serve", "m"],
    "args": ["--max-model-len", "8192", "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
    "env": [{"name": "HF_HOME", "value": "/data"}, {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}],
}  # fmt: skip


def _with(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**base, **fields}


@pytest.mark.parametrize(
    ("live", "changed"),
    [
        (CANDIDATE, []),  # what was tested runs
        (PREVIOUS, []),  # not applied yet (gate mode before the sync), or taken out
        (_with(CANDIDATE, env=list(reversed(CANDIDATE["env"]))), []),  # env order is no change
        (
            _with(CANDIDATE, env=[*CANDIDATE["env"], {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]),
            ["env"],
        ),  # a backend env edit beside the tested change
        (
            _with(CANDIDATE, args=[*CANDIDATE["args"][:-1], "FLASHINFER"]),
            ["args"],
        ),  # the tested backend arg changed
        (
            _with(PREVIOUS, args=[*PREVIOUS["args"], "--kv-cache-dtype", "fp8"]),
            ["args", "env"],
        ),  # part of the change by hand, without the tested backend
    ],
)  # fmt: skip
def test_changed_around_names_what_is_neither_tested_nor_before(
    live: dict[str, Any], changed: list[str]
) -> None:
    assert promotion.changed_around(live, PREVIOUS, CANDIDATE) == changed


def test_a_config_changed_around_the_test_makes_the_verdict_stale() -> None:
    key = VerdictKey(config="sha256:1")
    live = LiveKey(image=None, image_digests=frozenset(), config_changed=("env",))
    stale, _, message = verdictkey.judge(key, live)
    assert stale and "env of the Deployment changed from the tested config" in message
    assert not verdictkey.judge(key, LiveKey(image=None, image_digests=frozenset()))[0]
    # a key recorded without a config fingerprint (an older status) is no evidence
    assert not verdictkey.judge(VerdictKey(), live)[0]


def test_a_backend_env_edit_after_promotion_is_stale_not_drifted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    assert _drift_check(world)["Stale"]["status"] == "False"
    env = [*(world.kube.container().get("env") or []),
           {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]  # fmt: skip
    world.kube.edit_container("vllm", env=env)
    conditions = _drift_check(world)
    assert conditions["Stale"]["status"] == "True", conditions["Stale"]
    assert "env of the Deployment changed from the tested config" in conditions["Stale"]["message"]
    # kvgate's own edits are all still there: not Drifted (that is for a change taken out)
    assert conditions["Drifted"]["status"] == "False"
    assert world.reasons().count("Stale") == 1


def test_a_gate_closes_again_when_git_edits_the_backend_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a passing gate, and Git applying the tested change
    world = passing_gate(monkeypatch)
    before = _drift_check(world).get("Stale") or {}  # before the sync: nothing new runs
    assert before.get("status") in (None, "False")
    tested = world.candidate()
    world.kube.edit_container("vllm", args=tested["args"], env=tested.get("env"))
    assert _drift_check(world)["Stale"]["status"] == "False"
    assert _argocd_health(world.obj) == "Healthy"
    # WHEN Git then changes the backend env beside it
    env = [*(tested.get("env") or []), {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]
    world.kube.edit_container("vllm", args=tested["args"], env=env)
    # THEN the verdict is stale and the next sync waits for a new one
    assert _drift_check(world)["Stale"]["status"] == "True"
    assert _argocd_health(world.obj) == "Progressing"
