"""hack/real_vllm.Pressure: the load it starts is stopped whole, workers included."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import real_vllm


def test_stop_takes_the_tool_and_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a stand-in inference-perf that starts a worker of its own and keeps running
    tool = tmp_path / "inference-perf"
    pids = tmp_path / "pids"
    tool.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    tool.chmod(0o755)
    monkeypatch.setenv("KVGATE_INFERENCE_PERF", str(tool))
    model = tmp_path / "model"
    model.mkdir()
    pressure = real_vllm.Pressure("http://127.0.0.1:1", str(model), work_dir=tmp_path / "w")
    pressure.start()
    deadline = time.monotonic() + 10
    while not (pids.is_file() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    shell, worker = (int(p) for p in pids.read_text().split())
    # WHEN it stops
    pressure.stop()
    # THEN neither the tool nor its worker is left, and its config was the load Job's
    for pid in (shell, worker):
        with pytest.raises(ProcessLookupError):
            for _ in range(100):  # the worker is reaped by init a moment after the kill
                os.kill(pid, 0)
                time.sleep(0.05)
    assert "use_server_output_tokens: true" in (tmp_path / "w" / "pressure.yaml").read_text()
