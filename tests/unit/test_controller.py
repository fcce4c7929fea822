"""The controller (kopf handlers) against an in-memory cluster, with the operator killed at every
mutation it makes, before and after the mutation lands.

A run drives `reconcile` as kopf would: the status patch a call returns is applied (as a JSON
merge patch) only when the call ends normally; a `Crash` loses it, as a SIGKILL would. The
invariant after every run: terminal Promoted <=> the Deployment runs the candidate; any other
terminal phase <=> the Deployment's container equals the original.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
import logging
import re
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fake_cluster
import kopf
import pytest
import yaml
from fake_cluster import Crash, FakeKube, deployment

from kvgate import report
from kvgate.change import container as promotion
from kvgate.change import manifests
from kvgate.config import OperatorConfig
from kvgate.controller import act, context, handlers
from kvgate.engines import versions as engine_versions
from kvgate.errors import KubeError
from kvgate.judge import crash
from kvgate.spec.rollout import RolloutSpec

TERMINAL = {"Promoted", "RolledBack", "NotNeeded", "Failed"}
LOG = logging.getLogger("test-controller")


def rollout(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "targetRef": {"name": "vllm", "container": "engine"},
        "kvCacheDtype": "fp8",
        "extraArgs": ["--attention-backend", "TRITON_ATTN"],
        "gates": {"capacity": {"mode": "off"}},
        "canary": {"startupTimeout": "60s", "evalTimeout": "120s", "evalRetries": 1},
        "promotion": {"mode": "auto", "verifyWindow": "4s", "verifySamples": 3},
    }
    body.update(spec)
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "KVCacheRollout",
        "metadata": {"name": "r", "namespace": "ns", "uid": "rollout-uid", "generation": 1,
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": body,
    }  # fmt: skip


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, as kopf's status patch is applied by the apiserver."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):  # into an object, or into {} (a null in it is no key)
            if not isinstance(target.get(key), dict):
                target[key] = {}
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class World:
    """One rollout, one fake cluster, a clock, and the operator's restarts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **spec: Any) -> None:
        self.kube = FakeKube()
        self.kube.add(deployment())
        self.original = copy.deepcopy(self.kube.container())
        self.obj = rollout(**spec)
        self.now = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)
        self.events: list[tuple[str, str, str]] = []
        self.crashes = 0
        self.phases: list[str] = []
        self.before_reconcile: Callable[[World], None] | None = None
        self.patches: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (status before, patch)
        self.memo = kopf.Memo(
            kube=self.kube, config=OperatorConfig(poll_interval_s=1, hub_offline=True)
        )
        monkeypatch.setattr(context, "utcnow", lambda: self.now)
        monkeypatch.setattr(
            kopf, "event", lambda obj, *, type, reason, message: self.events.append((type, reason, message))
        )  # fmt: skip
        from kvgate.adapters import http

        monkeypatch.setattr(http, "scrape", self.kube.scrape)

    @property
    def phase(self) -> str | None:
        return (self.obj.get("status") or {}).get("phase")

    def reconcile(self) -> float:
        """One handler call; returns the delay kopf would wait before the next."""
        if self.before_reconcile is not None:
            self.before_reconcile(self)
        body = kopf.Body(copy.deepcopy(self.obj))
        patch = kopf.Patch()
        delay = 1.0
        try:
            handlers.reconcile(body=body, meta=body.metadata, patch=patch, memo=self.memo,
                               logger=LOG)  # fmt: skip
        except kopf.TemporaryError as exc:
            delay = float(exc.delay or 1.0)
        except kopf.PermanentError:
            pass
        except Crash:
            self.crashes += 1
            self.kube.crash_at = None  # the replacement operator runs clean
            return 1.0
        before = copy.deepcopy(self.obj.get("status") or {})
        self.patches.append((before, copy.deepcopy(dict(patch.get("status") or {}))))
        merge(self.obj.setdefault("status", {}), dict(patch.get("status") or {}))
        if self.phase and (not self.phases or self.phases[-1] != self.phase):
            self.phases.append(self.phase)
        return max(delay, 1.0)

    def run(self, steps: int = 200) -> str:
        for _ in range(steps):
            delay = self.reconcile()
            if self.phase in TERMINAL:
                self.reconcile()  # a terminal rollout stays put
                assert self.phase in TERMINAL
                return str(self.phase)
            self.now += dt.timedelta(seconds=min(delay, 30))
        raise AssertionError(f"no end after {steps} reconciles: {self.obj.get('status')}")

    def config_now(self) -> dict[str, Any]:
        return {k: v for k, v in self.kube.container().items() if k in promotion.GUARDED}

    def candidate(self) -> dict[str, Any]:
        """The evaluated container with the rollout's change, derived here from the spec."""
        spec = RolloutSpec.from_dict(self.obj["spec"])
        record = (self.obj.get("status") or {}).get("remediation")
        remedy = None
        if record:  # a remedied candidate: the remedy of the version the crashed log named
            remedy = engine_versions.remedy_for(
                record["engine"], record["engineVersion"], record["code"]
            )
        wanted = manifests.candidate_container(spec, self.original, remedy=remedy)
        return {k: v for k, v in wanted.items() if k in promotion.GUARDED}

    def assert_invariant(self) -> None:
        live = self.config_now()
        original = {k: v for k, v in self.original.items() if k in promotion.GUARDED}
        if self.phase == "Promoted":
            assert live == self.candidate(), "Promoted but the Deployment is not on the candidate"
        else:
            assert live == original, f"{self.phase} but the Deployment was left changed: {live}"

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


def clean_run(monkeypatch: pytest.MonkeyPatch, setup: Callable[[World], None]) -> tuple[str, int]:
    world = World(monkeypatch)
    setup(world)
    end = world.run()
    world.assert_invariant()
    return end, world.kube.mutations


def happy(world: World) -> None:
    pass


def new_pods_crash(world: World) -> None:
    world.kube.crash_new_pods = True


def test_happy_path_promotes_with_one_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    world.assert_invariant()
    assert world.phases == [
        "Preflight",
        "Canary",
        "Evaluating",
        "Promoting",
        "Verifying",
        "Promoted",
    ]
    status = world.obj["status"]
    assert status["promotion"]["patched"] is True
    assert status["promotion"]["verify"]["samples"] >= 3
    assert world.reasons().count("Promoting") == 1  # the patch event: exactly one patch
    assert (
        world.kube.get("Pod", "r-control") is None and world.kube.get("Pod", "r-candidate") is None
    )


