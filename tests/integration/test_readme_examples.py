"""The README's "Try the CLI" examples, run as typed, against the README's own exit-code table.

Both are parsed from README.md, so the test fails when the README and the CLI disagree: an
example whose exit code the table gives another meaning, an example with no expectation here,
a table row naming a command the CLI lacks.

Rules for what cannot run here (explicit, checked in `_skip_reason`):
- CLUSTER: `report`, `get`, `wait`, `approve`, `abort` and `run` with a rollout name read a
  cluster; skipped.
- HUB: `preflight` of a hub repo id (org/name, no such file) reads the Hugging Face Hub; skipped.
- ENDPOINTS: `eval` and `diverge` need two serving engines; skipped.
Stand-ins for what the example names but the reader has:
- a log file named in the example is a healthy vLLM startup log from tests/data/logs;
- a YAML file named in the example is examples/vllm-deployment.yaml;
- a file under examples/status/ is the repository's own;
- an http URL given to `scrape` is served by a loopback /metrics server (a vLLM dump from
  tests/data/metrics, pool full with requests waiting), and the waits between samples are
  recorded, not slept.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvgate import cli
from kvgate.commands import scrape as scrape_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Try the CLI"
STARTUP_LOG = ROOT / "tests" / "data" / "logs" / "vllm-0.11-bf16-ready.txt"
METRICS = ROOT / "tests" / "data" / "metrics" / "vllm-0.33-dp2.txt"
DEPLOYMENT = ROOT / "examples" / "vllm-deployment.yaml"

CLUSTER = {"report", "get", "wait", "approve", "abort", "run"}
ENDPOINTS = {"eval", "diverge"}

# What each runnable README example must answer, as words of the README table's cell for its
# command; the table then gives the exit code. A new example needs a line here or a rule above.
EXPECTED = {
    "kvgate check -f examples/vllm-deployment.yaml": "passed",
    "kvgate scan-logs vllm-startup.log": "started healthy",
    "kvgate scrape http://10.0.0.7:8000/metrics": "pool judged",
    "kvgate stats --baseline 459/500 --candidate 454/500": "the Wilson table",
    "kvgate stats --paired 440,19,14,27 --margin 0.02": "inconclusive",
    "kvgate report -f examples/status/l4-crash.json": "shown",
}


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def readme_examples() -> list[str]:
    """The `kvgate ...` lines of the section's code blocks, without their comments."""
    blocks = re.findall(r"```sh\n(.*?)```", _section(), re.DOTALL)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("kvgate ")]


def exit_table() -> dict[str, dict[int, str]]:
    """command -> {exit code: the README's meaning}, from the section's table."""
    rows = [line for line in _section().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[0] == "command", header
    codes = [int(cell) for cell in header[1:]]
    table: dict[str, dict[int, str]] = {}
    for row in rows[2:]:  # after the |---| line
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        meanings = {code: cell for code, cell in zip(codes, cells[1:], strict=True) if cell}
        for command in re.findall(r"`([a-z][a-z-]*)`", cells[0]):
            table[command] = meanings
    return table


def _skip_reason(argv: list[str]) -> str | None:
    command = argv[1]
    if command in CLUSTER and "-f" not in argv and "--file" not in argv:
        return "CLUSTER"
    if command in ENDPOINTS:
        return "ENDPOINTS"
    repo_id = command == "preflight" and re.fullmatch(r"[\w.-]+/[\w.-]+", argv[2])
    if repo_id and not Path(argv[2]).exists():
        return "HUB"
    return None


@pytest.fixture
def metrics_url() -> Iterator[str]:
    body = METRICS.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_readme_has_examples_and_a_table_for_real_commands() -> None:
    examples = readme_examples()
    table = exit_table()
    assert len(examples) >= 5, examples
    assert set(table) <= set(cli.COMMANDS), set(table) - set(cli.COMMANDS)
    for example in examples:
        command = shlex.split(example)[1]
        assert command in cli.COMMANDS, example
        assert command in table, f"{command} has no row in the README's exit-code table"


def test_every_example_is_expected_or_skipped_by_a_rule() -> None:
    for example in readme_examples():
        argv = shlex.split(example)
        assert (example in EXPECTED) != (_skip_reason(argv) is not None), (
            f"README example {example!r}: give it an EXPECTED answer or a skip rule, not both"
        )
    assert set(EXPECTED) <= set(readme_examples()), "an EXPECTED example left the README"


def _runnable() -> list[str]:
    return [e for e in readme_examples() if _skip_reason(shlex.split(e)) is None]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("example", _runnable())
def test_readme_example_exits_as_the_readme_table_says(
    example: str,
    as_json: bool,
    tmp_path: Path,
    metrics_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = shlex.split(example)[1:]
    command = argv[0]
    monkeypatch.chdir(tmp_path)
    for arg in argv[1:]:
        if arg.endswith(".log"):
            shutil.copy(STARTUP_LOG, tmp_path / arg)
        if arg.endswith(".yaml"):
            (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(DEPLOYMENT, tmp_path / arg)
        if arg.startswith("examples/status/"):  # the repository's saved rollouts, as named
            (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / arg, tmp_path / arg)
    argv = [re.sub(r"^http://[^/]+", metrics_url, arg) for arg in argv]
    sleeps: list[float] = []
    monkeypatch.setattr(scrape_command, "SLEEP", sleeps.append)

    code = cli.main([*argv, "--json"] if as_json else argv)
    out, err = capsys.readouterr()

    meanings = exit_table()[command]
    assert code in meanings, f"{example}: exit {code}, which the README's table leaves blank"
    assert EXPECTED[example] in meanings[code], (
        f"{example}: exit {code} means {meanings[code]!r} in the README, expected "
        f"{EXPECTED[example]!r}; stderr: {err}"
    )
    assert "Traceback" not in err
    if as_json:
        assert isinstance(json.loads(out), dict)
    if command == "scrape":
        assert sleeps == [scrape_command.DEFAULT_INTERVAL] * (scrape_command.DEFAULT_SAMPLES - 1)
