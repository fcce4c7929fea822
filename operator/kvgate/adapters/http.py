"""Read an engine's `/metrics` (or any text endpoint) over HTTP; httpx errors -> ScrapeError.

Pass a `client` to reuse connections or, in tests, an `httpx.Client(transport=MockTransport(...))`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import httpx

from kvgate.errors import ScrapeError, SpecError
from kvgate.evidence.metrics import MetricSnapshot, parse_metrics
from kvgate.redact import scrub_text

DEFAULT_TIMEOUT: Final = 5.0
# A vLLM /metrics body is tens to hundreds of KiB; 4 MiB leaves room for many models/replicas.
MAX_BODY_BYTES: Final = 4 << 20
MAX_INTERVAL: Final = 86400.0
# The watchdog fires this long after the timeout, so a silent server trips httpx's own read
# timeout first (and is reported as such).
_WATCHDOG_GRACE: Final = 0.1

# Owned clients ignore HTTP(S)_PROXY: pod IPs are scraped directly.
# httpx logs one INFO line per request; at scrape rate that drowns the operator's log.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def _shown(url: str) -> str:
    """The URL as messages show it: no user:password@ and no query (either may hold a secret)."""
    try:
        parsed = httpx.URL(url)
        shown = str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
    except (httpx.InvalidURL, TypeError, ValueError):
        return scrub_text(url)
    return shown + ("?<query not shown>" if parsed.query else "")


def _check_url(url: str) -> None:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        if not url.isprintable():  # a credential split by a line break escapes scrub_text
            raise SpecError("url", "the URL holds a control character or a line break") from None
        raise SpecError("url", scrub_text(f"'{url}' is not a valid URL: {exc}")) from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise SpecError(
            "url", f"'{_shown(url)}' is not an http(s) URL; use e.g. http://10.0.0.5:8000/metrics"
        )


class _Watchdog:
    """Shuts the request's socket down at the deadline.

    httpx's timeouts bound each read, not the request: a server that sends its headers or body
    a byte at a time never trips them. The TCP socket is taken from httpcore's trace event when
    it connects (the request says `Connection: close`, so it is never a pooled one), and a timer
    shuts it down, which wakes the blocked read.
    """

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            self._socket = sock if isinstance(sock, socket.socket) else None
            if self.fired:
                self._shutdown()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):  # already closed
                self._socket.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def scrape(
    url: str,
    *,
    client: httpx.Client | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = MAX_BODY_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """GET `url` and return the body; any failure or non-2xx status is a ScrapeError.

    `timeout` bounds the whole request (connect, headers and body), not each read, and the
    body is streamed and refused past `max_bytes`: a server that trickles bytes or sends an
    endless body cannot hold the caller.
    """
    _check_url(url)
    shown = _shown(url)
    if not (math.isfinite(timeout) and timeout > 0):
        raise SpecError("timeout", f"{timeout} must be a finite number of seconds above 0")
    own = client is None
    http = client if client is not None else httpx.Client(trust_env=False)
    deadline = clock() + timeout
    watchdog = _Watchdog(timeout + _WATCHDOG_GRACE)
    # One sentence whichever fires first (httpx's read timeout or the watchdog, which wins on a
    # busy machine); the exception that fired stays the cause.
    late = f"no complete answer within {timeout:g} s"
    try:
        with http.stream(
            "GET",
            url,
            timeout=timeout,
            headers={"Connection": "close"},
            extensions={"trace": watchdog.trace},
        ) as response:
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > max_bytes:
                    raise ScrapeError(
                        shown,
                        f"body is larger than {max_bytes >> 20} MiB; not an engine's /metrics",
                    )
                if clock() > deadline:
                    raise ScrapeError(
                        shown, f"body not complete within {timeout:g} s ({len(body):,} bytes read)"
                    )
            if watchdog.fired:  # a body read to EOF after the shutdown is cut, not whole
                raise ScrapeError(shown, late)
            try:
                return body.decode(response.charset_encoding or "utf-8", errors="replace")
            except LookupError:  # a charset Python does not know
                return body.decode("utf-8", errors="replace")
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        message = f"HTTP {status} {exc.response.reason_phrase}".rstrip()
        if status == 404 and httpx.URL(url).path.endswith("/metrics"):
            message += " (SGLang serves /metrics only with --enable-metrics)"
        raise ScrapeError(shown, message, status) from exc
    except httpx.TimeoutException as exc:  # a silent server: the read timed out first
        raise ScrapeError(shown, late) from exc
    except httpx.HTTPError as exc:
        if watchdog.fired:  # the watchdog cut a trickling answer
            raise ScrapeError(shown, late) from exc
        raise ScrapeError(shown, scrub_text(f"{type(exc).__name__}: {_first_line(exc)}")) from exc
    finally:
        watchdog.cancel()
        if own:
            http.close()


def _first_line(exc: BaseException) -> str:
    """The error's first line, cut short: never a request echo or a body."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def scrape_snapshot(
    url: str,
    *,
    engine: str | None = None,
    client: httpx.Client | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
) -> MetricSnapshot:
    """Scrape and parse one `/metrics`, stamped with `clock()` for rates."""
    taken_at = clock()
    return parse_metrics(
        scrape(url, client=client, timeout=timeout), engine, source=_shown(url), taken_at=taken_at
    )


def scrape_series(
    url: str,
    interval: float,
    samples: int,
    sleep: Callable[[float], None] = time.sleep,
    *,
    engine: str | None = None,
    client: httpx.Client | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
    on_sample: Callable[[int, MetricSnapshot], None] | None = None,
    on_failure: Callable[[int, ScrapeError], None] | None = None,
) -> list[MetricSnapshot]:
    """`samples` snapshots `interval` seconds apart (one connection; no sleep after the last).

    `on_sample(n, snapshot)` is called after each one (n counts from 1), e.g. for progress.
    With `on_failure`, a sample that cannot be read once one has been is passed to it and left
    out, so a server that goes away mid-window keeps the samples already taken; a first sample
    that fails always raises (a wrong URL should not wait out the window).
    """
    if samples < 1:
        raise SpecError("samples", f"{samples} is below 1")
    if not (math.isfinite(interval) and 0 <= interval <= MAX_INTERVAL):
        raise SpecError("interval", f"{interval:g} is not in [0, {MAX_INTERVAL:g}] seconds")
    _check_url(url)
    own = client is None
    http = client if client is not None else httpx.Client(trust_env=False)
    try:
        series: list[MetricSnapshot] = []
        for index in range(samples):
            if index:
                sleep(interval)
            try:
                snapshot = scrape_snapshot(
                    url, engine=engine, client=http, timeout=timeout, clock=clock
                )
            except ScrapeError as exc:
                if on_failure is None or not series:
                    raise
                on_failure(index + 1, exc)
                continue
            series.append(snapshot)
            if on_sample is not None:
                on_sample(index + 1, snapshot)
        return series
    finally:
        if own:
            http.close()