def test_the_status_is_parsed_once_per_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the happy path, with every parse of a status the controller makes counted (the
    # report's renderers, which parse what they are given, are not the controller's)
    from kvgate.records.status import RolloutStatus

    world = World(monkeypatch)
    parses: list[str] = []
    parse = RolloutStatus.from_dict.__func__  # type: ignore[attr-defined]

    def counted(cls: type[RolloutStatus], raw: object) -> RolloutStatus:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("kvgate.controller"):
            parses.append(caller)
        return parse(cls, raw)  # type: ignore[no-any-return]

    monkeypatch.setattr(RolloutStatus, "from_dict", classmethod(counted))
    per_reconcile: list[int] = []
    world.before_reconcile = lambda _: per_reconcile.append(len(parses))
    # WHEN it runs to its end
    assert world.run() == "Promoted"
    per_reconcile.append(len(parses))
    # THEN each reconcile parses the status it found once (`context.begin`), and no stage
    # parses it again: they see it typed, with the updates before them applied
    counts = [b - a for a, b in itertools.pairwise(per_reconcile)]
    assert counts and set(counts) == {1}, (counts, parses)


@pytest.mark.parametrize("setup", [happy, new_pods_crash])
def test_a_reconcile_reads_the_rollouts_pods_with_one_request(
    monkeypatch: pytest.MonkeyPatch, setup: Callable[[World], None]
) -> None:
    # GIVEN a rollout whose reconciles are counted one by one: single-pod GETs and pod LISTs
    world = World(monkeypatch)
    setup(world)
    gets: list[str] = []
    lists: list[str] = []
    read, list_pods = world.kube._read, world.kube.list_pods

    def counted_read(kind: str, name: str) -> dict[str, Any] | None:
        if kind == "Pod":
            gets.append(name)
        return read(kind, name)

    def counted_list(namespace: str, selector: str) -> list[dict[str, Any]]:
        lists.append(selector)
        return list_pods(namespace, selector)

    monkeypatch.setattr(world.kube, "_read", counted_read)
    monkeypatch.setattr(world.kube, "list_pods", counted_list)
    per_reconcile: list[tuple[int, int]] = []

    def mark(_: World) -> None:
        per_reconcile.append((len(gets), len(lists)))

    world.before_reconcile = mark
    # WHEN it runs to its end
    world.run()
    mark(world)
    # THEN no single pod is read (a canary's name is checked by creating it: one request), and
    # each reconcile lists this rollout's own pods at most once, whichever arms it looks at
    assert gets == [], gets
    own = [s for s in lists if s == "kvgate.io/rollout=r"]
    assert own, "the arms were never read"
    spans = list(itertools.pairwise(per_reconcile))
    for i, ((_, l0), (_, l1)) in enumerate(spans):
        assert l1 - l0 <= 2, f"reconcile {i}: {l1 - l0} pod LISTs"  # own pods + production's
    own_per_reconcile = max(
        sum(1 for s in lists[l0:l1] if s == "kvgate.io/rollout=r") for (_, l0), (_, l1) in spans
    )
    assert own_per_reconcile == 1
    # the eval Job's log is found in that same LIST (its pods carry the rollout's label)
    assert not [s for s in lists if s.startswith("job-name=")], lists


def _changed_keys(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.mark.parametrize("setup", [happy, new_pods_crash])
def test_each_reconcile_patches_only_the_status_keys_it_changes(
    monkeypatch: pytest.MonkeyPatch, setup: Callable[[World], None]
) -> None:
    world = World(monkeypatch)
    setup(world)
    world.run()
    statuses = [before for before, _ in world.patches] + [world.obj["status"]]
    patched = changed = 0
    for i, (before, patch) in enumerate(world.patches):
        keys = _changed_keys(before, statuses[i + 1])
        assert set(patch) == keys, f"reconcile {i}: patched {sorted(set(patch) - keys)} unchanged"
        patched, changed = patched + len(patch), changed + len(keys)
    assert patched == changed > 0  # before the typed status: 249 keys patched for 75 changed
    # Once the ended rollout's deletions are done, a reconcile changes nothing and sends no patch.
    ended = copy.deepcopy(world.obj["status"])
    world.reconcile()
    assert world.patches[-1][1] == {} and world.obj["status"] == ended


def test_fold_builds_the_next_status_and_leaves_what_it_was_given() -> None:
    from kvgate.controller import record
    from kvgate.flow.steps import Step
    from kvgate.records.status import GateResult, RevertStatus, RolloutStatus
    from kvgate.vocabulary import Outcome, Phase

    found = {"phase": "Verifying", "eval": {"job": "j"}, "finishedAt": None,
             "promotion": {"patched": True, "verify": {"samples": 2, "windowStartedAt": "t0"}}}  # fmt: skip
    given = copy.deepcopy(found)
    from kvgate.reasons import Reason

    intent = RevertStatus(Phase.ROLLED_BACK, Reason.PROMOTION_REVERTED, "slower")
    step = Step(Phase.REVERTING, Reason.REVERTING, "slower", eval_attempts=2, revert=intent,
                gates=(GateResult("speed", Outcome.FAILED, Reason.SPEED_REGRESSED, "slower"),))  # fmt: skip
    args = {"now": "2026-12-01T10:00:09Z", "generation": 3, "deployment_generation": 5}
    new = record.folded(RolloutStatus.from_dict(found), step, Phase.VERIFYING, **args).to_dict()
    assert found == given  # read, never written
    assert (
        record.folded(RolloutStatus.from_dict(found), step, Phase.VERIFYING, **args).to_dict()
        == new
    )
    assert new["phase"] == "Reverting" and new["phaseSince"] == args["now"]
    assert new["observedGeneration"] == 3 and new["eval"] == {"job": "j", "attempt": 2}
    assert new["gates"] == {
        "speed": {"outcome": "Failed", "reason": "SpeedRegressed", "message": "slower"}
    }
    # the write-ahead record of the revert, written with the step that enters Reverting
    assert new["revert"] == {
        "phase": "RolledBack", "reason": "PromotionReverted", "message": "slower",
        "startedAt": args["now"], "attempts": 0,
    }  # fmt: skip
    assert new["promotion"] == found["promotion"] and not new.get("finishedAt")
    again = record.folded(RolloutStatus.from_dict(new), step, Phase.REVERTING, **args).to_dict()
    assert again["revert"] == new["revert"] and again["phaseSince"] == new["phaseSince"]


def test_reconcile_leaves_kopfs_body_as_it_got_it(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    bodies: list[tuple[kopf.Body, dict[str, Any]]] = []
    reconcile = handlers.reconcile

    def keeping(*, body: kopf.Body, **kwargs: Any) -> None:
        bodies.append((body, copy.deepcopy(dict(body))))
        reconcile(body=body, **kwargs)

    monkeypatch.setattr(handlers, "reconcile", keeping)
    assert world.run() == "Promoted"
    assert len(bodies) > 5
    for body, as_given in bodies:
        assert dict(body) == as_given


def test_crashing_new_pods_are_reverted_and_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    new_pods_crash(world)
    assert world.run() == "RolledBack"
    world.assert_invariant()
    assert "Reverting" in world.phases and world.obj["status"]["reason"] == "PromotionReverted"
    assert world.obj["status"]["revert"]["attempts"] == 1


@pytest.mark.parametrize("setup", [happy, new_pods_crash], ids=["promote", "revert"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_at_every_mutation_keeps_the_invariant(
    monkeypatch: pytest.MonkeyPatch, setup: Callable[[World], None], after: bool
) -> None:
    expected, mutations = clean_run(monkeypatch, setup)
    assert mutations >= 6
    for k in range(1, mutations + 1):
        world = World(monkeypatch)
        setup(world)
        world.kube.crash_at, world.kube.crash_after = k, after
        end = world.run()
        assert world.crashes == 1, f"mutation {k} was never reached"
        world.assert_invariant()
        assert end == expected, f"crash {'after' if after else 'before'} mutation {k}: {end}"
        assert world.reasons().count("Promoting") <= 1, "the candidate was patched twice"
        for _ in range(5):  # the restarted operator finishes the deletions the end recorded
            if not world.obj["status"].get("pendingActions"):
                break
            world.reconcile()
        left = [key for key, obj in world.kube.objects.items()
                if key[0] in ("Pod", "Job", "NetworkPolicy")
                and obj["metadata"].get("ownerReferences")]  # fmt: skip
        assert left == [], f"crash at mutation {k} left children behind: {left}"


@pytest.mark.parametrize("gates", [None, "throughput"])
def test_an_operator_killed_between_a_policy_and_its_job_leaves_neither_when_the_rollout_ends(
    monkeypatch: pytest.MonkeyPatch, gates: str | None
) -> None:
    # GIVEN an operator killed right after it made a Job's NetworkPolicy (the eval's, or with
    # the throughput gate the load's), before that Job, and a rollout aborted before the
    # operator is back
    world = World(monkeypatch, **({"gates": THROUGHPUT_GATES} if gates else {}))
    role = "load" if gates else "eval"

    def die_after_the_policy(kube: FakeKube) -> None:
        policies = [p["metadata"]["name"] for p in kube.of_kind("NetworkPolicy")]
        jobs = [j["metadata"]["name"] for j in kube.of_kind("Job")]
        if f"r-{role}" in policies and not [j for j in jobs if j.startswith(f"r-{role}")]:
            kube.on_mutation = None
            raise Crash(f"after the {role} NetworkPolicy")

    world.kube.on_mutation = die_after_the_policy
    for _ in range(120):
        world.reconcile()
        world.now += dt.timedelta(seconds=1)
        if world.crashes:
            break
    assert world.crashes == 1, "never killed there"
    # the attempt was recorded before its policy was made (write-ahead)
    assert (world.obj["status"].get(role) or {}).get("attempt") == 1
    world.obj["metadata"]["annotations"] = {"kvgate.io/abort": "stop: the window closed"}
    # WHEN the restarted operator ends it and runs the deletions the end recorded
    end = world.run()
    for _ in range(5):
        if not world.obj["status"].get("pendingActions"):
            break
        world.reconcile()
    # THEN nothing of the rollout is left, and the Deployment is as it was
    assert end in TERMINAL and end != "Promoted"
    world.assert_invariant()
    left = [key for key, obj in world.kube.objects.items()
            if key[0] in ("Pod", "Job", "NetworkPolicy")
            and obj["metadata"].get("ownerReferences")]  # fmt: skip
    assert left == [], f"left behind: {left}"


@pytest.mark.parametrize("setup", [happy, new_pods_crash], ids=["promote", "revert"])
def test_a_crash_between_every_reconcile_keeps_the_invariant(
    monkeypatch: pytest.MonkeyPatch, setup: Callable[[World], None]
) -> None:
    # Every third reconcile dies at its first mutation (before it or after it).
    world = World(monkeypatch)
    setup(world)
    calls = {"n": 0}

    def flaky(w: World) -> None:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            w.kube.crash_at, w.kube.crash_after = w.kube.mutations + 1, calls["n"] % 2 == 0

    world.before_reconcile = flaky
    world.run(steps=400)
    world.assert_invariant()
    assert world.crashes >= 3


def test_an_external_revert_while_verifying_supersedes_and_is_not_repatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(
        monkeypatch, promotion={"mode": "auto", "verifyWindow": "30s", "verifySamples": 5}
    )

    def revert_when_verifying(w: World) -> None:
        if w.phase == "Verifying" and "--kv-cache-dtype" in w.kube.container()["args"]:
            w.kube.edit_container("vllm", args=w.original["args"])

    world.before_reconcile = revert_when_verifying
    assert world.run() == "Failed"
    assert world.obj["status"]["reason"] == "Superseded"
    assert world.reasons().count("Promoting") == 1
    world.assert_invariant()


def test_an_external_revert_while_promoting_supersedes(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)

    def revert_after_patch(w: World) -> None:
        if w.phase == "Promoting" and (w.obj["status"].get("promotion") or {}).get("patched"):
            w.kube.edit_container("vllm", args=w.original["args"])

    world.before_reconcile = revert_after_patch
    assert world.run() == "Failed" and world.obj["status"]["reason"] == "Superseded"
    world.assert_invariant()


@pytest.mark.parametrize("record_lost", [False, True])
def test_a_patch_made_after_a_long_absence_gets_its_own_rollout_time(
    monkeypatch: pytest.MonkeyPatch, record_lost: bool
) -> None:
    # GIVEN the operator away for ten minutes (past startupTimeout) once Promoting is recorded,
    # and the patched Deployment still rolling out on the reconcile after the patch; with
    # record_lost, the patch went through but its record did not (adopted on the return)
    world = World(monkeypatch)
    seen: dict[str, Any] = {"away": False, "rolling": 0, "rolled": None}

    def late_patch(w: World) -> None:
        promo = (w.obj.get("status") or {}).get("promotion") or {}
        dep = w.kube.get("Deployment", "vllm")
        if w.phase == "Promoting" and not promo.get("patched") and not seen["away"]:
            seen["away"] = True
            w.now += dt.timedelta(minutes=10)
            if record_lost:
                w.kube.edit_container("vllm", args=w.candidate()["args"])
        elif w.phase == "Promoting" and seen["rolling"] < 2:
            seen["rolling"] += 1  # the new pods not yet Ready for two reconciles
            seen["rolled"] = seen["rolled"] or dep["status"]
            dep["status"] = {**dep["status"], "readyReplicas": 0, "updatedReplicas": 0}
        elif seen["rolled"] is not None:
            dep["status"], seen["rolled"] = seen["rolled"], None

    world.before_reconcile = late_patch
    # THEN the rollout's startup time runs from the patch, not from Promoting's start
    assert world.run() == "Promoted", world.obj["status"]["message"]
    assert seen["rolling"] == 2
    world.assert_invariant()


def test_an_eval_job_made_after_a_long_absence_gets_its_own_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN Evaluating recorded (write-ahead) and the operator away for two hours before it made
    # the eval Job (past every attempt's bound), then the Job running for three reconciles
    world = World(monkeypatch)
    world.kube.hold_evals = True
    seen = {"away": False, "running": 0}

    def away_before_the_job(w: World) -> None:
        made = ((w.obj.get("status") or {}).get("eval") or {}).get("job")
        if w.phase == "Evaluating" and not made and not seen["away"]:
            seen["away"] = True
            w.now += dt.timedelta(hours=2)
        elif w.phase == "Evaluating" and made:
            seen["running"] += 1
            if seen["running"] == 3:
                w.kube.finish_evals()

    world.before_reconcile = away_before_the_job
    # THEN the eval that never ran is not "did not finish": it runs, with its own time, and
    # its verdict decides
    assert world.run() == "Promoted", world.obj["status"]["message"]
    assert seen == {"away": True, "running": 3}
    world.assert_invariant()


def test_an_eval_job_made_and_gone_past_its_bound_is_not_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the eval Job made and running, then deleted by someone else while the operator was
    # away past the phase's bound
    world = World(monkeypatch)
    world.kube.hold_evals = True
    for _ in range(100):
        world.reconcile()
        world.now += dt.timedelta(seconds=1)
        if world.kube.get("Job", "r-eval-1") is not None and world.phase == "Evaluating":
            break
    world.kube.objects.pop(("Job", "r-eval-1"))
    world.now += dt.timedelta(hours=2)
    # WHEN it is back
    world.reconcile()
    # THEN the attempt that was made and is gone has timed out: not made again (a Job deleted
    # again and again would otherwise run forever)
    assert world.kube.get("Job", "r-eval-1") is None
    status = world.obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "EvalError"), status["message"]
    assert "did not finish within" in status["message"]


def test_a_target_changed_during_the_eval_is_not_promoted(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)

    def bump(w: World) -> None:
        if w.phase == "Evaluating" and w.kube.container()["image"].endswith("v0.11.0"):
            w.kube.edit_container("vllm", image="vllm/vllm-openai:v0.12.0",
                                  args=[*w.original["args"], "--max-num-seqs", "64"])  # fmt: skip

    world.before_reconcile = bump
    assert world.run() == "Failed"
    assert world.obj["status"]["reason"] == "TargetChanged"
    assert "image, args" in world.obj["status"]["message"]
    assert "--kv-cache-dtype" not in world.kube.container()["args"]
    assert world.reasons().count("Promoting") == 0


def test_a_refused_revert_is_sticky_revert_failed_until_it_reads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    new_pods_crash(world)
    refusals = {"left": 4}

    def refuse(ops: list[dict[str, Any]]) -> str | None:
        reverting = world.phase == "Reverting"
        if reverting and refusals["left"] > 0:
            refusals["left"] -= 1
            return "403 Forbidden"
        return None

    world.kube.refuse_patches = refuse
    seen_stalled = False
    for _ in range(100):
        world.now += dt.timedelta(seconds=min(world.reconcile(), 30))
        conditions = {c["type"]: c for c in world.obj["status"].get("conditions") or []}
        if world.obj["status"].get("reason") == "RevertFailed":
            seen_stalled = True
            assert conditions["Stalled"]["status"] == "True"
            assert world.phase == "Reverting", "a failed revert must never end by itself"
        if world.phase in TERMINAL:
            break
    assert seen_stalled and world.phase == "RolledBack"
    world.assert_invariant()
    assert world.reasons().count("RevertFailed") >= 3


def test_a_revert_keeps_what_others_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    new_pods_crash(world)

    def others_edit(w: World) -> None:
        # After kvgate's patch, someone bumps the image and adds an env var.
        if (
            w.phase == "Promoting"
            and w.kube.container()["image"] != "vllm/vllm-openai:v0.11.1"
            and (w.obj["status"].get("promotion") or {}).get("patched")
        ):
            env = [*w.kube.container()["env"], {"name": "EXTRA", "value": "1"}]
            w.kube.edit_container("vllm", image="vllm/vllm-openai:v0.11.1", env=env)

    world.before_reconcile = others_edit
    end = world.run()
    live = world.kube.container()
    assert end == "RolledBack" and world.obj["status"]["reason"] == "PromotionReverted"
    assert live["args"] == world.original["args"]
    assert live["image"] == "vllm/vllm-openai:v0.11.1"
    assert {"name": "EXTRA", "value": "1"} in live["env"]
    assert not any(e["name"] == "VLLM_USE_FLASHINFER_SAMPLER" for e in live["env"])


def test_a_foreign_pod_with_the_canary_name_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    world.kube.add({"kind": "Pod", "metadata": {"name": "r-control", "labels": {"app": "other"}},
                    "spec": {"containers": [{"name": "x"}]}})  # fmt: skip
    end = world.run(steps=400)
    assert end == "Failed"
    assert world.kube.get("Pod", "r-control") is not None
    assert "not this rollout's" in world.obj["status"]["message"]
    world.assert_invariant()


def test_a_bug_in_an_action_ends_the_rollout_instead_of_looping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)

    def broken(ctx: Any, step: Any) -> None:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")

    monkeypatch.setitem(act.ACTIONS, act.Action.CREATE_EVAL_JOB, broken)
    assert world.run(steps=400) == "Failed"
    status = world.obj["status"]
    assert status["reason"] == "ExternalErrors"
    assert "UnicodeDecodeError" in status["message"]
    assert "ReconcileError" in world.reasons()
    world.assert_invariant()


def test_the_verify_window_restarts_after_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(
        monkeypatch, promotion={"mode": "auto", "verifyWindow": "10s", "verifySamples": 3}
    )
    gap = {"done": False}

    def away(w: World) -> None:
        verify = ((w.obj.get("status") or {}).get("promotion") or {}).get("verify") or {}
        if w.phase == "Verifying" and verify.get("samples") == 2 and not gap["done"]:
            gap["done"] = True
            w.now += dt.timedelta(minutes=10)  # the operator was down for ten minutes

    world.before_reconcile = away
    assert world.run() == "Promoted"
    verify = world.obj["status"]["promotion"]["verify"]
    assert verify.get("restarts") == 1 and verify["samples"] >= 3


def test_unready_production_pods_in_the_verify_window_revert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)

    def unready(w: World) -> None:
        if w.phase == "Verifying":
            for pod in w.kube.of_kind("Pod"):
                if pod["metadata"]["labels"].get("app") == "vllm":
                    pod["status"]["containerStatuses"][0]["ready"] = False

    world.before_reconcile = unready
    assert world.run() == "RolledBack"
    assert "not Ready" in world.obj["status"]["message"]
    world.assert_invariant()


def test_deleting_an_unverified_rollout_reverts_first(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(
        monkeypatch, promotion={"mode": "auto", "verifyWindow": "60s", "verifySamples": 5}
    )
    while world.phase != "Verifying":
        world.now += dt.timedelta(seconds=world.reconcile())
    assert "--kv-cache-dtype" in world.kube.container()["args"]
    body = kopf.Body(copy.deepcopy(world.obj))
    for retry in range(5):
        try:
            handlers.cleanup(body=body, meta=body.metadata, memo=world.memo, logger=LOG,
                             retry=retry)  # fmt: skip
            break
        except kopf.TemporaryError:
            continue
    else:
        raise AssertionError("cleanup never let the rollout go")
    world.assert_invariant()


def test_a_summary_without_the_attempt_nonce_is_not_evidence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a candidate whose error body (logged by lm-eval) is a summary-shaped "pass", and an
    # eval whose own summary is a fail carrying the nonce
    world = World(monkeypatch)
    forged = {**fake_cluster.SUMMARY_PASS, "nonce": "guessed"}
    world.kube.eval_log_before = json.dumps(forged) + "\n"
    world.kube.eval_summary = {**fake_cluster.SUMMARY_PASS, "verdict": "fail"}
    assert world.run() == "RolledBack"
    assert world.obj["status"]["reason"] == "AccuracyRegressed"


def test_a_forged_last_line_without_the_nonce_never_promotes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)

    def forge(w: World) -> None:
        for pod in w.kube.of_kind("Pod"):
            if "job-name" in (pod["metadata"].get("labels") or {}):
                pod["_log"] = json.dumps(fake_cluster.SUMMARY_PASS) + "\n"

    world.before_reconcile = forge
    end = world.run(steps=400)
    assert end == "RolledBack" and world.obj["status"]["reason"] == "EvalError"
    world.assert_invariant()


def test_status_and_events_hold_no_literal_env_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN production env with a literal credential and an --api-key flag
    world = World(monkeypatch)
    world.kube.edit_container(
        "vllm",
        args=[*world.original["args"], "--api-key", "sk-live-0123456789abcdef"],
        env=[*world.original["env"], {"name": "HF_TOKEN", "value": "hf_secretsecretsecret"}],
    )
    world.original = copy.deepcopy(world.kube.container())
    assert world.run() == "Promoted"
    world.assert_invariant()  # the patch kept the real values in the Deployment
    text = json.dumps(world.obj["status"]) + json.dumps(world.events)
    for secret in ("sk-live-0123456789abcdef", "hf_secretsecretsecret", "/cache"):
        assert secret not in text
    assert "sha256:" in json.dumps(world.obj["status"]["previous"])


def test_an_edited_status_candidate_is_not_what_gets_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN someone who may write kvcacherollouts/status puts LD_PRELOAD into status.candidate
    world = World(monkeypatch)

    def tamper(w: World) -> None:
        status = w.obj.get("status") or {}
        if status.get("phase") == "Promoting" and "candidate" in status:
            env = [e for e in status["candidate"].get("env") or [] if e["name"] != "LD_PRELOAD"]
            status["candidate"]["env"] = [*env, {"name": "LD_PRELOAD", "value": "/tmp/x.so"}]

    world.before_reconcile = tamper
    end = world.run(steps=400)
    assert end != "Promoted"
    assert all(e["name"] != "LD_PRELOAD" for e in world.kube.container()["env"])
    world.assert_invariant()


@pytest.mark.parametrize(
    ("name", "dirs", "allowed"),
    [
        ("/proc/self/environ", ("/models",), False),
        ("/models/../proc/self/environ", ("/models",), False),
        ("/models/qwen", ("/models",), True),
        ("/modelsX/qwen", ("/models",), False),
        ("/models/qwen", (), False),
    ],
)
def test_local_models_only_under_the_operator_mounts(
    name: str, dirs: tuple[str, ...], allowed: bool
) -> None:
    from kvgate.controller import sources

    assert sources.under_model_dirs(name, dirs) is allowed


def test_a_model_path_outside_the_mounts_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch, model={"name": "/proc/self/environ"})
    world.run()
    finding = world.obj["status"]["preflight"]["checkpoint"]["finding"]
    assert "KVGATE_MODEL_DIRS" in finding and "environ" not in finding


def test_drift_after_promotion_is_reported_and_never_reapplied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"

    def check() -> dict[str, Any]:
        body = kopf.Body(copy.deepcopy(world.obj))
        patch = kopf.Patch()
        handlers.drift(body=body, meta=body.metadata, patch=patch, memo=world.memo, logger=LOG)
        merge(world.obj["status"], dict(patch.get("status") or {}))
        return {c["type"]: c for c in world.obj["status"].get("conditions") or []}

    assert check()["Drifted"]["status"] == "False"  # observed in sync
    assert "Drifted" not in world.reasons()
    world.kube.edit_container("vllm", args=world.original["args"])  # a GitOps self-heal
    mutations = world.kube.mutations
    assert check()["Drifted"]["status"] == "True"
    assert world.reasons().count("Drifted") == 1
    check()  # no second Event while it stays drifted
    assert world.reasons().count("Drifted") == 1
    assert world.kube.mutations == mutations  # never re-applied
    assert "--kv-cache-dtype" not in world.kube.container()["args"]


def _production_metrics(base: str, ttft_sum: float, ttft_count: float) -> str:
    """vLLM 0.11 metrics of a pressured pool with the TTFT histogram at (sum, count)."""
    return (
        base.replace(
            'vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 200.0',
            f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="Qwen/Qwen3-8B"}} {ttft_count}',
        )
        .replace(
            'vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 116.64015075342336',
            f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="Qwen/Qwen3-8B"}} {ttft_sum}',
        )
        .replace(
            'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 0.0',
            'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 6.0',
        )
        .replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.42',
            'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.97',
        )
    )  # fmt: skip


