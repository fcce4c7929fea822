"""Property-based fuzzing of every kvgate command: hostile input is one line and exit 2 (or
4 for an endpoint), never a traceback (exit 70), a hang or unbounded memory.

Most cases call `kvgate.cli.main` in-process; a handful run `python -m kvgate` in a subprocess
under RLIMIT_AS = 1 GiB and a wall-clock timeout, with the inputs that used to blow up
(/dev/zero, a YAML alias bomb, deep JSON, 30 M layers).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvgate.adapters import http as http_adapter
from kvgate.cli import EXIT_BUG, build_parser, main

FUZZ = settings(
    max_examples=60, deadline=10000, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
ROOT = Path(__file__).resolve().parents[2]

numbers = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e300", "1e-300", "-0", "0", "١٢", "²", "1" * 5000]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(max_size=12),
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _check(code: int, out: str, err: str) -> None:
    assert code != EXIT_BUG and "Traceback" not in err, err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err[-2000:]
    assert "Infinity" not in out and "NaN" not in out


@contextlib.contextmanager
def _tmpfile(data: bytes, name: str = "input") -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        yield str(path)


# -- in-process: every command ------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(["--gpu-memory-gib", "--revision"]), numbers)
def test_preflight_arguments(flag: str, value: str) -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}
    with _tmpfile(json.dumps(config).encode(), "config.json") as path:
        _check(*_run(["preflight", path, flag, value]))


@FUZZ
@given(json_values)
def test_preflight_configs(config: object) -> None:
    with _tmpfile(json.dumps(config).encode(), "config.json") as path:
        _check(*_run(["preflight", path, "--json"]))


@FUZZ
@given(st.binary(max_size=2000))
def test_preflight_config_bytes(data: bytes) -> None:
    with _tmpfile(data, "config.json") as path:
        _check(*_run(["preflight", path]))


@FUZZ
@given(
    st.lists(
        st.sampled_from(
            [
                "INFO 01-01 00:00:00 [x.py:1] ",
                "[2025-01-01 00:00:00 TP0] ",
                "KV cache size: ",
                "max_total_num_tokens=",
                "Maximum concurrency for ",
                "Using FlashInfer backend on V1 engine",
                "Available KV cache memory: ",
                "EngineCore failed to start",
                "ValueError: ",
                "\r",
                "\n",
                "\x1b[0m",
                "9" * 400,
                ",",
            ]
        )
        | st.text(max_size=30),
        max_size=40,
    ).map("".join)
)
def test_scan_logs_text(text: str) -> None:
    with _tmpfile(text.encode("utf-8", "surrogatepass"), "x.log") as path:
        _check(*_run(["scan-logs", path, "--json"]))


@FUZZ
@given(st.binary(max_size=3000))
def test_scan_logs_bytes(data: bytes) -> None:
    with _tmpfile(data, "x.log") as path:
        _check(*_run(["scan-logs", path]))


def _metrics_body() -> st.SearchStrategy[bytes]:
    names = st.sampled_from(
        [
            "vllm:kv_cache_usage_perc",
            "vllm:num_requests_waiting",
            "vllm:num_preemptions_total",
            'vllm:time_to_first_token_seconds_bucket{le="%s"}',
            "vllm:time_to_first_token_seconds_count",
            'vllm:cache_config_info{num_gpu_blocks="%s",block_size="16"}',
            "sglang:token_usage",
        ]
    )
    line = st.tuples(names, numbers, numbers).map(
        lambda t: (t[0] % t[2] if "%s" in t[0] else t[0]) + " " + t[1]
    )
    text = st.lists(line | st.text(max_size=20), max_size=12).map("\n".join)
    return text.map(lambda t: t.encode("utf-8", "surrogatepass")) | st.binary(max_size=500)


@contextlib.contextmanager
def _serve(body: bytes) -> Iterator[None]:
    real = httpx.Client
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    http_adapter.httpx.Client = lambda **kw: real(transport=transport, **kw)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        http_adapter.httpx.Client = real  # type: ignore[misc]


@FUZZ
@given(_metrics_body(), st.booleans())
def test_scrape_bodies(body: bytes, as_json: bool) -> None:
    with _serve(body):
        argv = ["scrape", "http://fuzz.test/metrics", "--samples", "3", "--interval", "0"]
        _check(*_run(argv + (["--json"] if as_json else [])))


@FUZZ
@given(
    st.sampled_from(
        ["--interval", "--samples", "--timeout", "--usage-threshold", "--min-fraction"]
    ),
    numbers,
)
def test_scrape_arguments(flag: str, value: str) -> None:
    if flag == "--samples" and value.strip().isascii() and value.strip().isdigit():
        assume(int(value) <= 20)  # many samples are slow, not wrong
    with _serve(b"vllm:kv_cache_usage_perc 0.5\n"):
        # one sample unless the fuzzed flag says otherwise (the default, 5, would sleep a
        # fuzzed --interval between them)
        argv = ["scrape", "http://fuzz.test/metrics", "--interval", "0", "--samples", "1"]
        _check(*_run([*argv, flag, value]))


@FUZZ
@given(
    st.sampled_from(["--baseline", "--candidate", "--paired", "--margin", "--confidence"]), numbers
)
def test_stats_arguments(flag: str, value: str) -> None:
    extra = [] if flag in ("--baseline", "--candidate", "--paired") else ["--paired", "1,2,3,4"]
    _check(*_run(["stats", flag, value, *extra]))


@FUZZ
@given(st.tuples(*([numbers] * 4)).map(",".join))
def test_stats_paired_counts(value: str) -> None:
    _check(*_run(["stats", "--paired", value]))


@FUZZ
@given(json_values, st.booleans())
def test_stats_from_summaries(summary: object, as_lines: bool) -> None:
    if isinstance(summary, dict):
        summary = {"kind": "kvgate.eval/summary", **summary}
    elif as_lines:
        summary = {"kind": "kvgate.eval/question", "doc_id": 1, "x": summary}
    with _tmpfile(json.dumps(summary).encode()) as path:
        _check(*_run(["stats", "--from", path]))


@FUZZ
@given(st.binary(max_size=2000))
def test_stats_from_bytes(data: bytes) -> None:
    with _tmpfile(data) as path:
        _check(*_run(["stats", "--from", path]))


@FUZZ
@given(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=800)))
def test_report_files(data: bytes) -> None:
    with _tmpfile(data, "kvr.yaml") as path:
        _check(*_run(["report", "-f", path, "--json"]))


@FUZZ
@given(
    st.sampled_from(
        ["--limit", "--num-fewshot", "--seed", "--concurrency", "--max-gen-toks",
         "--max-retries", "--timeout", "--margin", "--confidence", "--chunk"]
    ),
    numbers,
)  # fmt: skip
def test_eval_argument_parsing(flag: str, value: str) -> None:
    argv = ["eval", "--control-url", "http://a/v1", "--candidate-url", "http://b/v1", flag, value]
    parser = build_parser(argv)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2 and len(err.getvalue().strip().splitlines()) == 1
            return
    for name in ("timeout", "margin", "confidence"):
        assert float(getattr(args, name)) == float(getattr(args, name))  # not NaN
        assert abs(float(getattr(args, name))) < float("inf")


# -- subprocess under RLIMIT_AS: the inputs that used to take all memory -------------------------

GIB = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))


def _kvgate(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvgate", *argv],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        env=env,
        check=False,
    )


def _bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\nkind: KVCacheRollout\n"


SUBPROCESS_CASES = {
    "preflight /dev/zero": (["preflight", "/dev/zero"], "/dev/zero"),
    "stats --from /dev/zero": (["stats", "--from", "/dev/zero"], "not a regular file"),
    "report -f /dev/zero": (["report", "-f", "/dev/zero"], "larger than 8 MiB"),
    "scan-logs /dev/zero": (["scan-logs", "/dev/zero"], "larger than 1 GiB"),
    "report -f alias bomb": (["report", "-f", "{bomb}"], "aliases"),
    "stats --from deep JSON": (["stats", "--from", "{deep}"], "kvgate.eval/summary"),
    "report -f deep YAML": (["report", "-f", "{deep_yaml}"], "nest"),
    "preflight 30M layers": (["preflight", "{layers}"], "num_hidden_layers"),
    "preflight huge GiB": (["preflight", "{layers}", "--gpu-memory-gib", "1e300"], ""),
}


@pytest.mark.parametrize("case", list(SUBPROCESS_CASES))
def test_hostile_files_under_a_memory_limit(case: str, tmp_path: Path) -> None:
    files = {
        "bomb": _bomb(),
        "deep": '{"kind": "kvgate.eval/summary", "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
        "deep_yaml": "a: " + "[" * 100_000 + "]" * 100_000,
        "layers": json.dumps({"num_hidden_layers": 30_000_000, "num_attention_heads": 8,
                              "hidden_size": 64}),
    }  # fmt: skip
    paths = {}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        paths[name] = str(tmp_path / name)
    argv, expected = SUBPROCESS_CASES[case]
    done = _kvgate(*(a.format(**paths) for a in argv))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert expected in done.stderr
