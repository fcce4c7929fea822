"""The one-pass anchor prefilter of kvgate.evidence.logs.collect: windows, bytes and line numbers."""

from __future__ import annotations

import pytest

from kvgate.evidence.logs import scan_lines, scan_log
from kvgate.evidence.logs.collect import _WINDOW

FAILED = "(EngineCore pid=93) ERROR 09-13 10:00:00 [core.py:946] EngineCore failed to start."
NOISE = '(APIServer pid=1) INFO:     10.42.0.7:51234 - "POST /v1/chat/completions HTTP/1.1" 200'


@pytest.mark.parametrize("inside", range(1, 6))
@pytest.mark.parametrize("filler", ["x", "é", "█"])
def test_an_anchor_across_a_window_edge_is_found(inside: int, filler: str) -> None:
    # Put `inside` bytes of "failed" in the first window (in bytes: é is 2 of them, █ is 3).
    pad_bytes = _WINDOW - inside - 1 - FAILED.index("failed")  # a padding line, its newline
    pad = filler * (pad_bytes // len(filler.encode()))
    pad += "x" * (pad_bytes - len(pad.encode()))
    text = f"{pad}\n{FAILED}\n"
    assert text.encode().index(b"failed") < _WINDOW < text.encode().index(b"failed") + 6
    scan = scan_log(text, "vllm")
    failure = scan.finding("engine-start-failed")
    assert failure is not None and failure.line == 2
    assert scan.lines == 2


def test_line_numbers_with_many_candidates_in_a_chunk() -> None:
    # More than a few candidate lines switch to the newline index; both must agree.
    lines = []
    for i in range(200):
        lines.append(NOISE)
        lines.append(f"(EngineCore pid=93) ERROR 09-13 10:00:00 [core.py:1] ValueError: bad {i}")
    lines.append(FAILED)
    few = scan_log("\n".join([NOISE] * 399 + [FAILED]), "vllm")
    many = scan_log("\n".join(lines), "vllm")
    assert few.finding("engine-start-failed").line == 400  # type: ignore[union-attr]
    assert many.finding("engine-start-failed").line == 401  # type: ignore[union-attr]
    assert many.finding("engine-start-failed").hint == (  # type: ignore[union-attr]
        "Root cause at line 2: ValueError: bad 0"
    )
    assert many == scan_lines(lines, "vllm")


def test_a_line_of_anchors_past_the_cap_still_reads_its_head() -> None:
    # A 1 MB line made of anchors costs one window; its first 64 KiB are still read.
    line = FAILED + " failed" * 150_000
    scan = scan_log(f"{NOISE}\n{line}\n{FAILED}\n", "vllm")
    failure = scan.finding("engine-start-failed")
    assert failure is not None and (failure.line, failure.count) == (2, 2)


def test_ansi_codes_and_carriage_returns_are_still_stripped() -> None:
    line = "\x1b[31m" + FAILED.replace("failed", "fail\x1b[0med") + "\x1b[0m"
    # The anchor is split by a colour code in the raw text: not a candidate, as before.
    assert scan_log(line + "\n", "vllm").finding("engine-start-failed") is None
    line = "\x1b[31m" + FAILED + "\x1b[0m\rprogress 10%"
    failure = scan_log(line + "\n", "vllm").finding("engine-start-failed")
    assert failure is not None and failure.text.endswith("EngineCore failed to start.")


def test_lone_surrogates_of_a_surrogateescape_read_do_not_break_the_scan() -> None:
    text = f"{NOISE} \udcff\n{FAILED} \udcfe\n"
    failure = scan_log(text, "vllm").finding("engine-start-failed")
    assert failure is not None and failure.line == 2 and "\udcfe" in failure.text


def test_a_logged_model_output_is_not_a_finding() -> None:
    # --enable-log-outputs echoes each answer (vllm/entrypoints/logger.py:72 in 0.10.2,
    # serve/utils/request_logger.py:119 in 0.33.0: "Generated response %s%s: output: %r, ...").
    echo = (
        "(APIServer pid=1) INFO 11-29 20:00:01 [request_logger.py:119] Generated response "
        "chatcmpl-1: output: 'RuntimeError: Ninja build failed. CUDA out of memory. "
        "EngineCore failed to start.', finish_reason: stop"
    )
    scan = scan_log(f"{NOISE}\n{echo}\n", "vllm")
    assert scan.findings == () and not scan.failed