@pytest.mark.parametrize("slow", [False, True])
def test_production_answering_clearly_slower_than_before_promotion_reverts(
    monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    # GIVEN a pressured pool whose first tokens took 0.5 s during preflight, 10 requests a second
    world = World(
        monkeypatch,
        gates={"capacity": {"mode": "require", "window": "4s", "samples": 3}},
        promotion={"mode": "auto", "verifyWindow": "8s", "verifySamples": 4},
    )
    from kvgate.adapters import http

    counter = {"sum": 0.0, "count": 0.0, "at": world.now.timestamp()}

    def scrape(url: str, timeout: float) -> str:
        # WHEN after promotion first tokens take 0.5 s again, or 3 s (a regression)
        ttft = 3.0 if slow and world.phase == "Verifying" else 0.5
        now = world.now.timestamp()
        served = 10 * (now - counter["at"])
        counter.update(sum=counter["sum"] + served * ttft, count=counter["count"] + served, at=now)
        return _production_metrics(
            world.kube.scrape(url, timeout), counter["sum"], counter["count"]
        )

    monkeypatch.setattr(http, "scrape", scrape)
    end = world.run()
    # THEN the slow production is reverted with the latency named; the steady one promotes
    if slow:
        assert end == "RolledBack", world.obj["status"]
        assert "mean TTFT 3000 ms" in world.obj["status"]["message"]
        assert "preflight baseline" in world.obj["status"]["message"]
    else:
        assert end == "Promoted", world.obj["status"]
    world.assert_invariant()


@pytest.mark.parametrize(
    ("arm_log", "lie", "arm"),
    [
        (fake_cluster.CANDIDATE_LOG, "auto", "candidate"),
        (fake_cluster.CONTROL_LOG, "fp8", "control"),
    ],
    ids=["candidate-log-fp8-metrics-bf16", "control-log-bf16-metrics-fp8"],
)
def test_log_and_metrics_disagreeing_rolls_back_before_the_eval(
    monkeypatch: pytest.MonkeyPatch, arm_log: str, lie: str, arm: str
) -> None:
    world = World(monkeypatch)
    blocks = world.kube.cache_info[arm_log][1]
    world.kube.cache_info[arm_log] = (lie, blocks)
    assert world.run() == "RolledBack"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "LogMetricsDisagree"
    assert f"{arm}: startup log says kv_cache_dtype=" in status["message"]
    assert f"cache_dtype={lie}" in status["message"]
    assert status["gates"]["engineTruth"]["outcome"] == "Error"
    assert status["arms"][arm]["metrics"]["cacheConfig"]["cache_dtype"] == lie
    assert world.kube.of_kind("Job") == []  # no eval was started


def test_agreeing_metrics_are_kept_in_status(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    status = world.obj["status"]
    assert status["gates"]["engineTruth"]["reason"] == "LogMetricsAgree"
    assert status["arms"]["control"]["metrics"]["cacheConfig"]["cache_dtype"] == "auto"
    assert status["arms"]["candidate"]["metrics"]["cacheConfig"]["num_gpu_blocks"] == "3804"


def jit_trap(world: World) -> None:
    world.kube.jit_crash = True


def test_remediation_auto_restarts_the_candidate_with_the_remedy_and_promotes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(
        monkeypatch, extraArgs=[], canary={"startupTimeout": "60s", "remediation": "auto"}
    )
    jit_trap(world)
    assert world.run() == "Promoted"
    status = world.obj["status"]
    record = status["remediation"]
    # the crashed candidate's log says 0.13.0: the remedy of that version, not the image tag's
    assert (record["code"], record["engineVersion"], record["attempt"]) == (
        "attention-build-failed", "0.13.0", 1,
    )  # fmt: skip
    assert record["firstAttempt"]["attentionBackend"] == "FLASHINFER"
    assert "attention-build-failed" in record["firstAttempt"]["findings"]
    assert world.reasons().index("CanaryCrashed") < world.reasons().index("Remediating")
    assert world.reasons().index("Remediating") < world.reasons().index("Promoting")
    # the promoted Deployment carries the remedy as well as the dtype
    container = world.kube.container()
    args = container["args"]
    assert args[args.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert status["arms"]["candidate"]["scan"]["attentionBackend"] == "TRITON_ATTN"
    assert status["gates"]["engineTruth"]["reason"] == "LogMetricsAgree"


def test_remediation_off_rolls_back_naming_the_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch, extraArgs=[])
    jit_trap(world)
    assert world.run() == "RolledBack"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "CanaryCrashed"
    # The cause leads, then the remedy and where it goes; the engine's ninja line comes last, cut.
    message = status["message"]
    assert message.startswith(
        "candidate crashed: the attention backend could not JIT-compile its FP8 KV kernels "
        "(FlashInfer without nvcc/ninja in the image: the L4 trap) (attention-build-failed); "
        "remedy for vllm 0.13.0: --attention-backend TRITON_ATTN and "
        "VLLM_USE_FLASHINFER_SAMPLER=0; set spec.extraArgs: [--attention-backend, TRITON_ATTN] "
        'and spec.extraEnv: [{name: VLLM_USE_FLASHINFER_SAMPLER, value: "0"}]; or set '
        "spec.canary.remediation: auto and kvgate applies it and tests again; "
        "log: subprocess.CalledProcessError: Command '['ninja', '-v', '-C', "
    ), message
    assert message.endswith("…") and len(message.split("; log: ")[1]) == crash.RAW_CHARS
    # the CanaryCrashed Event says the same, a Warning
    assert ("Warning", "CanaryCrashed", message) in world.events
    assert "remediation" not in status and "Remediating" not in world.reasons()


def test_an_unclassified_crash_says_how_the_pod_ended_then_the_engine_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    world.kube.canary_crash_log = (
        "INFO starting\nTraceback (most recent call last):\nValueError: boom\n"
    )
    assert world.run() == "RolledBack"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "CanaryCrashed"
    expected = (
        "candidate crashed: restarted 1x (last exit 1), cause not classified; log: ValueError: boom"
    )
    assert status["message"] == expected
    assert ("Warning", "CanaryCrashed", expected) in world.events


TOKEN_IN_URL = "OSError: 401 for https://huggingface.co/api/models/m?token={token}"


@pytest.mark.parametrize(
    "line",
    [
        TOKEN_IN_URL,
        # just before status cuts a line at 300, keeping 11 or 7 of its characters: scrubbed
        # first, it is matched whole
        "OSError: " + "x" * 274 + "token {token} refused",
        "OSError: " + "x" * 278 + "token {token} refused",
    ],
)
def test_a_crash_line_that_carries_a_token_reaches_no_status_field_or_event(
    monkeypatch: pytest.MonkeyPatch, line: str
) -> None:
    # GIVEN an engine whose last words quote its hub token (status quotes that line)
    import json

    token = "hf_" + "Ab1" * 10
    world = World(monkeypatch)
    world.kube.canary_crash_log = (
        "INFO starting\nTraceback (most recent call last):\n" + line.format(token=token) + "\n"
    )
    # WHEN the candidate crashes and the rollout rolls back
    assert world.run() == "RolledBack"
    status = world.obj["status"]
    # THEN no status field (message, gate, condition, verdict, log tail, finding) and no Event
    # holds the token, not even its start
    assert token not in json.dumps(status) and token not in json.dumps(world.patches)
    assert not [e for e in world.events if token in e[2]]
    said = json.dumps(status) + json.dumps(world.patches) + json.dumps(world.events)
    assert "OSError: " in said and token[:5] not in said
    if line == TOKEN_IN_URL:
        assert "token=<redacted" in status["message"], status["message"]


def test_a_remedied_candidate_that_crashes_again_rolls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(
        monkeypatch, extraArgs=[], canary={"startupTimeout": "60s", "remediation": "auto"}
    )
    jit_trap(world)

    def crash_remedied(w: World) -> None:
        pod = w.kube.get("Pod", "r-candidate")
        if pod is not None and "VLLM_USE_FLASHINFER_SAMPLER" in json.dumps(pod["spec"]):
            pod["status"]["containerStatuses"][0].update(ready=False, restartCount=1)

    world.before_reconcile = crash_remedied
    assert world.run() == "RolledBack"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["remediation"]["attempt"] == 1
    assert "already applied: the remedied candidate crashed too" in status["message"]
    assert world.reasons().count("Remediating") == 1


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_at_every_mutation_of_a_remediated_rollout_keeps_the_invariant(
    monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    spec = {"extraArgs": [], "canary": {"startupTimeout": "60s", "remediation": "auto"}}
    clean = World(monkeypatch, **spec)
    jit_trap(clean)
    assert clean.run() == "Promoted"
    for k in range(1, clean.kube.mutations + 1):
        world = World(monkeypatch, **spec)
        jit_trap(world)
        world.kube.crash_at, world.kube.crash_after = k, after
        assert world.run() == "Promoted", (k, world.obj["status"].get("message"))
        world.assert_invariant()
        assert world.obj["status"]["remediation"]["attempt"] == 1


def test_every_status_field_written_is_in_the_crd_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """The apiserver prunes status fields the CRD does not declare (kopf only logs it)."""
    import yaml

    crd = yaml.safe_load(
        (fake_cluster.DATA.parents[1] / "crds/kvgate.io_kvcacherollouts.yaml").read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    declared = set(schema["properties"])
    world = World(
        monkeypatch, extraArgs=[], canary={"startupTimeout": "60s", "remediation": "auto"}
    )
    jit_trap(world)
    seen: set[str] = set()

    def collect(w: World) -> None:
        seen.update((w.obj.get("status") or {}).keys())

    world.before_reconcile = collect
    assert world.run() == "Promoted"
    collect(world)
    assert "remediation" in seen and "arms" in seen
    assert seen - declared == set()


def forcing_fp8_checkpoint(tmp_path: Any) -> Path:
    """A Qwen3-8B-shaped checkpoint whose kv_cache_scheme makes vLLM's `auto` store FP8."""
    import numpy as np
    from safetensors.numpy import save_file

    config = json.loads((fake_cluster.DATA / "configs" / "qwen3-8b.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {"model.embed_tokens.weight": np.ones((2, 2), np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    return Path(tmp_path)


@pytest.mark.parametrize("pinned", [False, True])
def test_a_checkpoint_that_forces_fp8_kv_on_an_auto_control_fails_in_preflight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, pinned: bool
) -> None:
    forcing_fp8_checkpoint(tmp_path)
    world = World(monkeypatch, model={"name": str(tmp_path)})
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(tmp_path),)
    )
    if pinned:  # production says bfloat16 explicitly: that wins over the checkpoint's scheme
        dep = world.kube.objects[("Deployment", "vllm")]
        dep["spec"]["template"]["spec"]["containers"][0]["args"] += ["--kv-cache-dtype", "bfloat16"]
        world.original = copy.deepcopy(world.kube.container())
    end = world.run()
    world.assert_invariant()
    status = world.obj["status"]
    # pinned: past preflight to the canaries (the fake engine then logs FP8 for any pod given
    # --kv-cache-dtype, so that run's end is not the point here)
    assert ("Canary" in world.phases) is pinned
    if pinned:
        assert status["reason"] != "ControlRunsFP8"
    else:
        assert (end, status["reason"]) == ("Failed", "ControlRunsFP8")
    assert status["preflight"]["checkpoint"]["forcesFp8Kv"] == [
        "quantization_config.kv_cache_scheme is set: vLLM 0.26+ switches an auto KV cache to fp8"
    ]
    # what the control stores: production's own dtype on this checkpoint, not `auto`'s
    effective = status["preflight"]["checkpoint"]["effectiveControlFormat"]
    assert effective == ("bfloat16" if pinned else "fp8")
    if not pinned:
        assert status["reason"] == "ControlRunsFP8"
        assert "the canary would compare FP8 with FP8" in status["message"]
        assert world.kube.get("Pod", "r-control") is None and "arms" not in status


@pytest.mark.parametrize("stated", ["fp8", "fp8_e4m3", "bfloat16"])
def test_a_stated_control_format_is_held_to_what_production_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, stated: str
) -> None:
    # GIVEN production on `auto` with a checkpoint that makes it store FP8, and a spec that
    # states the control's format: FP8 (by either vLLM name), or 16-bit (wrong)
    model = forcing_fp8_checkpoint(tmp_path)
    kv_cache = {"format": "bfloat16", "control": {"format": stated}}  # FP8 back to BF16
    world = World(monkeypatch, model={"name": str(model)}, kvCache=kv_cache)
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(model),)
    )
    world.run()
    world.assert_invariant()
    status = world.obj["status"]
    assert status["preflight"]["checkpoint"]["effectiveControlFormat"] == "fp8"
    if stated == "bfloat16":  # THEN a wrong statement fails closed at preflight, naming the field
        assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
        assert status["message"] == (
            "spec.kvCache.control.format: 'bfloat16' is stated, but vllm runs fp8 "
            "(--kv-cache-dtype auto on this checkpoint); state the format production runs, or auto"
        )
        assert world.kube.get("Pod", "r-control") is None and "arms" not in status
        assert world.kube.container() == world.original
    else:  # THEN a right one is the baseline: FP8 to another format goes on to the canaries
        assert "Canary" in world.phases and status["reason"] != "ControlRunsFP8"
        # the expected gain is counted from what the control stores (FP8), not from 16-bit (1.0)
        gain = status["preflight"]["checkpoint"]["expectedCapacityGain"]
        assert gain == pytest.approx(0.5)  # BF16 holds half the tokens FP8 does


