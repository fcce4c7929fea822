"""The divergence screen holds at most its bound of an arm's reply, whatever the arm sends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from kvgate.commands import diverge
from kvgate.errors import EvalError

BOUND = 64 << 10
HUGE = 64 << 20  # more than loopback's socket buffers can hold for an idle reader


class _Flood(BaseHTTPRequestHandler):
    sent = 0
    status = 200

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(type(self).status)
        self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        chunk = b"x" * (1 << 16)
        try:
            for _ in range(HUGE // len(chunk)):
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:
            pass  # the client stopped reading and closed: what the bound promises

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flood() -> Iterator[str]:
    _Flood.sent = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1/completions"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status", [200, 500])
def test_a_flooding_arm_is_refused_before_its_body_is_read_whole(
    flood: str, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diverge, "_MAX_BODY", BOUND)
    monkeypatch.setattr(_Flood, "status", status)
    with httpx.Client(timeout=30, trust_env=False) as client:
        arm = diverge._Arm(client, "candidate", flood, "m")
        with pytest.raises(EvalError) as info:
            arm.echo("one two three", 1)
    text = str(info.value)
    if status == 200:
        assert text == f"candidate: response over {BOUND} bytes"
    else:
        assert text.startswith(f"candidate endpoint {flood}: HTTP 500: xxx")
        assert len(text) < 400  # the error quotes at most 300 bytes of the body
    assert _Flood.sent < HUGE // 2, f"the arm sent {_Flood.sent} bytes before the client stopped"


def test_a_reply_within_the_bound_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    reply = {"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": [None],
                                       "top_logprobs": [None]}}],
             "usage": {"prompt_tokens": 1}}  # fmt: skip
    body = json.dumps(reply).encode()

    class _One(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _One)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/completions"
        with httpx.Client(timeout=30, trust_env=False) as client:
            doc, prompt_tokens = diverge._Arm(client, "control", url, "m").echo("a", 1)
    finally:
        server.shutdown()
        server.server_close()
    assert prompt_tokens == 1 and len(doc.tokens) == 1
