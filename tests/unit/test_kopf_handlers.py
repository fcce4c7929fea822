"""What kvgate registers with kopf, and what kopf may store on a rollout because of it.

kvgate keeps no diff base (`handlers.NoDiffBase`): that is sound only while no handler reacts
to a change of the object (create, update, resume, field). A change that adds one must bring
the diff base back; this test says so before a rollout can be handled twice or never."""

from __future__ import annotations

import kopf
import pytest
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


def test_kopf_gets_a_bounded_pool_unless_a_glob_may_add_watch_streams() -> None:
    from kvgate.commands.run import WRITE_CONNECTIONS, api_connections

    # one stream per namespace (and kopf's namespaces watch), plus the writes' share
    assert api_connections(["llm"], clusterwide=False) == WRITE_CONNECTIONS + 2
    assert api_connections(["a", "b", "c"], clusterwide=False) == WRITE_CONNECTIONS + 4
    assert api_connections([], clusterwide=True) == WRITE_CONNECTIONS + 1
    # a pattern may match any number of namespaces: no bound, as kopf's own session
    for pattern in ("llm-*", "team?", "!kube-system", "a,b"):
        assert api_connections([pattern], clusterwide=False) == 0, pattern


def test_the_login_hands_kopf_a_session_with_that_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import logging

    info = kopf.ConnectionInfo(server="https://127.0.0.1:6443", token="t", default_namespace="ns")
    monkeypatch.setattr(kopf, "login_via_client", lambda **_: info)

    async def session_limit(memo: kopf.Memo) -> tuple[int, str, str | None]:
        got = await handlers.login(logger=logging.getLogger("t"), settings=kopf.OperatorSettings(),
                                   memo=memo)  # fmt: skip
        assert isinstance(got, kopf.AiohttpSession)
        try:
            assert got.aiohttp_session.headers["Authorization"] == "Bearer t"  # kopf's headers
            return got.aiohttp_session.connector.limit, got.server, got.default_namespace  # type: ignore[union-attr]
        finally:
            await got.aiohttp_session.close()

    assert asyncio.run(session_limit(kopf.Memo(api_connections=10))) == (
        10, "https://127.0.0.1:6443", "ns",
    )  # fmt: skip
    assert asyncio.run(session_limit(kopf.Memo()))[0] == 0  # `kopf run -m`: kopf's unbounded pool