@pytest.mark.parametrize("pinned", [False, True])
def test_a_stated_control_format_on_an_unread_checkpoint_is_not_taken_on_trust(
    monkeypatch: pytest.MonkeyPatch, pinned: bool
) -> None:
    # GIVEN a checkpoint the operator cannot read (the hub is not consulted) and a spec that
    # states the control runs FP8
    world = World(monkeypatch, kvCache={"format": "bfloat16", "control": {"format": "fp8"}})
    if pinned:  # production pins fp8: that is what runs, whatever the checkpoint says
        dep = world.kube.objects[("Deployment", "vllm")]
        dep["spec"]["template"]["spec"]["containers"][0]["args"] += ["--kv-cache-dtype", "fp8"]
        world.original = copy.deepcopy(world.kube.container())
    world.run()
    world.assert_invariant()
    status = world.obj["status"]
    checkpoint = status["preflight"]["checkpoint"]
    assert "present" not in checkpoint and "hub not consulted" in checkpoint["finding"]  # unread
    if pinned:  # THEN the stated format is checked against the pinned dtype, and holds
        assert "Canary" in world.phases and status["reason"] != "InvalidSpec"
    else:  # THEN what `auto` stores is unknown: no match is assumed, nothing is started
        assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
        assert "is unknown (the checkpoint was not read)" in status["message"]
        assert world.kube.get("Pod", "r-control") is None and "arms" not in status
        assert world.kube.container() == world.original


def test_a_hostile_production_dtype_stays_bounded_in_status(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # GIVEN production pinned to a 100,000-character --kv-cache-dtype, and a stated control
    model = forcing_fp8_checkpoint(tmp_path)
    world = World(
        monkeypatch,
        model={"name": str(model)},
        kvCache={"format": "bfloat16", "control": {"format": "fp8"}},
    )
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(model),)
    )
    dep = world.kube.objects[("Deployment", "vllm")]
    dep["spec"]["template"]["spec"]["containers"][0]["args"] += ["--kv-cache-dtype", "x" * 100_000]
    world.original = copy.deepcopy(world.kube.container())
    world.run()
    world.assert_invariant()
    status = world.obj["status"]
    # THEN the rollout fails closed before any canary, and what it writes of the dtype is cut
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith(
        "spec.kvCache.control.format: 'fp8' is stated, but vllm runs"
    )
    assert len(status["message"]) < 300
    assert len(status["preflight"]["checkpoint"]["effectiveControlFormat"]) <= 64
    assert world.kube.get("Pod", "r-control") is None and world.kube.container() == world.original


def test_a_checkpoint_whose_scales_cannot_scale_is_rolled_back_before_any_eval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    # GIVEN a checkpoint with per-layer k/v scales, layer 1's k_scale 0.0 (a calibration bug)
    config = json.loads((fake_cluster.DATA / "configs" / "qwen3-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    scales = {
        f"model.layers.{layer}.self_attn.{kind}": np.array(
            0.0 if (layer, kind) == (1, "k_scale") else 0.02, np.float32
        )
        for layer in range(config["num_hidden_layers"])
        for kind in ("k_scale", "v_scale")
    }
    save_file(
        {"model.embed_tokens.weight": np.ones((2, 2), np.float32), **scales},
        str(tmp_path / "model.safetensors"),
    )
    world = World(monkeypatch, model={"name": str(tmp_path)})
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(tmp_path),)
    )
    # WHEN the FP8 rollout (a format that reads the checkpoint's scales) runs
    end = world.run()
    world.assert_invariant()
    status = world.obj["status"]
    # THEN the scale values were read, and the candidate is rolled back at the canary stage,
    # before any eval Job, naming the layer and the remedy; production untouched
    assert status["preflight"]["checkpoint"]["brokenScales"] == ["layer 1: k_scale 0.0"]
    assert (end, status["reason"]) == ("RolledBack", "ScalesBroken"), status["message"]
    gate = status["gates"]["scales"]
    assert (gate["outcome"], gate["reason"]) == ("Failed", "ScalesBroken")
    assert gate["message"].startswith(
        "the checkpoint's k/v scales cannot scale (layer 1: k_scale 0.0) and fp8 reads them"
    )
    assert "recalibrate the KV scales" in gate["message"]
    assert "Evaluating" not in world.phases
    assert not [key for key in world.kube.objects if key[0] == "Job"]
    assert world.kube.container() == world.original


# -- config.prometheusURL: preflight reads the pool's history from Prometheus -----------------

PROM = "http://prom.test:9090"


def _prometheus_world(
    monkeypatch: pytest.MonkeyPatch,
    answer: Callable[[World, str], str],
    gates: dict[str, Any] | None = None,
) -> tuple[World, list[str]]:
    """A World whose operator reads the pool from Prometheus; `answer(world, url)` is its reply.

    Returns the world and the pod /metrics URLs kvgate scraped directly during Preflight.
    """
    world = World(
        monkeypatch,
        gates=gates or {"capacity": {"mode": "require", "window": "40s", "samples": 5}},
    )
    world.memo = kopf.Memo(
        kube=world.kube,
        config=OperatorConfig(poll_interval_s=1, hub_offline=True, prometheus_url=PROM),
    )
    from kvgate.adapters import http

    direct: list[str] = []

    def scrape(url: str, timeout: float, **_: Any) -> str:
        if url.startswith(PROM):
            return answer(world, url)
        if world.phase in (None, "Pending", "Preflight"):
            direct.append(url)
        return world.kube.scrape(url, timeout)

    monkeypatch.setattr(http, "scrape", scrape)
    return world, direct


