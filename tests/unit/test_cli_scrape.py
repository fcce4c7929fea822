"""`kvgate scrape` through kvgate.cli.main, with httpx.MockTransport instead of a socket."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from kvgate.adapters import http as http_adapter
from kvgate.cli import main
from kvgate.commands import scrape as scrape_command

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"
URL = "http://canary.test:8000/metrics"

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Handler], list[httpx.Request]]]:
    """Route the adapter's own httpx.Client through a handler; returns the requests seen."""
    real_client = httpx.Client

    def install(handler: Handler) -> list[httpx.Request]:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        def client(**kwargs: object) -> httpx.Client:
            return real_client(transport=httpx.MockTransport(record), **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(http_adapter.httpx, "Client", client)
        return seen

    yield install


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between samples, recorded instead of slept (the transport is a mock)."""
    seen: list[float] = []
    monkeypatch.setattr(scrape_command, "SLEEP", seen.append)
    return seen


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["scrape", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def fixture(name: str) -> Handler:
    text = (METRICS / name).read_text()
    return lambda request: httpx.Response(200, text=text)


def test_one_sample_is_inconclusive(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    seen = serve(fixture("vllm-0.33-dp2.txt"))
    code, out, err = run(capsys, URL, "--samples", "1")
    assert (code, err, len(seen)) == (3, "", 1)
    assert out.splitlines() == [
        f"{URL}: vllm",
        "  kv usage:        95.0% (vllm:kv_cache_usage_perc)",
        "  running/waiting: 124 / 12",
        "  preemptions:     7",
        "  kv cache dtype:  fp8",
        "  kv pool tokens:  57808",
        "pool: inconclusive",
        "  only 1 usable sample(s); at least 3 needed",
    ]


def test_the_defaults_take_enough_samples_for_a_verdict(
    capsys: pytest.CaptureFixture[str],
    serve: Callable[[Handler], list[httpx.Request]],
    sleeps: list[float],
) -> None:
    seen = serve(fixture("vllm-0.33-dp2.txt"))
    code, out, err = run(capsys, URL)  # as the README types it
    assert (code, err) == (0, "")  # stderr is not a terminal here: no progress lines
    assert len(seen) == scrape_command.DEFAULT_SAMPLES >= 3
    assert sleeps == [scrape_command.DEFAULT_INTERVAL] * (len(seen) - 1)
    assert "pool: pressured" in out.splitlines()


def test_series_gives_a_verdict(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    seen = serve(fixture("sglang-0.5.3-tp2.txt"))
    code, out, _ = run(capsys, URL, "--samples", "3", "--interval", "0", "--json")
    data = json.loads(out)
    assert (code, len(seen)) == (0, 3)
    assert data["url"] == URL
    assert data["snapshot"]["engine"] == "sglang"
    assert data["pool_pressure"]["pressured"] is True
    assert data["pool_pressure"]["samples"] == 3
    assert data["window"]["generation_tokens"] == 0.0


def test_roomy_pool_is_a_decided_no(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    serve(fixture("vllm-0.11.txt"))
    code, out, _ = run(capsys, URL, "--samples", "3", "--interval", "0")
    assert code == 0
    assert "pool: not pressured" in out.splitlines()


def test_a_server_lost_mid_window_keeps_the_samples_taken(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    # GIVEN a server that answers three samples, then goes away
    text = (METRICS / "sglang-0.5.3-tp2.txt").read_text()

    def answer(request: httpx.Request) -> httpx.Response:
        if len(seen) > 3:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, text=text)

    seen = serve(answer)
    # WHEN five samples are asked for
    code, out, _ = run(capsys, URL, "--samples", "5", "--interval", "0", "--json")
    # THEN the three read still judge the pool, and the two lost are named, not a crash
    data = json.loads(out)
    assert (code, len(seen)) == (0, 5)
    assert data["pool_pressure"]["samples"] == 3 and data["pool_pressure"]["pressured"] is True
    assert [f.split(":")[0] for f in data["failed_samples"]] == ["sample 4", "sample 5"]
    assert "Connection refused" in data["failed_samples"][0]
    # AND the stamps are wall-clock seconds, not a monotonic clock's
    assert data["snapshot"]["taken_at"] > 1.7e9


def test_too_few_samples_left_is_inconclusive_not_an_error(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    # GIVEN a server that answers once, then goes away
    text = (METRICS / "sglang-0.5.3-tp2.txt").read_text()

    def answer(request: httpx.Request) -> httpx.Response:
        if len(seen) > 1:
            return httpx.Response(503)
        return httpx.Response(200, text=text)

    seen = serve(answer)
    code, out, _ = run(capsys, URL, "--samples", "3", "--interval", "0")
    # THEN one sample cannot judge the pool: inconclusive, with what was lost listed
    assert code == 3
    assert "pool: inconclusive" in out
    assert "left out (2 sample(s) could not be read):" in out
    assert "HTTP 503" in out


def test_http_error_is_external(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    serve(lambda request: httpx.Response(503))
    code, out, err = run(capsys, URL)
    assert (code, out, err) == (
        4,
        "",
        f"kvgate scrape: error: {URL}: HTTP 503 Service Unavailable\n",
    )


def test_missing_metrics_route_names_the_sglang_flag(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    serve(lambda request: httpx.Response(404))
    code, _, err = run(capsys, URL)
    assert (code, err) == (
        4,
        f"kvgate scrape: error: {URL}: HTTP 404 Not Found "
        "(SGLang serves /metrics only with --enable-metrics)\n",
    )


def test_connection_error_is_external(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    serve(refuse)
    code, _, err = run(capsys, URL)
    assert (code, err) == (
        4,
        f"kvgate scrape: error: {URL}: ConnectError: [Errno 111] Connection refused\n",
    )


def test_garbage_is_input_error(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    serve(lambda request: httpx.Response(200, text="<html>login</html>\n"))
    code, _, err = run(capsys, URL)
    assert code == 2
    assert err == (
        f"kvgate scrape: error: {URL}:1: not Prometheus text format: "
        "invalid metric name:<html>login</html>\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ftp://x/metrics"], "kvgate scrape: error: url: 'ftp://x/metrics' is not an http(s) URL; use e.g. http://10.0.0.5:8000/metrics\n"),
        ([URL, "--samples", "0"], "kvgate scrape: error: argument --samples: 0 is outside [1, 100000]\n"),
        ([URL, "--interval", "-1"], "kvgate scrape: error: argument --interval: -1 is outside [0, 86400] s\n"),
        ([URL, "--timeout", "0"], "kvgate scrape: error: argument --timeout: 0 is outside (0, 3600] s\n"),
        ([URL, "--interval", "inf"], "kvgate scrape: error: argument --interval: 'inf' is not seconds (90) or a duration (90s, 5m, 1h30m)\n"),
        ([URL, "--timeout", "nan"], "kvgate scrape: error: argument --timeout: 'nan' is not seconds (90) or a duration (90s, 5m, 1h30m)\n"),
        ([URL, "--samples", "1" * 5000], "kvgate scrape: error: argument --samples: '1111111111111111111111111111111111111111' is not an integer\n"),
        ([URL, "--samples", "١٢"], "kvgate scrape: error: argument --samples: '١٢' is not an integer\n"),
        ([URL, "--engine", "tgi"], "kvgate scrape: error: engine 'tgi' is not known; use vllm, sglang or auto\n"),
        ([URL, "--usage-threshold", "2"], "kvgate scrape: error: argument --usage-threshold: 2 is outside (0, 1]: a fraction; write 0.02 or 2%\n"),
    ],
)  # fmt: skip
def test_bad_input(
    capsys: pytest.CaptureFixture[str],
    serve: Callable[[Handler], list[httpx.Request]],
    argv: list[str],
    message: str,
) -> None:
    serve(fixture("vllm-0.11.txt"))
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", message)


# -- hostile endpoints: a total deadline and a body cap ------------------------------------------


class _Trickle(httpx.SyncByteStream):
    """A body that arrives one byte every `delay` seconds (MockTransport would read it all)."""

    def __init__(self, delay: float, chunks: int) -> None:
        self.delay, self.chunks = delay, chunks

    def __iter__(self) -> Iterator[bytes]:
        import time

        for _ in range(self.chunks):
            time.sleep(self.delay)
            yield b"#"


class _TrickleTransport(httpx.BaseTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Trickle(0.2, 50), request=request)


def test_a_trickling_body_is_cut_at_the_total_deadline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    real_client = httpx.Client
    monkeypatch.setattr(
        http_adapter.httpx,
        "Client",
        lambda **kwargs: real_client(transport=_TrickleTransport(), **kwargs),
    )
    start = time.monotonic()  # 10 s in all, each byte well within the per-read timeout
    code, out, err = run(capsys, URL, "--timeout", "1")
    took = time.monotonic() - start
    assert (code, out) == (4, "")
    assert err.startswith(f"kvgate scrape: error: {URL}: body not complete within 1 s")
    assert err.count("\n") == 1 and took < 3


def test_an_endless_body_is_refused_at_the_cap(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * (1 << 20)

    serve(lambda request: httpx.Response(200, content=endless()))
    code, out, err = run(capsys, URL)
    assert (code, out) == (4, "")
    assert (
        err == f"kvgate scrape: error: {URL}: body is larger than 4 MiB; not an engine's /metrics\n"
    )


def test_an_unknown_charset_still_decodes(
    capsys: pytest.CaptureFixture[str], serve: Callable[[Handler], list[httpx.Request]]
) -> None:
    text = (METRICS / "vllm-0.11.txt").read_text()
    serve(
        lambda request: httpx.Response(
            200, content=text.encode(), headers={"content-type": "text/plain; charset=nope"}
        )
    )
    code, _out, err = run(capsys, URL, "--samples", "1")
    assert (code, err) == (3, "")


@pytest.mark.parametrize("value", ["1e308", "+Inf", "NaN"])
def test_json_output_never_holds_infinity(
    capsys: pytest.CaptureFixture[str],
    serve: Callable[[Handler], list[httpx.Request]],
    value: str,
) -> None:
    body = f"vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting {value}\n"
    serve(lambda request: httpx.Response(200, text=body))
    code, out, err = run(capsys, URL, "--json")
    assert "Infinity" not in out and "NaN" not in out
    assert code == 2 and err.startswith(
        f"kvgate scrape: error: {URL}: metric vllm:num_requests_waiting"
    )
