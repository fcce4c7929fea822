"""`kvgate preflight` against a hub that trickles or echoes (issue 25, the CLI's last two).

1. An overall deadline on every hub answer: huggingface_hub's client has no timeout of its own,
   and a per-read timeout never trips on a server sending a byte a second. The bound asserted is
   the deadline plus slack for 2 loaded cores, not a benchmark (as test_scrape_slowloris).
2. No secret in any message: hub tokens holding line breaks, quotes and control characters go
   through every error path the CLI has for them (refused value, private repo, a hub that
   echoes the Authorization header back, an unreachable hub, a token given as the name).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import string
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hubserver import FakeHub, write_checkpoint
from huggingface_hub import constants
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvgate import cli

pytestmark = pytest.mark.integration

SLACK = 4.0
REPO = "kvgate-test/private"
QWEN3_8B = Path(__file__).resolve().parents[1] / "data" / "configs" / "qwen3-8b.json"
MODEL_INFO = json.dumps({"id": REPO, "sha": "a" * 40, "siblings": [{"rfilename": "config.json"}]})


@pytest.fixture(autouse=True)
def online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def point_hub(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """HF_ENDPOINT as huggingface_hub reads it at import time, for the in-process CLI."""
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- 1. deadlines ---------------------------------------------------------------------------------


@contextlib.contextmanager
def trickling_hub(head: bytes, script: bytes, gap: float) -> Iterator[tuple[str, list[int]]]:
    """Every connection: read the request, send `head` at once, then `script` a byte every
    `gap` seconds (repeating it) until the client hangs up; `script` empty: stay silent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    sent = [0]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(head)
                while not stop.is_set():
                    for i in range(len(script)):
                        conn.sendall(script[i : i + 1])
                        sent[0] += 1
                        if stop.wait(gap):
                            return
                    if not script:
                        stop.wait(0.2)
            except OSError:  # the client shut the connection down
                return

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", sent
    finally:
        stop.set()
        thread.join(5)
        listener.close()


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
CASES = {
    # the model info's body at 1 byte/s (the case)
    "body": (OK_HEAD + f"Content-Length: {len(MODEL_INFO)}\r\n\r\n".encode(), MODEL_INFO.encode(), 1.0),
    # the status line and headers a byte at a time, faster than any read timeout
    "headers": (b"", OK_HEAD + b"X-Slow: " + b"a" * 4096, 0.05),
    # accepts, then nothing
    "silent": (b"", b"", 0.0),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_trickling_hub_fails_preflight_at_its_deadline_in_one_line(
    case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    head, script, gap = CASES[case]
    with trickling_hub(head, script, gap) as (endpoint, sent):
        point_hub(monkeypatch, endpoint)
        start = time.monotonic()
        code, out, err = run_cli(capsys, "preflight", REPO, "--timeout", "2")
        took = time.monotonic() - start
    assert took < 2 + SLACK, f"preflight took {took:.1f} s with a 2 s deadline"
    assert code == cli.EXIT_EXTERNAL and out == ""
    assert err.count("\n") == 1, err
    assert err == (
        f"kvgate preflight: error: {REPO}@main: no complete answer from the hub within 2 s "
        "(too slow, or trickling)\n"
    )
    if script:
        assert sent[0] >= 1  # it was trickling, not silent


def test_the_deadline_is_per_call_and_a_sound_hub_still_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "repo"
    write_checkpoint(directory, layers=4, shards=2, config=json.loads(QWEN3_8B.read_text()))
    with FakeHub() as hub:
        hub.add_repo(REPO, directory)
        point_hub(monkeypatch, hub.endpoint)
        for _ in range(2):  # the second call reuses pooled connections: a fresh deadline
            code, out, err = run_cli(capsys, "preflight", REPO, "--timeout", "5", "--json")
            assert (code, err) == (0, ""), err
            assert json.loads(out)["commit"] == hub.repos[REPO].sha


def test_a_bad_timeout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "1e9"):
        code, _, err = run_cli(capsys, "preflight", REPO, "--timeout", bad)
        assert code == cli.EXIT_INPUT and "--timeout" in err, err


# --- 2. no secret in any message ------------------------------------------------------------------


class _Echo(BaseHTTPRequestHandler):
    """A hub that puts the request's Authorization header into its error (a hostile mirror)."""

    def do_GET(self) -> None:
        body = json.dumps({"error": f"bad token {self.headers.get('authorization')}"}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", repr(self.headers.get("authorization"))[:200])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo_hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def private_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("private") / "repo"
    write_checkpoint(directory, layers=2, shards=1, config=json.loads(QWEN3_8B.read_text()))
    with FakeHub() as hub:
        hub.add_repo(REPO, directory, token="the-right-token-0123456789")
        yield hub.endpoint


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


MARK = st.text(alphabet=string.ascii_letters + string.digits, min_size=10, max_size=16)
# no NUL: the environment cannot hold one
NASTY = st.text(alphabet="\n\r\t \"'\\`$;\x01\x07\x1b\x7f\u2028\u00e9<>{}", min_size=0, max_size=6)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(first=MARK, middle=NASTY, last=MARK)
# found by CI's hypothesis: a token that is also a valid upper-case variable name
@example(first="A000000000", middle="", last="0000000000")
def test_no_cli_message_holds_the_token(
    first: str,
    middle: str,
    last: str,
    echo_hub: str,
    private_hub: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = first + middle + last
    variable = "KVGATE_TEST_HUB_TOKEN"
    os.environ[variable] = token
    try:
        runs = []
        for endpoint in (echo_hub, private_hub, _closed_port()):
            point_hub(monkeypatch, endpoint)
            runs.append(
                run_cli(capsys, "preflight", REPO, "--token-env", variable, "--timeout", "5")
            )
        # the token pasted where the variable's name goes
        runs.append(run_cli(capsys, "preflight", REPO, "--token-env", token, "--timeout", "5"))
        # no --token-env: huggingface_hub's own lookup finds HF_TOKEN
        os.environ["HF_TOKEN"] = token
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent")
        for endpoint in (echo_hub, private_hub):
            point_hub(monkeypatch, endpoint)
            runs.append(run_cli(capsys, "preflight", REPO, "--timeout", "5"))
    finally:
        del os.environ[variable]
        os.environ.pop("HF_TOKEN", None)
    for code, out, err in runs:
        assert code in (cli.EXIT_INPUT, cli.EXIT_EXTERNAL), (code, err)
        assert err.startswith("kvgate preflight: error: ") and err.count("\n") == 1, err
        for part in (first, last):
            assert part not in out + err, f"the token shows in: {err!r}"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(first=MARK, middle=NASTY, last=MARK)
def test_no_scrape_message_holds_a_url_credential(
    first: str, middle: str, last: str, capsys: pytest.CaptureFixture[str]
) -> None:
    password = first + middle + last
    closed = _closed_port().removeprefix("http://")
    for url in (f"http://admin:{password}@{closed}/metrics",
                f"http://{closed}/metrics?token={password}"):  # fmt: skip
        code, out, err = run_cli(capsys, "scrape", url, "--timeout", "2")
        assert code in (cli.EXIT_INPUT, cli.EXIT_EXTERNAL), (code, err)
        assert err.startswith("kvgate scrape: error: ") and err.count("\n") == 1, err
        for part in (first, last):
            assert part not in out + err, f"the credential shows in: {err!r}"