def _matrix(world: World, url: str, usage: float, waiting: float) -> str:
    """A query_range answer: every pod's pool series at each step the query asks for."""
    from urllib.parse import parse_qs, urlsplit

    query = parse_qs(urlsplit(url).query)
    start, end, step = (float(query[k][0]) for k in ("start", "end", "step"))
    times = [start + i * step for i in range(int((end - start) / step + 1e-9) + 1)]
    result = []
    for pod in world.kube.of_kind("Pod"):
        instance = f"{pod['status']['podIP']}:8000"
        for name, value in (
            ("vllm:kv_cache_usage_perc", usage),
            ("vllm:num_requests_waiting", waiting),
            ("vllm:num_requests_running", 4.0),
            ("vllm:num_preemptions_total", 0.0),
        ):
            labels = {"__name__": name, "instance": instance, "job": "vllm", "engine": "0"}
            result.append({"metric": labels, "values": [[t, str(value)] for t in times]})
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def test_prometheus_history_of_a_full_pool_passes_preflight_without_scraping_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, direct = _prometheus_world(monkeypatch, lambda w, url: _matrix(w, url, 0.97, 6.0))
    assert world.run() == "Promoted", world.obj["status"]
    pre = world.obj["status"]["preflight"]
    assert pre["source"] == "prometheus" and pre["pressure"]["pressured"] is True
    assert pre["pressure"]["samples"] == 5  # the window's 5 steps, read at once
    assert direct == []  # production pods were not scraped for the pool


def test_prometheus_history_of_a_pool_with_room_is_not_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, direct = _prometheus_world(monkeypatch, lambda w, url: _matrix(w, url, 0.3, 0.0))
    assert world.run() == "NotNeeded", world.obj["status"]
    world.assert_invariant()
    assert "KV usage peaked at 30%" in world.obj["status"]["message"]
    assert direct == []


def _prometheus_replying(reply: str) -> Callable[[World, str], str]:
    """A Prometheus that answers every query with `reply`, or refuses connections ("refused")."""
    from kvgate.errors import ScrapeError

    def answer(world: World, url: str) -> str:
        if reply == "refused":
            raise ScrapeError(url, "ConnectError: [Errno 111] Connection refused")
        return reply

    return answer


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ("refused", "prom.test:9090: ConnectError"),
        (
            '{"status":"error","errorType":"bad_data","error":"parse error at char 3"}',
            "the query failed: 'parse error at char 3'",
        ),
        ("<html>proxy error</html>", "the answer is not JSON"),
        (
            '{"status":"success","data":{"resultType":"matrix","result":[]}}',
            "no KV usage metric in any sample",
        ),
    ],
    ids=["unreachable", "error", "junk", "no-series"],
)
def test_prometheus_that_cannot_answer_leaves_the_pool_unknown(
    monkeypatch: pytest.MonkeyPatch, reply: str, said: str
) -> None:
    world, direct = _prometheus_world(monkeypatch, _prometheus_replying(reply))
    assert world.run() == "Failed", world.obj["status"]
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "PoolPressureUnknown", status
    # A merge patch stores no null (the apiserver drops it): unknown is a pressure without `pressured`.
    assert status["preflight"]["pressure"].get("pressured") is None
    assert said in status["message"], status["message"]
    assert direct == []  # no fallback to a live scrape: the configured source decides
    assert world.kube.of_kind("Job") == []


# -- the speed gate at the arms' GPU clocks (DCGM through Prometheus) --------------------------

SPEED_GATES = {
    "capacity": {"mode": "require", "window": "40s", "samples": 5},
    "speed": {"concurrency": [8], "maxTpotRegression": 0.5},
}


def _clock_matrix(world: World, url: str, mhz: dict[str, float]) -> str:
    """dcgm-exporter's SM and memory clock series of the arms' pods, over the asked window."""
    from urllib.parse import parse_qs, urlsplit

    query = parse_qs(urlsplit(url).query)
    start, end, step = (float(query[k][0]) for k in ("start", "end", "step"))
    times = [start + i * step for i in range(int((end - start) / step + 1e-9) + 1)]
    result = []
    for arm, sm in mhz.items():
        for name, value in (("DCGM_FI_DEV_SM_CLOCK", sm), ("DCGM_FI_DEV_MEM_CLOCK", 6251.0)):
            labels = {"__name__": name, "gpu": "0", "namespace": "ns", "pod": f"r-{arm}"}
            result.append({"metric": labels, "values": [[t, str(value)] for t in times]})
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def _speed_world(
    monkeypatch: pytest.MonkeyPatch, clocks: Callable[[World, str], str]
) -> tuple[World, list[str]]:
    """A KV-bound pool from Prometheus, the speed gate on, and `clocks` answering the DCGM
    queries; the arms' inter-token latency histograms (what kvgate reads as TPOT when no
    request-level TPOT is exported) grow with each scrape: 20 ms per token on both."""
    asked: list[str] = []

    def answer(world: World, url: str) -> str:
        if "DCGM_FI_DEV" in urllib.parse.unquote_plus(url):
            asked.append(url)
            return clocks(world, url)
        return _matrix(world, url, 0.97, 6.0)

    world, _ = _prometheus_world(monkeypatch, answer, gates=SPEED_GATES)
    static, scrapes = world.kube.scrape, itertools.count(1)

    def growing(url: str, timeout: float) -> str:
        n = next(scrapes)
        text = static(url, timeout)
        for suffix, per_scrape in (("count", 10.0), ("sum", 0.2)):
            text = re.sub(
                rf"^(vllm:inter_token_latency_seconds_{suffix}\{{[^}}]*\}}) (\S+)$",
                lambda m, add=per_scrape * n: f"{m.group(1)} {float(m.group(2)) + add}",
                text,
                flags=re.M,
            )
        return text

    world.kube.scrape = growing  # type: ignore[method-assign]
    return world, asked


def test_arms_at_different_gpu_clocks_are_rolled_back_without_a_speed_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, asked = _speed_world(
        monkeypatch, lambda w, url: _clock_matrix(w, url, {"control": 2040.0, "candidate": 1410.0})
    )
    assert world.run() == "RolledBack", world.obj["status"]
    world.assert_invariant()
    status = world.obj["status"]
    gate = status["gates"]["speed"]
    assert (gate["outcome"], gate["reason"]) == ("Inconclusive", "ClocksDiffer"), gate
    assert "SM clock 1,410 MHz on the candidate vs 2,040 MHz on the control" in gate["message"]
    assert status["speed"]["clocks"]["candidate"]["smMHz"] == 1410.0
    assert status["speed"]["control"]["tpotMs"] == pytest.approx(20.0)
    assert len(asked) == 1  # read once, at the end of the eval's window


def test_matched_clocks_promote_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    world, _ = _speed_world(
        monkeypatch, lambda w, url: _clock_matrix(w, url, {"control": 2040.0, "candidate": 2040.0})
    )
    assert world.run() == "Promoted", world.obj["status"]
    world.assert_invariant()
    gate = world.obj["status"]["gates"]["speed"]
    assert gate["reason"] == "SpeedWithinLimit"
    assert gate["message"].endswith("at matched GPU clocks (2,040 MHz)"), gate


def test_no_dcgm_series_leaves_the_claim_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = '{"status":"success","data":{"resultType":"matrix","result":[]}}'
    world, _ = _speed_world(monkeypatch, lambda w, url: empty)
    assert world.run() == "Promoted", world.obj["status"]
    gate = world.obj["status"]["gates"]["speed"]
    assert gate["message"].endswith(
        "(GPU clocks not compared: no DCGM clock series for pod r-control, r-candidate in "
        "Prometheus)"
    ), gate


@pytest.mark.parametrize("window", ["speed", "load"])
@pytest.mark.parametrize(
    "reply",
    ["refused", "<html>proxy error</html>", '{"status":"error","error":"query timed out"}'],
    ids=["unreachable", "junk", "error"],
)
def test_a_prometheus_failing_on_the_clocks_is_retried_and_never_promotes(
    monkeypatch: pytest.MonkeyPatch, reply: str, window: str
) -> None:
    # GIVEN Prometheus failing when asked for the arms' clocks over the eval (the speed gate)
    # or over the load Job's run (the throughput gate)
    build = _speed_world if window == "speed" else _load_clocks_world
    world, asked = build(monkeypatch, _prometheus_replying(reply))
    # THEN it is retried like any external error, not taken as "clocks unknown" (which would
    # let the figures claim), and the rollout gives up without promoting, naming the server
    assert world.run(steps=400) == "Failed", world.obj["status"]
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "ExternalErrors", status
    assert status["message"].startswith("gave up after 31 consecutive errors (limit 30); last: ")
    assert "prom.test:9090" in status["message"]
    assert len(asked) == 31
    assert "Promoting" not in world.phases
    if window == "load":
        assert "clocks" not in status["load"]


def _argocd_health(obj: dict[str, Any]) -> str:
    """The chart's Argo CD health check, run as Lua 5.1 (gopher-lua's dialect) via lupa."""
    import pathlib

    lupa = pytest.importorskip("lupa.lua51")
    script = pathlib.Path(__file__).resolve().parents[2] / "charts/kvgate/argocd/health.lua"
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    return str(lua.execute(script.read_text())["status"])


