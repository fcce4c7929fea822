"""Render tests/data/engine-source-old/ from vLLM 0.6-0.8 wheels (wordings older than 0.10.2).

    pip download --no-deps --only-binary=:all: vllm==0.6.3.post1 vllm==0.7.3 vllm==0.8.0 -d /tmp/wheels
    python tests/old_wordings_from_wheels.py --wheels /tmp/wheels [--check]

The same method as tests/fixtures_from_wheels.py (whose reader it reuses): each line is a
string literal found in the wheel, preceded by `#: <wheel> <path>:<line>`; only the hole
values are invented. vLLM up to 0.7 printed `INFO mm-dd HH:MM:SS file.py:N] ` without the
brackets 0.8 added (vllm/logger.py `_FORMAT`, 0.6.3:19, 0.7.3:22, 0.8.0:22), so those lines are
rendered without them. These are the older wordings the field corpus met (issue 23).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import fixtures_from_wheels as fw
from fixtures_from_wheels import Fixture, Line, Wheels, render

OUT = Path(__file__).parent / "data" / "engine-source-old"
OLD_WHEELS = {
    "vllm-0.6.3": "vllm-0.6.3.post1-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.7.3": "vllm-0.7.3-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.8.0": "vllm-0.8.0-cp38-abi3-manylinux1_x86_64.whl",
}
UNBRACKETED = {"vllm-0.6.3", "vllm-0.7.3"}
API = "vllm/entrypoints/openai/api_server.py"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 283, '
    "in run_engine_core\n"
    "    engine_core = EngineCoreProc(*args, **kwargs)\n"
    "ValueError: No available memory for the cache blocks."
)


def fixtures() -> list[Fixture]:
    namespace = (
        "Namespace(model='Qwen/Qwen2.5-7B-Instruct', dtype='auto', kv_cache_dtype='fp8', "
        "quantization_param_path=None, max_model_len=8192)"
    )
    return [
        Fixture(
            "vllm-0.6.3-fp8-fa2-xformers",
            "vllm-0.6.3",
            "vllm",
            [
                Line(API, "vLLM API server version ", ["0.6.3.post1"]),
                Line(API, "args: ", [namespace]),
                Line("vllm/config.py", "Using fp8 data type to store kv cache"),
                Line("vllm/attention/selector.py", "Cannot use FlashAttention-2 backend for FP8"),
                Line("vllm/attention/selector.py", "Using XFormers backend"),
                Line("vllm/executor/gpu_executor.py", "# GPU blocks: ", [2654, 2048]),
                Line("vllm/executor/gpu_executor.py", "Maximum concurrency for ", [8192, 5.18]),
            ],
        ),
        Fixture(
            "vllm-0.7.3-v1-blocks-enginecore-start-crash",
            "vllm-0.7.3",
            "vllm",
            [
                Line(API, "vLLM API server version ", ["0.7.3"]),
                Line("vllm/v1/core/kv_cache_utils.py", "# GPU blocks: ", [1381]),
                Line("vllm/v1/core/kv_cache_utils.py", "Maximum concurrency for ", [2048, 10.79]),
                Line("vllm/v1/engine/core.py", "EngineCore hit an exception", [TRACEBACK], "ERROR"),
            ],
        ),
        Fixture(
            "vllm-0.8.0-v1-flash-attn-fp8-refused",
            "vllm-0.8.0",
            "vllm",
            [
                Line(API, "vLLM API server version ", ["0.8.0"]),
                Line(
                    "vllm/v1/attention/backends/flash_attn.py",
                    "FlashAttention V1 with FP8 KV cache",
                    bare="raise",
                    exc="NotImplementedError",
                ),
            ],
        ),
    ]


def _unbracket(text: str) -> str:
    return re.sub(r"^(\w+ \d\d-\d\d [\d:]{8}) \[([\w.]+:\d+)\] ", r"\1 \2] ", text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    fw.WHEELS.update(OLD_WHEELS)
    wheels = Wheels(args.wheels)
    if not all(wheels.available(key) for key in OLD_WHEELS):
        print(f"wheels missing in {args.wheels}; nothing changed", file=sys.stderr)
        return 2
    changed = 0
    for fixture in fixtures():
        lines = render(wheels, fixture)
        if fixture.key in UNBRACKETED:
            lines = [line if line.startswith("#:") else _unbracket(line) for line in lines]
        head = f"#: engine={fixture.engine} source={fixture.key}"
        changed += fw._write(args, OUT / f"{fixture.name}.log", "\n".join([head, *lines]) + "\n")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
