"""The /metrics scrape gives up at its deadline when a loopback server trickles its answer a
byte at a time (slowloris): httpx's timeouts are per read, so each byte would reset them.

Without the overall deadline these took minutes to hours (h11 reads up to 16 KiB of headers, one byte
per gap); the bound below is the 1 s timeout plus slack for 2 loaded cores, not a benchmark.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvgate.adapters.http import scrape
from kvgate.errors import ScrapeError

# Seconds past the timeout that still count as "gave up at the deadline": a cut took 5.3 s at
# load average 15 under `nice 19`, and without the deadline each case runs 40 s or forever.
SLACK = 9.0
BODY = b"vllm:kv_cache_usage_perc 0.5\n"
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


@contextmanager
def _server(script: bytes, gap: float, head: bytes = b"") -> Iterator[tuple[str, list[int]]]:
    """Accept one connection, read the request, send `head` at once, then `script` one byte
    every `gap` seconds (repeating it, for an endless answer) until the client hangs up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sent = [0]
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(head)
                while not stop.is_set():
                    for i in range(len(script)):
                        conn.sendall(script[i : i + 1])
                        sent[0] += 1
                        if stop.wait(gap):
                            return
            except OSError:  # the client shut the connection down
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", sent
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _timed_scrape(url: str, timeout: float) -> tuple[float, str]:
    start = time.monotonic()
    with pytest.raises(ScrapeError) as caught:
        scrape(url, timeout=timeout)
    return time.monotonic() - start, str(caught.value)


@pytest.mark.parametrize("gap", [0.05, 0.6])  # 0.6 s: each byte just inside the read timeout
def test_headers_a_byte_at_a_time(gap: float) -> None:
    endless_header = b"X-Slow: " + b"a" * 64 + b"\r\n"
    with _server(endless_header, gap, head=OK_HEAD) as (url, sent):
        took, message = _timed_scrape(url, timeout=1.0)
    assert took < 1.0 + SLACK, f"scrape took {took:.2f} s with a 1 s timeout"
    assert "within 1 s" in message and message.startswith(url)
    assert sent[0] >= 1  # the server was trickling, not silent


def test_status_line_a_byte_at_a_time() -> None:
    with _server(OK_HEAD + b"Content-Length: 29\r\n\r\n" + BODY, 0.7) as (url, _):
        took, message = _timed_scrape(url, timeout=1.0)
    assert took < 1.0 + SLACK and "within 1 s" in message


@pytest.mark.parametrize("length", [True, False])
def test_body_a_byte_at_a_time(length: bool) -> None:
    # Without Content-Length the body ends at EOF: the shutdown must not pass for a whole body.
    head = OK_HEAD + (b"Content-Length: 100000\r\n" if length else b"Connection: close\r\n")
    with _server(BODY, 0.6, head=head + b"\r\n") as (url, sent):
        took, message = _timed_scrape(url, timeout=1.0)
    assert took < 1.0 + SLACK and "within 1 s" in message
    assert sent[0] >= 1


def test_a_prompt_server_is_still_read() -> None:
    answer = OK_HEAD + b"Content-Length: 29\r\n\r\n" + BODY
    with _server(answer, 0.0) as (url, _):
        assert scrape(url, timeout=2.0) == BODY.decode()


def test_a_tls_handshake_a_byte_at_a_time() -> None:
    # A handshake record that announces 16 KiB and then trickles, each byte within a read
    # timeout: the handshake is one operation under the time left (CPython's ssl keeps one
    # deadline across its reads), so it ends by the call's deadline too.
    record_head = b"\x16\x03\x03\x40\x00"
    with _server(b"\x02", 0.2, head=record_head) as (url, sent):
        took, message = _timed_scrape(url.replace("http://", "https://"), timeout=1.0)
    assert took < 1.0 + SLACK, f"the handshake took {took:.2f} s with a 1 s timeout"
    assert "within 1 s" in message
    assert sent[0] >= 1  # the server was trickling, not silent