def _kstatus(obj: dict[str, Any]) -> str:
    """kstatus (sigs.k8s.io/cli-utils) for a custom resource that follows its conventions:
    an unobserved generation or Reconciling=True is InProgress, Stalled=True is Failed."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return "InProgress"
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    if conditions.get("Reconciling") == "True":
        return "InProgress"
    if conditions.get("Stalled") == "True":
        return "Failed"
    return "Current"


@pytest.mark.parametrize(
    ("verdict", "argocd", "kstatus", "ready"),
    [("pass", "Healthy", "Current", "True"), ("fail", "Degraded", "Failed", "False")],
)
def test_a_gate_rollout_holds_a_gitops_sync_until_its_verdict_passes(
    monkeypatch: pytest.MonkeyPatch, verdict: str, argocd: str, kstatus: str, ready: str
) -> None:
    world = World(monkeypatch, promotion={"mode": "gate"})
    world.kube.eval_summary = {**fake_cluster.SUMMARY_PASS, "verdict": verdict}
    seen: list[tuple[str, str]] = []
    for _ in range(200):
        world.reconcile()
        seen.append((_argocd_health(world.obj), _kstatus(world.obj)))
        status = world.obj.get("status") or {}
        if status.get("phase") in TERMINAL or status.get("reason") == "VerdictReported":
            break
        world.now += dt.timedelta(seconds=5)
    world.assert_invariant()  # the Deployment is never changed in gate mode
    assert world.reasons().count("Promoting") == 0
    # while it runs the sync is held (Progressing / InProgress), then the verdict decides
    assert set(seen[:-1]) == {("Progressing", "InProgress")}
    assert seen[-1] == (argocd, kstatus)
    conditions = {c["type"]: c["status"] for c in world.obj["status"]["conditions"]}
    assert conditions["Ready"] == ready
    assert conditions["Stalled"] == ("True" if verdict == "fail" else "False")


def test_a_gate_that_finds_the_pool_with_room_stays_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    # NotNeeded says FP8 buys nothing here; the candidate was never shown safe, so the gate holds
    world, _ = _prometheus_world(monkeypatch, lambda w, url: _matrix(w, url, 0.3, 0.0))
    world.obj["spec"]["promotion"] = {"mode": "gate"}
    assert world.run() == "NotNeeded", world.obj["status"]
    world.assert_invariant()
    assert (_argocd_health(world.obj), _kstatus(world.obj)) == ("Degraded", "Failed")
    assert world.obj["status"]["message"].startswith("gate closed: ")


def _drift_check(world: World) -> dict[str, Any]:
    body = kopf.Body(copy.deepcopy(world.obj))
    patch = kopf.Patch()
    handlers.drift(body=body, meta=body.metadata, patch=patch, memo=world.memo, logger=LOG)
    merge(world.obj["status"], dict(patch.get("status") or {}))
    return {c["type"]: c for c in world.obj["status"].get("conditions") or []}


def test_the_verdict_records_what_it_was_reached_on(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    key = world.obj["status"]["verdict"]["key"]
    candidate = world.obj["status"]["arms"]["candidate"]
    assert key["image"] == world.original["image"] == "vllm/vllm-openai:v0.11.0"
    assert key["imageDigest"] == candidate["imageID"] == fake_cluster.image_id(key["image"])
    assert (key["engine"], key["attentionBackend"]) == ("vllm", "TRITON_ATTN")
    assert key["kvCacheDtype"].startswith("fp8")  # what the candidate's engine said it runs
    assert key["engineVersion"] and key["config"].startswith("sha256:")
    assert key["evalPolicy"].startswith("sha256:") and key["digest"].startswith("sha256:")


@pytest.mark.parametrize("change", ["retag", "bump"])
def test_a_promoted_verdict_goes_stale_when_the_engine_image_changes(
    monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    assert _drift_check(world)["Stale"]["status"] == "False"  # what runs is what was tested
    if change == "retag":  # the same tag, pushed again: only the digest says so
        world.kube.retag()
        what = "image digest"
    else:  # an image bump from Git, the tested args kept
        world.kube.edit_container("vllm", image="vllm/vllm-openai:v0.12.0")
        what = "image vllm/vllm-openai:v0.11.0 -> vllm/vllm-openai:v0.12.0"
    mutations = world.kube.mutations
    stale = _drift_check(world)["Stale"]
    assert (stale["status"], stale["reason"]) == ("True", "Stale")
    assert what in stale["message"]
    assert world.reasons().count("Stale") == 1
    _drift_check(world)  # no second Event while it stays stale
    assert world.reasons().count("Stale") == 1
    assert _drift_check(world)["Drifted"]["status"] == "False"  # the tested args are still there
    assert world.kube.mutations == mutations  # kvgate changes nothing


def test_an_unreadable_digest_is_no_evidence_of_staleness(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    for pod in world.kube.of_kind("Pod"):
        pod["status"]["containerStatuses"][0].pop("imageID", None)  # still starting, say
    assert _drift_check(world)["Stale"]["status"] == "False"


def passing_gate(monkeypatch: pytest.MonkeyPatch) -> World:
    """A gate-mode rollout reconciled until its verdict passed (the gate is open)."""
    world = World(monkeypatch, promotion={"mode": "gate"})
    for _ in range(200):
        world.reconcile()
        if (world.obj.get("status") or {}).get("reason") == "VerdictReported":
            break
        world.now += dt.timedelta(seconds=5)
    return world


def test_a_gate_reopened_by_git_closes_again_when_the_engine_image_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = passing_gate(monkeypatch)
    assert handlers._has_verdict_in_force(world.obj["status"])
    tested = world.candidate()
    world.kube.edit_container("vllm", args=tested["args"], env=tested.get("env"))  # Git applies it
    assert _drift_check(world)["Stale"]["status"] == "False"
    assert _argocd_health(world.obj) == "Healthy"
    world.kube.retag()
    assert _drift_check(world)["Stale"]["status"] == "True"
    assert _argocd_health(world.obj) == "Progressing"  # the next sync waits for a new verdict
    assert "Drifted" not in _drift_check(world)  # gate mode never promoted: nothing to drift from


def test_a_running_eval_shows_its_progress_and_elapsed_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN an eval Job that has logged its second look and is still running
    world = World(monkeypatch)
    world.kube.hold_evals = True
    look = {"kind": "kvgate.eval/progress", "look": 2, "looks_planned": 5, "questions": 200,
            "difference": -0.005, "verdict": None, "paired": {"n": 200}}  # fmt: skip
    world.kube.eval_log_before = json.dumps(look) + "\n"
    seen: list[tuple[str, str | None]] = []

    def watch(w: World) -> None:
        if w.phase == "Evaluating":
            seen.append((w.obj["status"]["message"], w.obj["status"].get("progress")))
        if len(seen) == 3:
            w.kube.finish_evals()

    world.before_reconcile = watch
    # WHEN the operator polls it, THEN status.message and the printer column say where it stands
    assert world.run() == "Promoted"
    running = [s for s in seen if s[0].startswith("eval attempt 1 running")]
    assert running, seen
    message, column = running[-1]
    assert re.fullmatch(
        r"eval attempt 1 running: look 2/5, 200 of 500 questions, candidate -0\.5 pp so far; "
        r"\d+ s elapsed, at most 2 min an attempt",
        message,
    ), message
    assert column == "200/500 q, look 2/5, -0.5 pp"
    # the stored line is camelCase, as the rest of status (the CLI's live view reads it)
    assert world.obj["status"]["eval"]["progress"]["looksPlanned"] == 5
    # once the eval is over the progress column is empty again
    assert "progress" not in world.obj["status"]


def test_a_passing_accuracy_gate_posts_its_figures_as_an_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    passed = [(t, m) for t, r, m in world.events if r == "AccuracyNonInferior"]
    assert passed == [
        (
            "Normal",
            "control 92.0% vs candidate 91.6%, difference -0.4 pp [-1.9, +1.1] (two-sided 95%) "
            "(margin 3 pp, n=500)",
        )
    ]


def test_a_failing_accuracy_gate_posts_no_pass_event(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    world.kube.eval_summary = {**fake_cluster.SUMMARY_PASS, "verdict": "fail"}
    assert world.run() == "RolledBack"
    assert "AccuracyNonInferior" not in world.reasons()
    assert "AccuracyRegressed" in world.reasons()


def test_a_manual_rollout_records_when_its_approval_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """approvalExpiresAt is phaseSince of AwaitingApproval plus the operator's approval TTL,
    the deadline the machine applies (ApprovalExpired); the report prints it."""
    world = World(monkeypatch, promotion={"mode": "manual"})
    for _ in range(100):
        world.now += dt.timedelta(seconds=min(world.reconcile(), 30))
        if world.phase == "AwaitingApproval":
            break
    status = world.obj["status"]
    assert world.phase == "AwaitingApproval", status.get("message")
    since = dt.datetime.fromisoformat(status["phaseSince"].replace("Z", "+00:00"))
    assert status["approvalExpiresAt"] == (since + dt.timedelta(hours=72)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    # a later reconcile keeps it (the phase has not changed)
    world.now += dt.timedelta(hours=1)
    world.reconcile()
    assert world.obj["status"]["approvalExpiresAt"] == status["approvalExpiresAt"]
    assert "expires " + status["approvalExpiresAt"][:10] in " ".join(
        report.render_text(world.obj).split()
    )


# --- the load Job (spec.gates.capacityGain.throughputGain) ---------------------------------------

THROUGHPUT_GATES = {"capacity": {"mode": "off"}, "capacityGain": {"throughputGain": {}}}


def test_throughput_gain_measures_load_then_promotes_with_the_gain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the throughput gate on, and a load Job that measures the field report's shape:
    # BF16 runs out of KV cache at production's load, FP8 serves it at 2,192 tok/s
    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    # WHEN the rollout runs
    assert world.run() == "Promoted"
    world.assert_invariant()
    # THEN the load was measured between the eval and the promotion, once
    assert world.phases == [
        "Preflight", "Canary", "Evaluating", "Measuring", "Promoting", "Verifying", "Promoted",
    ]  # fmt: skip
    assert world.kube.load_concurrency == [1]  # no preflight figures: production load 1
    status = world.obj["status"]
    load = status["load"]
    assert load["attempt"] == 1 and load["job"] == "r-load-1"
    assert load["concurrency"] == 1 and len(load["nonceSha256"]) == 64
    # the capacity case: FP8 at production's load over BF16's best stage
    assert load["throughputGain"] == pytest.approx(2_192 / 1_558, abs=1e-4)
    assert load["summary"]["candidate"]["stages"][0]["outputTokensPerS"] == 2_192.0
    gate = status["gates"]["throughputGain"]
    assert gate["outcome"] == "Successful" and gate["reason"] == "ThroughputGained"
    assert "2,192 tok/s" in gate["message"] and "+41%" in gate["message"]
    gained = [(t, m) for t, r, m in world.events if r == "ThroughputGained"]
    assert gained == [("Normal", gate["message"])]
    assert world.reasons().count("LoadStarted") == 1
    # the Gain printer column reads status.load.throughputGain
    crd = manifests_crd()
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    gain_col = next(c for c in columns if c["name"] == "Gain")
    assert gain_col["jsonPath"] == ".status.load.throughputGain"
    # the report shows the load section
    text = report.render_text(world.obj)
    assert "throughput gain at production load 1: 1.41x" in text
    # the load Job is deleted at the end
    assert world.kube.get("Job", "r-load-1") is None


def manifests_crd() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[2] / "crds" / "kvgate.io_kvcacherollouts.yaml"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def test_throughput_gate_candidate_gaining_nothing_ends_not_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN both arms serving production's load alike (compute-bound at short context)
    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    world.kube.load_summary = lambda c: fake_cluster.field_load(c, fp8_gains=False)
    # WHEN the rollout runs THEN it ends NotNeeded with the measured reason, unpatched
    assert world.run() == "NotNeeded"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "ThroughputNotNeeded"
    assert "2,010 tok/s vs 2,000 tok/s, +0%" in status["message"]
    assert status["load"]["throughputGain"] == pytest.approx(1.005)
    assert world.phases[-2:] == ["Measuring", "NotNeeded"]
    assert ("Warning", "ThroughputNotNeeded") in [(t, r) for t, r, _ in world.events]


@pytest.mark.parametrize("broken", ["error-summary", "no-summary"])
def test_a_load_job_that_errors_is_retried_then_fails_without_a_verdict(
    monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    # GIVEN a load Job that errors every time: exit 4 with every stage in error (an unreachable
    # arm), or a Job that failed printing no summary (killed, OOM)
    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    world.kube.load_summary = (
        fake_cluster.load_error_summary if broken == "error-summary" else lambda c: None
    )
    # WHEN the rollout runs
    assert world.run() == "Failed"
    world.assert_invariant()
    # THEN each attempt was a new Job (evalRetries 1: two attempts), then Failed: no verdict
    status = world.obj["status"]
    assert world.kube.load_concurrency == [1, 1]
    assert status["reason"] == "LoadError" and status["load"]["attempt"] == 2
    assert status["message"].startswith("load failed 2 time(s), last: ")
    assert "verdict" not in status
    assert status["gates"]["throughputGain"]["outcome"] == "Error"
    assert world.reasons().count("LoadRetry") == 0  # the retry is a step reason, not an Event
    assert world.reasons().count("LoadError") >= 2
    assert world.kube.get("Job", "r-load-1") is None and world.kube.get("Job", "r-load-2") is None


LOAD_PROGRESS_LOG = "".join(
    json.dumps({"kind": "kvgate.load/progress", **line}) + "\n"
    for line in (
        {"event": "started", "stages": [64, 1, 8, 32], "requests": [128, 2, 16, 64]},
        {"event": "stage", "arm": "control", "stage": 0, "concurrency": 64},
        {"event": "stage", "arm": "candidate", "stage": 0, "concurrency": 64},
        {"event": "stage", "arm": "control", "stage": 1, "concurrency": 1},
    )
)


def _held_load(monkeypatch: pytest.MonkeyPatch, timeout: str) -> World:
    """A rollout with the throughput gate (load timeout `timeout`) whose load Job keeps running
    with LOAD_PROGRESS_LOG as its log, run until the Job exists."""
    gates = {**THROUGHPUT_GATES, "capacityGain": {"throughputGain": {"timeout": timeout}}}
    world = World(monkeypatch, gates=gates)
    world.kube.hold_loads = True
    world.kube.load_log = LOAD_PROGRESS_LOG
    for _ in range(200):
        world.reconcile()
        world.now += dt.timedelta(seconds=1)
        if world.kube.get("Job", "r-load-1") is not None and world.phase == "Measuring":
            world.reconcile()
            return world
    raise AssertionError(f"no load Job: {world.obj.get('status')}")


def test_measuring_shows_the_load_jobs_progress_in_status_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a load Job running: both arms past production's stage, the control one stage further
    world = _held_load(monkeypatch, "20m")
    # THEN status.message says where each arm stands, and the attempt's own bound
    message = world.obj["status"]["message"]
    assert message.startswith("load attempt 1 running: stages control 2/4, candidate 1/4 "), message
    assert "(latest 1 concurrent)" in message and "at most 20 min an attempt" in message
    # WHEN the control's run ends
    world.kube.log_loads(
        json.dumps({"kind": "kvgate.load/progress", "event": "finished", "arm": "control"}) + "\n"
    )
    world.reconcile()
    assert "control 2/4 done, candidate 1/4" in world.obj["status"]["message"]


def test_a_job_that_has_not_started_measuring_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    gates = {**THROUGHPUT_GATES, "capacityGain": {"throughputGain": {"timeout": "20m"}}}
    world = World(monkeypatch, gates=gates)
    world.kube.hold_loads = True  # its pod has logged nothing yet
    for _ in range(200):
        world.reconcile()
        world.now += dt.timedelta(seconds=1)
        if world.phase == "Measuring" and world.kube.get("Job", "r-load-1") is not None:
            world.reconcile()
            break
    assert "load attempt 1 running: starting inference-perf; " in world.obj["status"]["message"]


def test_the_load_timeout_bounds_each_attempt_then_the_rollout_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN spec.gates.capacityGain.throughputGain.timeout 5m, evalTimeout 300s elsewhere
    world = _held_load(monkeypatch, "5m")
    job = world.kube.get("Job", "r-load-1")
    assert job is not None
    # THEN the load Job's deadline is the load timeout, and its runs stop a margin before it
    assert job["spec"]["activeDeadlineSeconds"] == 300
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--timeout") + 1] == "240"
    # WHEN the Job controller kills the attempt at that deadline (no summary printed)
    world.kube.fail_loads()
    world.reconcile()
    # THEN it is retried within evalRetries (1): attempt 2 recorded first (write-ahead), then
    # made by the next reconcile, a second Job with the same bound
    assert world.phase == "Measuring" and world.obj["status"]["load"]["attempt"] == 2
    assert world.kube.get("Job", "r-load-2") is None
    world.reconcile()
    job2 = world.kube.get("Job", "r-load-2")
    assert job2 is not None and job2["spec"]["activeDeadlineSeconds"] == 300
    # WHEN the second attempt is killed at its deadline too
    world.reconcile()
    world.kube.fail_loads()
    # THEN the rollout fails with LoadError naming the deadline, no verdict, production as it was
    assert world.run() == "Failed"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "LoadError"
    assert "load failed 2 time(s)" in status["message"]
    assert "longer than specified deadline" in status["message"]
    assert "verdict" not in status and "throughputGain" not in status["load"]


def test_a_load_job_that_never_ends_fails_after_every_attempts_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a load Job that never ends (its pod never scheduled, the deadline never enforced)
    world = _held_load(monkeypatch, "1m")
    # WHEN the rollout runs on THEN the phase's bound is the load timeout x attempts + grace
    assert world.run(steps=400) == "Failed"
    status = world.obj["status"]
    assert status["reason"] == "LoadError"
    assert "load did not finish within 180s" in status["message"]  # 60 x 2 + 60 grace


def test_a_load_job_that_cannot_be_made_fails_at_the_load_deadline_naming_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the load attempt recorded, and making its Job failing on every reconcile (load
    # timeout 1m; the eval's is 120s, so the eval's bound would be 300s)
    gates = {**THROUGHPUT_GATES, "capacityGain": {"throughputGain": {"timeout": "1m"}}}
    world = World(monkeypatch, gates=gates)

    def refused(ctx: Any, step: Any) -> None:
        raise KubeError("create job ns/r-load-1: 403 Forbidden", status=403)

    monkeypatch.setitem(act.ACTIONS, act.Action.CREATE_LOAD_JOB, refused)
    # WHEN the rollout runs on
    assert world.run(steps=400) == "Failed"
    # THEN it ends at the load phase's own bound (1m x 2 attempts + 60s grace), naming the
    # failure, not as a load that did not finish; production is as it was
    status = world.obj["status"]
    assert status["reason"] == "ExternalErrors"
    assert "phase Measuring passed its deadline of 180s" in status["message"]
    assert "403 Forbidden" in status["message"]
    assert world.kube.get("Job", "r-load-1") is None
    world.assert_invariant()


def test_a_load_timeout_below_ten_seconds_is_refused_naming_the_field() -> None:
    gain: dict[str, Any] = {"throughputGain": {"timeout": "5s"}}
    with pytest.raises(ExceptionGroup) as caught:
        RolloutSpec.from_dict({"targetRef": {"name": "d"}, "gates": {"capacityGain": gain}})
    assert [str(e) for e in caught.value.exceptions] == [
        "spec.gates.capacityGain.throughputGain.timeout: 5s is shorter than 10s; use a longer "
        "duration"
    ]
    gain = {"throughputGain": {}}
    spec = RolloutSpec.from_dict({"targetRef": {"name": "d"}, "gates": {"capacityGain": gain}})
    gate = spec.capacity_gain.throughput_gain
    assert gate is not None and gate.timeout_s == 1800.0


LENGTH_HISTOGRAMS = """\
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{le="2000.0",model_name="m"} 40
vllm:request_prompt_tokens_bucket{le="+Inf",model_name="m"} 40
vllm:request_prompt_tokens_sum{model_name="m"} 72000
vllm:request_prompt_tokens_count{model_name="m"} 40
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{le="500.0",model_name="m"} 40
vllm:request_generation_tokens_bucket{le="+Inf",model_name="m"} 40
vllm:request_generation_tokens_sum{model_name="m"} 16000
vllm:request_generation_tokens_count{model_name="m"} 40
"""


def _load_command(world: World) -> list[str]:
    job = world.kube.get("Job", "r-load-1")
    if job is None:  # deleted at the end: the pod the fake made for it keeps the spec
        job = world.kube.get("Pod", "r-load-1-x")
        assert job is not None
        return [str(a) for a in job["spec"]["containers"][0]["command"]]
    return [str(a) for a in job["spec"]["template"]["spec"]["containers"][0]["command"]]


def _until_the_load_job(monkeypatch: pytest.MonkeyPatch, histograms: str | None) -> World:
    """A measured rollout whose preflight samples production (capacity gate on, warn), run
    until its load Job exists; `histograms`: extra text in production's /metrics."""
    gates = {**THROUGHPUT_GATES, "capacity": {"mode": "warn", "window": "3s", "samples": 3}}
    world = World(monkeypatch, gates=gates)
    if histograms is not None:
        world.kube.extra_metrics = histograms
    return _run_until_load_job(world)


