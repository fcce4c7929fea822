"""Polling: a rollout is reconciled when due (the core's delay passed, or a new spec), never on a
status older than its own last write, and never beside its cleanup."""

from __future__ import annotations

import math
import threading
from typing import Any

import kopf
import pytest

from kvgate.controller import handlers
from kvgate.controller.schedule import WRITE_WAIT_S, Schedule, schedule_of


def test_first_sight_is_due_and_then_the_cores_delay_decides() -> None:
    s = Schedule()
    assert s.due(100.0, 1, "v1")
    s.ran_on(100.0, 1, "v1", delay=5.0, wrote=False)
    assert not s.due(104.9, 1, "v1")
    assert s.due(105.0, 1, "v1")


def test_a_new_spec_is_due_at_once() -> None:
    s = Schedule()
    s.ran_on(100.0, 1, "v1", delay=60.0, wrote=False)
    assert not s.due(101.0, 1, "v2")  # a status-only change (annotations, drift) waits
    assert s.due(101.0, 2, "v3")


def test_an_ended_or_stalled_rollout_waits_for_a_new_spec() -> None:
    s = Schedule()
    s.ran_on(100.0, 3, "v1", delay=None, wrote=False)
    assert s.due_at == math.inf and not s.due(1e9, 3, "v9")
    assert s.due(1e9, 4, "v10")


def test_never_on_a_status_older_than_its_own_last_write() -> None:
    s = Schedule()
    s.ran_on(100.0, 1, "v1", delay=0.0, wrote=True)
    assert not s.due(101.0, 1, "v1")  # the write has not come back through the watch
    assert not s.due(101.0, 2, "v1")  # not even for a new spec: the body is stale
    assert s.due(101.0, 1, "v2")  # it came back
    s.ran_on(200.0, 1, "v2", delay=0.0, wrote=True)
    assert s.due(200.0 + WRITE_WAIT_S, 1, "v2")  # a lost event is waited for only so long


def test_a_schedule_is_one_per_rollout() -> None:
    memo = kopf.Memo()
    assert schedule_of(memo) is schedule_of(memo)
    assert schedule_of(kopf.Memo()) is not schedule_of(memo)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _poll(memo: kopf.Memo, generation: int, version: str, **meta: Any) -> kopf.Patch:
    body = kopf.Body({"metadata": {"name": "r", "namespace": "ns", "generation": generation,
                                   "resourceVersion": version, **meta}})  # fmt: skip
    patch = kopf.Patch()
    handlers.poll(body=body, meta=body.metadata, patch=patch, memo=memo,
                  logger=handlers.logging.getLogger("test"))  # fmt: skip
    return patch


def test_the_timer_reconciles_only_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, calls = Clock(), []

    def reconcile(*, patch: kopf.Patch, **_: Any) -> None:
        calls.append(clock.now)
        if len(calls) == 1:
            patch.status["phase"] = "Preflight"  # a write
        raise kopf.TemporaryError("waiting", delay=5)

    monkeypatch.setattr(handlers.time, "monotonic", clock)
    monkeypatch.setattr(handlers, "reconcile", reconcile)
    memo = kopf.Memo()
    for version in ("v1", "v1", "v1"):  # its write has not come back yet
        _poll(memo, 1, version)
        clock.now += 1
    assert calls == [1000.0]
    _poll(memo, 1, "v2")  # back; but the 5 s are not over
    assert calls == [1000.0]
    clock.now = 1005.0
    _poll(memo, 1, "v2")
    assert calls == [1000.0, 1005.0]
    _poll(memo, 2, "v3")  # a new spec: at once
    assert calls == [1000.0, 1005.0, 1005.0]
    _poll(memo, 3, "v4", deletionTimestamp="2026-12-04T00:00:00Z")  # the cleanup's now
    assert len(calls) == 3


def test_a_stalled_rollout_is_not_reconciled_again_until_its_spec_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, calls = Clock(), []

    def reconcile(**_: Any) -> None:
        calls.append(clock.now)
        raise kopf.PermanentError("spec.targetRef: no such container")

    monkeypatch.setattr(handlers.time, "monotonic", clock)
    monkeypatch.setattr(handlers, "reconcile", reconcile)
    memo = kopf.Memo()
    _poll(memo, 1, "v1")
    clock.now += 3600
    _poll(memo, 1, "v1")
    assert len(calls) == 1
    _poll(memo, 2, "v2")
    assert len(calls) == 2


def test_the_cleanup_waits_for_a_reconcile_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a reconcile in flight (say, about to patch the Deployment)
    inside, release, order = threading.Event(), threading.Event(), []

    def reconcile(**_: Any) -> None:
        inside.set()
        release.wait(10)
        order.append("reconcile done")

    def clean_up(*_: Any) -> None:
        order.append("cleanup")

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(handlers, "_clean_up", clean_up)
    memo = kopf.Memo()
    poller = threading.Thread(target=_poll, args=(memo, 1, "v1"))
    poller.start()
    assert inside.wait(10)
    # WHEN the rollout is deleted meanwhile
    body = kopf.Body({"metadata": {"name": "r", "namespace": "ns"}})
    deleting = threading.Thread(
        target=handlers.cleanup,
        kwargs={"body": body, "meta": body.metadata, "memo": memo,
                "logger": handlers.logging.getLogger("test"), "retry": 0},
    )  # fmt: skip
    deleting.start()
    deleting.join(0.3)
    # THEN the cleanup starts only after the reconcile ended
    assert order == []
    release.set()
    poller.join(10)
    deleting.join(10)
    assert order == ["reconcile done", "cleanup"]


def test_kopfs_tick_lines_are_dropped_and_nothing_else() -> None:
    quiet = handlers.QuietTicks()

    def record(msg: str) -> handlers.logging.LogRecord:
        return handlers.logging.LogRecord("kopf.objects", 20, "", 0, msg, None, None)

    assert not quiet.filter(record("Timer 'poll' succeeded."))
    assert quiet.filter(record("Timer 'drift' succeeded."))
    assert quiet.filter(record("Preflight: sampling the pool"))


def test_a_poll_that_waited_for_the_cleanup_does_not_reconcile_the_deleted_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(handlers, "reconcile", lambda **_: calls.append("reconcile"))
    memo = kopf.Memo()
    raw: dict[str, Any] = {"metadata": {"name": "r", "namespace": "ns", "generation": 1,
                                        "resourceVersion": "v1"}}  # fmt: skip
    body = kopf.Body(raw)  # a timer's body is a live view of the object
    lock = schedule_of(memo).lock
    lock.acquire()  # the cleanup runs
    poller = threading.Thread(
        target=handlers.poll,
        kwargs={"body": body, "meta": body.metadata, "patch": kopf.Patch(), "memo": memo,
                "logger": handlers.logging.getLogger("test")},
    )  # fmt: skip
    poller.start()
    poller.join(0.3)
    raw["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"  # the watch brings it
    lock.release()
    poller.join(10)
    assert calls == []
