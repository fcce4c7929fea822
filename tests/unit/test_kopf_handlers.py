"""What kvgate registers with kopf, and what kopf may store on a rollout because of it.

kvgate keeps no diff base (`handlers.NoDiffBase`): that is sound only while no handler reacts
to a change of the object (create, update, resume, field). A change that adds one must bring
the diff base back; this test says so before a rollout can be handled twice or never."""

from __future__ import annotations

import kopf
from kopf._core.intents import causes

from kvgate.controller import handlers


def test_no_handler_needs_the_last_handled_configuration() -> None:
    registry = kopf.get_default_registry()
    changing = list(registry._changing.get_all_handlers())
    # only deletion (by deletionTimestamp, which needs no diff) and nothing on fields
    assert [(h.id, h.reason) for h in changing] == [("cleanup", causes.Reason.DELETE)]
    assert all(h.field is None for h in changing)
    # the rollouts are driven by timers, which read the spec as it is
    assert sorted(h.id for h in registry._spawning.get_all_handlers()) == ["drift", "poll"]


def test_the_diff_base_is_never_stored_nor_read() -> None:
    body = kopf.Body({"metadata": {"name": "r", "annotations": {}}, "spec": {"model": "m"}})
    patch = kopf.Patch()
    storage = handlers.NoDiffBase()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    assert patch == {} and storage.fetch(body=body) is None