def _run_until_load_job(world: World) -> World:
    """Reconcile a second at a time until the load Job exists (its run held)."""
    world.kube.hold_loads = True
    for _ in range(200):
        world.reconcile()
        world.now += dt.timedelta(seconds=1)
        if world.kube.get("Job", "r-load-1") is not None:
            break
    return world


def test_the_load_runs_productions_request_lengths_from_its_histograms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a production whose finished requests averaged 1,800 prompt and 400 output tokens,
    # and the preflight sampling it (capacity gate on, warn)
    world = _until_the_load_job(monkeypatch, LENGTH_HISTOGRAMS)
    # THEN the load Job runs those lengths, and status says where they came from
    command = _load_command(world)
    assert command[command.index("--prompt-tokens") + 1] == "1800"
    assert command[command.index("--output-tokens") + 1] == "400"
    lengths = world.obj["status"]["load"]["lengths"]
    assert lengths.startswith(
        "production's request lengths from the pods' /metrics over 40 requests: prompt mean 1800"
    )


def test_the_load_job_is_given_the_models_source_for_its_tokenizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a rollout whose engine serves a model WHEN the load Job starts THEN its clients are
    # pointed at that model's source for their tokenizer (the same for a simulator: no case)
    world = _until_the_load_job(monkeypatch, LENGTH_HISTOGRAMS)
    command = _load_command(world)
    model = world.obj["status"]["model"]
    assert model and command[command.index("--tokenizer") + 1] == model


