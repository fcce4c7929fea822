"""Read an engine's `/metrics` (or any text endpoint) over HTTP; httpx errors -> ScrapeError.

Pass a `client` to reuse connections or, in tests, an `httpx.Client(transport=MockTransport(...))`.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Final

import httpcore
import httpx

from kvgate.errors import ScrapeError, SpecError
from kvgate.evidence.metrics import MetricSnapshot, parse_metrics
from kvgate.redact import scrub_text

DEFAULT_TIMEOUT: Final = 5.0
# A vLLM /metrics body is tens to hundreds of KiB; 4 MiB leaves room for many models/replicas.
MAX_BODY_BYTES: Final = 4 << 20
MAX_INTERVAL: Final = 86400.0
# The sockets' deadline is this long after the timeout, so a body trickling in is cut by the
# check between its chunks (and is reported as such) before a read is.
_DEADLINE_GRACE: Final = 0.1

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


# --- an overall deadline on a client's sockets ----------------------------------------------
# httpx's timeouts bound each read, not the request: a server that sends its headers or body a
# byte at a time never trips them (and huggingface_hub's client has no timeout at all). Within
# `deadline(at)`, every socket operation of a client put on `bounded_sockets` gets a timeout cut
# to what is left, and past `at` raises its library's own timeout error (hence `errors`: httpcore
# under httpx, httpcore2 under huggingface_hub's httpx2), so the whole call ends by `at`.

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "kvgate_http_deadline", default=None
)


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """The socket timeout for one read, write or connect: never past the caller's deadline."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the overall deadline passed")
    return left if timeout is None else min(timeout, left)


class _Deadlined:
    """httpcore's network stream or backend, wrapped: what the wrapper does not bound (close,
    get_extra_info, sleep) is the inner object's."""

    def __init__(self, inner: Any, errors: ModuleType) -> None:
        self._inner, self._errors = inner, errors

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _DeadlineStream(_Deadlined):
    """A socket stream whose every operation ends by the deadline of the call using it."""

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data: bytes = self._inner.read(max_bytes, _left(timeout, self._errors.ReadTimeout))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, self._errors.WriteTimeout))

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _DeadlineStream:
        late = self._errors.ConnectTimeout
        inner = self._inner.start_tls(ssl_context, server_hostname, _left(timeout, late))
        return _DeadlineStream(inner, self._errors)


class _DeadlineBackend(_Deadlined):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> _DeadlineStream:
        late = self._errors.ConnectTimeout
        stream = self._inner.connect_tcp(
            host, port, _left(timeout, late), local_address, socket_options
        )
        return _DeadlineStream(stream, self._errors)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> _DeadlineStream:
        late = self._errors.ConnectTimeout
        stream = self._inner.connect_unix_socket(path, _left(timeout, late), socket_options)
        return _DeadlineStream(stream, self._errors)


def bounded_sockets(client: Any, errors: ModuleType) -> None:
    """Put the client's connection pools (direct and proxied) on deadline-bound sockets; a
    client on another transport (a test's MockTransport) is left as it is."""
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        pool: Any = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(backend, errors)


@contextmanager
def deadline(at: float) -> Iterator[None]:
    """Every bounded socket operation of this call (and of the tasks it copies its context
    into) ends by the monotonic time `at`."""
    reset = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(reset)


def scrape(
    url: str,
    *,
    client: httpx.Client | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = MAX_BODY_BYTES,
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
    bounded_sockets(http, httpcore)
    ends = time.monotonic() + timeout
    try:
        # `Connection: close`: a fresh socket, made under this call's deadline
        with (
            deadline(time.monotonic() + timeout + _DEADLINE_GRACE),
            http.stream("GET", url, timeout=timeout, headers={"Connection": "close"}) as response,
        ):
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > max_bytes:
                    raise ScrapeError(
                        shown,
                        f"body is larger than {max_bytes >> 20} MiB; not an engine's /metrics",
                    )
                if time.monotonic() > ends:
                    raise ScrapeError(
                        shown, f"body not complete within {timeout:g} s ({len(body):,} bytes read)"
                    )
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
    except httpx.TimeoutException as exc:  # silent (a read timed out), or past the deadline
        raise ScrapeError(shown, f"no complete answer within {timeout:g} s") from exc
    except httpx.HTTPError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]  # not a request echo
        raise ScrapeError(shown, scrub_text(f"{type(exc).__name__}: {first}")) from exc
    finally:
        if own:
            http.close()


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
    """`samples` snapshots `interval` seconds apart (no sleep after the last).

    `on_sample(n, snapshot)` is called after each one (n counts from 1), e.g. for progress.
    With `on_failure`, a sample that cannot be read once one has been is passed to it and left
    out, so a server that goes away mid-window keeps the samples already taken; a first sample
    that fails always raises (a wrong URL should not wait out the window).
    """
    if samples < 1:
        raise SpecError("samples", f"{samples} is below 1")
    if not (math.isfinite(interval) and 0 <= interval <= MAX_INTERVAL):
        raise SpecError("interval", f"{interval:g} is not in [0, {MAX_INTERVAL:g}] seconds")
    series: list[MetricSnapshot] = []
    for index in range(samples):
        if index:
            sleep(interval)
        try:
            snapshot = scrape_snapshot(
                url, engine=engine, client=client, timeout=timeout, clock=clock
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
