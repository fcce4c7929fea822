"""Every `kvgate` command reports an error the same way (kvgate.commands.failure).

One line on stderr, `kvgate <cmd>: error: <what>`, no traceback, the documented exit code;
under `--json` (where the command has it) also one JSON error object on stdout.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from kvgate import cli
from kvgate.commands import failure

# One bad input per subcommand, none of which reaches a network or a cluster: what the message
# must hold, and whether the command takes --json.
BAD_INPUT: dict[str, tuple[list[str], str, bool]] = {
    "preflight": (["{tmp}/absent.json"], "absent.json: no such file", True),
    "check": (["-f", "{tmp}/absent.yaml"], "absent.yaml: no such file", True),
    "scan-logs": (["{tmp}/absent.log"], "absent.log: no such file", True),
    "scrape": (["ftp://x/metrics"], "'ftp://x/metrics' is not an http(s) URL", True),
    "stats": (["--paired", "1,2,3"], "--paired: '1,2,3' is not four counts", True),
    "eval": (
        ["--control-url", "http://a/v1", "--candidate-url", "http://b/v1", "--concurrency", "x"],
        "argument --concurrency: ",
        True,
    ),
    "diverge": (
        ["--control-url", "http://a/v1", "--candidate-url", "http://b/v1", "--documents", "0"],
        "argument --documents: 0 is outside [1, 1000]",
        True,
    ),
    "load-job": (
        [
            "--control-url",
            "ftp://a",
            "--candidate-url",
            "http://b",
            "--model",
            "m",
            "--production-concurrency",
            "8",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "8",
        ],
        "--control-url: not an http(s) URL: 'ftp://a'",
        False,
    ),
    "report": (["-f", "{tmp}/absent.yaml"], "absent.yaml: no such file", True),
    "get": (
        ["r", "--timeout", "soon"],
        "--timeout: 'soon' is not seconds (90) or a duration",
        True,
    ),
    "wait": (
        ["r", "--timeout", "soon"],
        "--timeout: 'soon' is not seconds (90) or a duration",
        False,
    ),
    "approve": ([], "the following arguments are required: name", False),
    "abort": (["r"], "the following arguments are required: --reason", False),
    "run": (["--log-format", "x"], "argument --log-format: invalid choice: 'x'", True),
}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _argv(command: str, tmp_path: Path) -> list[str]:
    args, _, _ = BAD_INPUT[command]
    return [command, *(a.format(tmp=tmp_path) for a in args)]


def test_every_command_has_a_bad_input_case() -> None:
    assert set(BAD_INPUT) == set(cli.COMMANDS)


@pytest.mark.parametrize("command", list(BAD_INPUT))
def test_bad_input_is_one_prefixed_line_and_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, _argv(command, tmp_path))
    _, message, _ = BAD_INPUT[command]
    assert (code, out) == (cli.EXIT_INPUT, "")
    assert err.startswith(f"kvgate {command}: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("command", [c for c, (_, _, js) in BAD_INPUT.items() if js])
def test_under_json_the_error_is_also_one_json_object(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, [*_argv(command, tmp_path), "--json"])
    assert code == cli.EXIT_INPUT and out.count("\n") == 1
    error = json.loads(out)["error"]
    assert error == {"command": command, "message": error["message"], "exitCode": 2}
    assert err == f"kvgate {command}: error: {error['message']}\n"


@pytest.mark.parametrize("command", [c for c, (_, _, js) in BAD_INPUT.items() if not js])
def test_without_json_option_json_is_itself_the_usage_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--reason", "x"] if command == "abort" else []
    head = ["r"]
    if command == "load-job":  # its required options, and no positional argument
        head, extra = [], ["--control-url", "http://a", *BAD_INPUT[command][0][2:]]
    code, out, err = _run(capsys, [command, *head, *extra, "--json"])
    assert (code, out) == (cli.EXIT_INPUT, "")
    assert err == f"kvgate {command}: error: unrecognized arguments: --json\n"


def test_an_outside_failure_is_exit_4_in_the_same_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    code, out, err = _run(capsys, ["scrape", url, "--samples", "1", "--timeout", "2", "--json"])
    assert code == cli.EXIT_EXTERNAL
    error = json.loads(out)["error"]
    assert (error["command"], error["exitCode"]) == ("scrape", 4)
    assert error["message"].startswith(f"{url}: ConnectError: ")
    assert err == f"kvgate scrape: error: {error['message']}\n"


def test_a_bug_keeps_its_traceback_and_ends_with_the_prefixed_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvgate.commands import stats

    def broken(args: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(stats, "run", broken)
    code, out, err = _run(capsys, ["stats", "--paired", "1,2,3,4", "--json"])
    assert code == cli.EXIT_BUG
    assert "Traceback" in err
    assert err.splitlines()[-1] == (
        "kvgate stats: error: internal error (a bug; the traceback is above): RuntimeError: boom"
    )
    assert json.loads(out)["error"]["exitCode"] == 70


def test_before_a_command_is_known_the_prefix_is_kvgate_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, ["bogus"])
    assert (code, out) == (2, "")
    assert err.startswith("kvgate: error: argument COMMAND: invalid choice: 'bogus'")


@pytest.mark.parametrize(
    "argv",
    [["--debug", "stats", "--paired", "1,2"], ["stats", "--paired", "1,2", "--debug"]],
    ids=["before", "after"],
)
def test_debug_before_or_after_the_command_adds_the_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, argv)
    assert code == 2 and "Traceback" in err
    assert err.splitlines()[-1].startswith("kvgate stats: error: --paired: '1,2' is not")


def test_no_command_shows_the_usage_then_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, [])
    assert (code, out) == (2, "")
    assert err.startswith("usage: kvgate ")
    assert err.splitlines()[-1] == (
        "kvgate: error: give a command; kvgate COMMAND --help shows its options"
    )


def test_a_message_with_control_bytes_stays_one_line() -> None:
    assert failure.error_line("scan-logs", "bad\nline\x1b[31m") == (
        "kvgate scan-logs: error: bad\\nline\\x1b[31m"
    )