def test_the_gates_slos_go_to_the_load_job_for_its_goodput(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN SLOs on the throughput gate WHEN the load Job starts THEN it is told them, so
    # inference-perf counts each stage's requests that met them (the goodput)
    gates = {**THROUGHPUT_GATES, "capacityGain": {"throughputGain": {"ttftP99Ms": 2500}}}
    command = _load_command(_run_until_load_job(World(monkeypatch, gates=gates)))
    assert command[command.index("--slo-ttft-ms") + 1] == "2500"
    assert "--slo-tpot-ms" not in command
    plain = _load_command(_run_until_load_job(World(monkeypatch, gates=THROUGHPUT_GATES)))
    assert not any(a.startswith("--slo") for a in plain)


def test_without_length_histograms_the_load_runs_the_fixed_lengths_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = _until_the_load_job(monkeypatch, None)
    command = _load_command(world)
    assert command[command.index("--prompt-tokens") + 1] == "512"
    assert command[command.index("--output-tokens") + 1] == "128"
    assert world.obj["status"]["load"]["lengths"] == (
        "production's request lengths unread from the pods' /metrics (no prompt-length "
        "histogram): the load runs the fixed 512 prompt / 128 output tokens"
    )


def _length_totals_matrix(world: World, url: str) -> str:
    """A full pool's history whose every step also holds production's request-length totals:
    40 finished requests, 1,800 prompt and 400 output tokens on average (LENGTH_HISTOGRAMS)."""
    doc = json.loads(_matrix(world, url, 0.97, 6.0))
    steps = [t for t, _ in doc["data"]["result"][0]["values"]]
    for pod in world.kube.of_kind("Pod"):
        instance = f"{pod['status']['podIP']}:8000"
        for name, value in (
            ("vllm:request_prompt_tokens_sum", 72000.0),
            ("vllm:request_prompt_tokens_count", 40.0),
            ("vllm:request_generation_tokens_sum", 16000.0),
            ("vllm:request_generation_tokens_count", 40.0),
        ):
            labels = {"__name__": name, "instance": instance, "job": "vllm", "model_name": "m"}
            doc["data"]["result"].append(
                {"metric": labels, "values": [[t, str(value)] for t in steps]}
            )
    return json.dumps(doc)


def test_the_load_runs_the_request_lengths_read_from_prometheus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN an operator reading production's pool from Prometheus, whose history holds the
    # request-length totals of 40 requests of 1,800 / 400 tokens on average
    gates = {**THROUGHPUT_GATES, "capacity": {"mode": "warn", "window": "3s", "samples": 3}}
    world, direct = _prometheus_world(monkeypatch, _length_totals_matrix, gates=gates)
    _run_until_load_job(world)
    # THEN the load Job runs those lengths, and status says they came from Prometheus
    assert world.obj["status"]["preflight"]["source"] == "prometheus" and direct == []
    command = _load_command(world)
    assert command[command.index("--prompt-tokens") + 1] == "1800"
    assert command[command.index("--output-tokens") + 1] == "400"
    assert world.obj["status"]["load"]["lengths"].startswith(
        "production's request lengths from Prometheus over 40 requests: prompt mean 1800"
    )


def test_a_job_error_that_quotes_a_token_is_scrubbed_from_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a load Job whose error quotes a credential (an arm's error page echoing the request)
    import json

    token = "hf_" + "Zq9" * 10

    def leaky(production: int) -> dict[str, Any]:
        summary = fake_cluster.load_error_summary(production)
        summary["error"] = f"control measured nothing: 401 for /v1/models?api_key={token}"
        return summary

    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    world.kube.load_summary = leaky
    # WHEN it errors on every attempt and the rollout ends
    assert world.run() == "Failed"
    # THEN the message names the error with the credential redacted, in every status written
    status = world.obj["status"]
    assert "api_key=<redacted" in status["message"], status["message"]
    assert token not in json.dumps(world.patches) and token not in json.dumps(status)
    assert not [e for e in world.events if token in e[2]]


def test_a_load_summary_without_the_nonce_is_not_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a load Job whose summary line (a big gain) does not carry the attempt's nonce
    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    world.kube.load_nonce = False
    # WHEN the rollout runs THEN the gain is never taken: retried, then Failed, never Promoted
    assert world.run() == "Failed"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "LoadError"
    assert "throughputGain" not in status["load"]
    assert "no load summary" in status["message"]


def test_with_the_throughput_gate_off_no_load_job_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    assert world.phases == [
        "Preflight",
        "Canary",
        "Evaluating",
        "Promoting",
        "Verifying",
        "Promoted",
    ]
    assert world.kube.load_concurrency == [] and "load" not in world.obj["status"]
    assert "throughputGain" not in world.obj["status"]["gates"]


def test_the_load_job_runs_in_the_operators_image_confined_to_the_canaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the throughput gate, an operator with its own load image and a GSM8K copy
    world = World(monkeypatch, gates=THROUGHPUT_GATES)
    world.memo = kopf.Memo(
        kube=world.kube,
        config=OperatorConfig(poll_interval_s=1, hub_offline=True, gsm8k_dir="/data/gsm8k",
                              load_image="registry/kvgate-load:1"),
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def look(w: World) -> None:
        if w.phase == "Measuring" and not seen and w.kube.get("Job", "r-load-1") is not None:
            seen["job"] = copy.deepcopy(w.kube.get("Job", "r-load-1"))
            seen["policy"] = copy.deepcopy(w.kube.get("NetworkPolicy", "r-load"))
            seen["ips"] = {a: w.kube.get("Pod", f"r-{a}")["status"]["podIP"]  # type: ignore[index]
                           for a in ("control", "candidate")}  # fmt: skip

    world.before_reconcile = look
    # WHEN the rollout runs
    assert world.run() == "Promoted"
    # THEN the load Job ran `kvgate load-job` on both canaries in the load image
    pod = seen["job"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry/kvgate-load:1"
    command = container["command"]
    assert command[:2] == ["kvgate", "load-job"]
    assert command[command.index("--control-url") + 1] == f"http://{seen['ips']['control']}:8000"
    assert (
        command[command.index("--candidate-url") + 1] == f"http://{seen['ips']['candidate']}:8000"
    )
    assert command[command.index("--prompt-tokens") + 1] == "512"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KVGATE_GSM8K_DIR"] == "/data/gsm8k" and len(env["KVGATE_LOAD_NONCE"]) == 32
    assert pod["automountServiceAccountToken"] is False
    # its NetworkPolicy selects the load pods and lets them reach the canaries' port and DNS only
    policy = seen["policy"]["spec"]
    assert policy["podSelector"]["matchLabels"]["kvgate.io/arm"] == "load"
    assert {p["port"] for rule in policy["egress"] for p in rule["ports"]} == {8000, 53}
    # and both are gone at the end
    assert world.kube.get("NetworkPolicy", "r-load") is None
    assert world.kube.get("NetworkPolicy", "r-eval") is None


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_at_every_mutation_of_a_measured_rollout_keeps_the_invariant(
    monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    clean = World(monkeypatch, gates=THROUGHPUT_GATES)
    assert clean.run() == "Promoted"
    for k in range(1, clean.kube.mutations + 1):
        world = World(monkeypatch, gates=THROUGHPUT_GATES)
        world.kube.crash_at, world.kube.crash_after = k, after
        end = world.run()
        assert world.crashes == 1, f"mutation {k} was never reached"
        world.assert_invariant()
        assert end == "Promoted", f"crash {'after' if after else 'before'} mutation {k}: {end}"
        assert world.obj["status"]["load"]["throughputGain"] == pytest.approx(1.407, abs=1e-3)
        assert world.reasons().count("Promoting") <= 1, "the candidate was patched twice"


def test_a_canary_lost_while_measuring_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the throughput gate, and a candidate pod that disappears once the load Job runs
    world = World(monkeypatch, gates=THROUGHPUT_GATES)

    def lose(w: World) -> None:
        if w.phase == "Measuring" and w.kube.get("Pod", "r-candidate") is not None:
            del w.kube.objects[("Pod", "r-candidate")]

    world.before_reconcile = lose
    # WHEN the rollout runs THEN it rolls back naming the lost arm, with no throughput claim
    assert world.run() == "RolledBack"
    world.assert_invariant()
    status = world.obj["status"]
    assert status["reason"] == "CanaryCrashed" and "candidate" in status["message"]
    assert "throughputGain" not in status["gates"]


def _load_clocks_world(
    monkeypatch: pytest.MonkeyPatch, mhz: dict[str, float] | Callable[[World, str], str]
) -> tuple[World, list[str]]:
    """The throughput gate on (the speed gate off), Prometheus answering the pool and the
    arms' DCGM clocks `mhz` (or `mhz(world, url)`); returns the world and the clock queries."""
    asked: list[str] = []

    def answer(world: World, url: str) -> str:
        if "DCGM_FI_DEV" in urllib.parse.unquote_plus(url):
            asked.append(url)
            return mhz(world, url) if callable(mhz) else _clock_matrix(world, url, mhz)
        return _matrix(world, url, 0.97, 6.0)

    world, _ = _prometheus_world(monkeypatch, answer, gates=THROUGHPUT_GATES)
    return world, asked


def test_arms_at_different_gpu_clocks_under_load_get_no_throughput_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the throughput gate without the speed gate, and the candidate's GPU held at
    # 1,410 MHz while the control's runs at 2,040 during the load
    world, asked = _load_clocks_world(monkeypatch, {"control": 2040.0, "candidate": 1410.0})
    # WHEN the rollout runs
    outcome = world.run()
    world.assert_invariant()
    # THEN the load's figures make no claim, the gate says why, and nothing is promoted
    status = world.obj["status"]
    gate = status["gates"]["throughputGain"]
    assert (gate["outcome"], gate["reason"]) == ("Inconclusive", "ClocksDiffer"), gate
    assert gate["message"].startswith(
        "no throughput claim: the arms ran at different GPU clocks: SM clock 1,410 MHz on the "
        "candidate vs 2,040 MHz on the control"
    ), gate
    assert outcome == "RolledBack" and "Promoting" not in world.phases, world.phases
    assert status["reason"] == "ClocksDiffer", status["message"]
    assert world.kube.container()["args"] == world.original["args"]
    # the clocks were read once, over the load Job's run (from its creation), and kept
    assert len(asked) == 1
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(asked[0]).query)
    load = status["load"]
    assert float(query["start"][0]) == pytest.approx(load["startedAt"], abs=1.0)
    assert load["clocks"]["candidate"]["smMHz"] == 1410.0
    assert load["clocks"]["control"]["smMHz"] == 2040.0
    assert "speed" not in status or "clocks" not in (status.get("speed") or {})


def test_matched_clocks_under_load_keep_the_throughput_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, asked = _load_clocks_world(monkeypatch, {"control": 2040.0, "candidate": 2040.0})
    assert world.run() == "Promoted", world.obj["status"].get("message")
    gate = world.obj["status"]["gates"]["throughputGain"]
    assert gate["reason"] == "ThroughputGained"
    assert len(asked) == 1 and world.obj["status"]["load"]["clocks"]["source"] == "prometheus"


def test_a_block_rebuilt_from_new_readings_keeps_nothing_of_the_old_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a rollout sampling its pool when the operator is upgraded: the status the earlier
    # release wrote holds the pool verdict of an earlier window in its snake_case spelling
    world = World(monkeypatch, gates={"capacity": {"mode": "warn", "window": "4s", "samples": 3}})
    delay = world.reconcile()
    assert world.phase == "Preflight"
    stale = {"pressured": False, "max_usage": 0.12, "pressured_samples": 0, "samples": 1}
    world.obj["status"].setdefault("preflight", {})["pressure"] = stale
    # WHEN the new release decides the pool from the window
    for _ in range(20):
        world.now += dt.timedelta(seconds=delay)
        delay = world.reconcile()
        if world.phase != "Preflight":
            break
    # THEN the record is the new reading alone: no figure of the old one survives beside it
    pressure = world.obj["status"]["preflight"]["pressure"]
    assert pressure["samples"] == 3 and "maxUsage" in pressure and "usageThreshold" in pressure
    assert not {"max_usage", "pressured_samples"} & set(pressure), pressure


@pytest.mark.parametrize("gates", [None, "throughput"])
def test_a_reconcile_reads_each_object_once_whichever_stage_needs_it(
    monkeypatch: pytest.MonkeyPatch, gates: str | None
) -> None:
    # GIVEN a rollout through every phase that reads the cluster (with the throughput gate:
    # Measuring too), its reads counted per reconcile by what they read
    world = World(monkeypatch, **({"gates": THROUGHPUT_GATES} if gates else {}))
    reads: list[tuple[str, str]] = []
    for method in ("read_deployment", "read_job", "read_log"):
        real = getattr(world.kube, method)

        def counted(*args: Any, _real: Any = real, _what: str = method, **kw: Any) -> Any:
            reads.append((_what, args[1]))
            return _real(*args, **kw)

        monkeypatch.setattr(world.kube, method, counted)
    marks: list[int] = []
    world.before_reconcile = lambda _: marks.append(len(reads))
    # WHEN it runs to its end
    end = world.run()
    marks.append(len(reads))
    # THEN no reconcile reads the target Deployment, a Job or a pod's log twice: observation
    # reads what its phase needs once, at its start (`seen.look`), and acting reuses it
    assert end == "Promoted"
    seen_kinds = set()
    for i, (start, stop) in enumerate(itertools.pairwise(marks)):
        these = reads[start:stop]
        twice = {r for r in these if these.count(r) > 1}
        assert not twice, f"reconcile {i} ({world.phases}): read twice {sorted(twice)}"
        seen_kinds |= {what for what, _ in these}
    assert seen_kinds == {"read_deployment", "read_job", "read_log"}
    if gates:
        assert "Measuring" in world.phases
        assert any(name.startswith("r-load") for what, name in reads if what == "read_job")


def test_an_ended_rollouts_deletions_that_fail_are_retried_uncounted_then_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a rollout that ended (Promoted) with the deletion of its canaries recorded
    world = World(monkeypatch)
    for _ in range(200):
        world.now += dt.timedelta(seconds=min(world.reconcile(), 30))
        if world.phase in TERMINAL and world.obj["status"].get("pendingActions"):
            break
    assert world.phase == "Promoted" and world.obj["status"]["pendingActions"]
    ended = copy.deepcopy(world.obj["status"])
    real_delete = world.kube.delete

    def refused(kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        raise KubeError(f"deleting {kind} {name}: 503 apiserver unavailable", status=503)

    # WHEN the API refuses the deletions on the next reconcile
    monkeypatch.setattr(world.kube, "delete", refused)
    delay = world.reconcile()
    # THEN it comes back after 5 s, having written nothing: an ended rollout's status is
    # final (no error count, no message), and its deletions are still recorded
    assert delay == 5.0
    assert world.patches[-1][1] == {}
    assert world.obj["status"] == ended
    # WHEN the API answers again, the deletions go through and their record is cleared
    monkeypatch.setattr(world.kube, "delete", real_delete)
    world.reconcile()
    assert "pendingActions" not in world.obj["status"]
    assert world.obj["status"]["phase"] == "Promoted"
    left = [key for key, obj in world.kube.objects.items()
            if key[0] in ("Pod", "Job", "NetworkPolicy")
            and obj["metadata"].get("ownerReferences")]  # fmt: skip
    assert left == []
    world.assert_invariant()


def test_preflight_lists_productions_pods_only_when_a_pool_round_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a rollout sampling the pool every 10 s (samples 5 over a 40 s window), every LIST of
    # production's pods (not the rollout's own) counted per reconcile
    world = World(
        monkeypatch, gates={"capacity": {"mode": "require", "window": "40s", "samples": 5}}
    )
    lists: list[str] = []
    real = world.kube.list_pods

    def counted(namespace: str, selector: str) -> list[dict[str, Any]]:
        if not selector.startswith("kvgate.io/"):
            lists.append(selector)
        return real(namespace, selector)

    monkeypatch.setattr(world.kube, "list_pods", counted)
    while world.phase != "Preflight":
        world.reconcile()
    world.reconcile()  # the first round: due at once
    first = world.obj["status"]["preflight"]["ticks"]
    assert first == 1 and len(lists) == 1
    # WHEN it is reconciled again before the interval has passed (a spec poll, a retry)
    lists.clear()
    for _ in range(3):
        world.now += dt.timedelta(seconds=2)
        world.reconcile()
    # THEN no reconcile listed production's pods, and no sample was taken
    assert lists == []
    assert world.obj["status"]["preflight"]["ticks"] == first
    # WHEN the interval has passed: one LIST, and the round is counted
    world.now += dt.timedelta(seconds=10)
    world.reconcile()
    assert len(lists) == 1
    assert world.obj["status"]["preflight"]["ticks"] == first + 1


@pytest.mark.parametrize("mode", ["warn", "require"])
def test_scales_the_operator_could_not_read_are_no_reason_to_promote_in_require_mode(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # GIVEN a hub model the operator cannot read (offline) and a candidate whose log says
    # nothing of KV scales (as real vLLM 0.32 serves a checkpoint without them)
    world = World(monkeypatch, gates={"capacity": {"mode": "off"}, "scales": {"mode": mode}})
    # WHEN the rollout runs
    end = world.run()
    world.assert_invariant()
    status = world.obj["status"]
    gate = status["gates"]["scales"]
    # THEN the gate says it does not know, never ScalesPresent; in require mode that doubt is
    # enough to stop the promotion and leave production as it was
    assert gate["reason"] == "ScalesUnknown", gate
    assert "could not be read" in gate["message"]
    if mode == "warn":
        assert (end, gate["outcome"]) == ("Promoted", "Warning")
    else:
        assert gate["outcome"] == "Inconclusive"
        assert end != "Promoted" and "Promoting" not in world.phases, (end, status["message"])
        assert world.kube.container() == world.original


def test_a_checkpoint_naming_thousands_of_broken_scales_keeps_the_status_small(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    # GIVEN a hostile checkpoint: a config of 4,000 layers, every k/v scale 0.0 (8,000 findings)
    config = json.loads((fake_cluster.DATA / "configs" / "qwen3-8b.json").read_text())
    config["num_hidden_layers"] = 4000
    (tmp_path / "config.json").write_text(json.dumps(config))
    scales = {
        f"model.layers.{layer}.self_attn.{kind}": np.array(0.0, np.float32)
        for layer in range(4000)
        for kind in ("k_scale", "v_scale")
    }
    save_file(scales, str(tmp_path / "model.safetensors"))
    world = World(monkeypatch, model={"name": str(tmp_path)})
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(tmp_path),)
    )
    # WHEN the rollout runs
    end = world.run()
    status = world.obj["status"]
    # THEN it is refused on the broken scales, and the status keeps 16 of them and a count, not
    # 8,000 lines: the apiserver refuses an object past 1.5 MiB and the operator would stall
    broken = status["preflight"]["checkpoint"]["brokenScales"]
    assert (end, status["reason"]) == ("RolledBack", "ScalesBroken"), status["message"]
    assert len(broken) == 17 and broken[-1] == "and 7984 more", broken[-3:]
    assert broken[0] == "layer 0: k_scale 0.0"
    assert (
        "more in status.preflight.checkpoint.brokenScales" in status["gates"]["scales"]["message"]
    )
    assert len(json.dumps(status)) < 64_000
    assert world.kube.container() == world.original
