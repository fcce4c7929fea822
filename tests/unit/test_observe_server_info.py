"""sources.server_info: SGLang's KV dtype from /server_info (0.5.6+), else /get_server_info."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kvgate.adapters import http as http_adapter
from kvgate.controller import sources
from kvgate.errors import ParseError, ScrapeError

Handler = Callable[[httpx.Request], httpx.Response]
REAL_CLIENT = httpx.Client


def _server_info(ip: str) -> dict[str, object]:
    return sources.server_info(ip, port=30000, timeout=2.0)


def _serve(monkeypatch: pytest.MonkeyPatch, handler: Handler) -> list[str]:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return handler(request)

    def client(**kwargs: Any) -> httpx.Client:
        return REAL_CLIENT(transport=httpx.MockTransport(record), **kwargs)

    monkeypatch.setattr(http_adapter.httpx, "Client", client)
    return seen


def test_reads_server_info(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"kv_cache_dtype": "fp8_e4m3", "max_total_num_tokens": 454112, "version": "0.5.23"}
    seen = _serve(monkeypatch, lambda r: httpx.Response(200, json=body))
    assert _server_info("10.0.0.5") == {
        "kvCacheDtype": "fp8_e4m3",
        "maxTotalNumTokens": 454112,
    }
    assert seen == ["/server_info"]  # not the deprecated alias, which warns on every call


def test_falls_back_to_server_info_then_reports_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    def only_old(request: httpx.Request) -> httpx.Response:  # SGLang before 0.5.6
        if request.url.path == "/get_server_info":
            return httpx.Response(200, text=json.dumps({"kv_cache_dtype": "auto"}))
        return httpx.Response(404)

    seen = _serve(monkeypatch, only_old)
    assert _server_info("10.0.0.5") == {"kvCacheDtype": "auto"}
    assert seen == ["/server_info", "/get_server_info"]
    _serve(monkeypatch, lambda r: httpx.Response(404))
    absent = _server_info("10.0.0.5")
    assert absent == {"absent": "HTTP 404 on /server_info and /get_server_info"}


def test_other_failures_are_errors_not_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    _serve(monkeypatch, lambda r: httpx.Response(503))
    with pytest.raises(ScrapeError, match="HTTP 503") as exc:
        _server_info("10.0.0.5")
    assert exc.value.status == 503
    _serve(monkeypatch, lambda r: httpx.Response(200, text="<html>login</html>"))
    with pytest.raises(ParseError, match="/server_info: not JSON"):
        _server_info("10.0.0.5")
