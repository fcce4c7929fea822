"""Read an engine's `/metrics` (or any text endpoint) over HTTP; httpx errors -> ScrapeError.

Pass a `client` to reuse connections or, in tests, an `httpx.Client(transport=MockTransport(...))`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Final

import httpx

from kvgate.errors import ScrapeError, SpecError
from kvgate.metrics import MetricSnapshot, parse_metrics

DEFAULT_TIMEOUT: Final = 5.0
# A vLLM /metrics body is tens to hundreds of KiB; 4 MiB leaves room for many models/replicas.
MAX_BODY_BYTES: Final = 4 << 20
MAX_INTERVAL: Final = 86400.0

# Owned clients ignore HTTP(S)_PROXY: pod IPs are scraped directly.
# httpx logs one INFO line per request; at scrape rate that drowns the operator's log.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def _check_url(url: str) -> None:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise SpecError("url", f"'{url}' is not a valid URL: {exc}") from exc
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise SpecError(
            "url", f"'{url}' is not an http(s) URL; use e.g. http://10.0.0.5:8000/metrics"
        )


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
    if not (math.isfinite(timeout) and timeout > 0):
        raise SpecError("timeout", f"{timeout} must be a finite number of seconds above 0")
    own = client is None
    http = client if client is not None else httpx.Client(trust_env=False)
    deadline = clock() + timeout
    try:
        with http.stream("GET", url, timeout=timeout) as response:
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > max_bytes:
                    raise ScrapeError(
                        url, f"body is larger than {max_bytes >> 20} MiB; not an engine's /metrics"
                    )
                if clock() > deadline:
                    raise ScrapeError(
                        url, f"body not complete within {timeout:g} s ({len(body):,} bytes read)"
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
        raise ScrapeError(url, message) from exc
    except httpx.TimeoutException as exc:
        raise ScrapeError(url, f"no answer within {timeout:g} s ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise ScrapeError(url, f"{type(exc).__name__}: {_first_line(exc)}") from exc
    finally:
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
        scrape(url, client=client, timeout=timeout), engine, source=url, taken_at=taken_at
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
) -> list[MetricSnapshot]:
    """`samples` snapshots `interval` seconds apart (one connection; no sleep after the last)."""
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
            series.append(
                scrape_snapshot(url, engine=engine, client=http, timeout=timeout, clock=clock)
            )
        return series
    finally:
        if own:
            http.close()
