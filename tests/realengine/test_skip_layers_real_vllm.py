"""What the real vLLM (the CPU build, 0.32.0) makes of the skip list kvgate writes: its own
argument parser (FlexibleArgumentParser with EngineArgs.add_cli_args, as `vllm serve` builds it)
reads the candidate's engine arguments, so `spec.kvCache.skipLayers` with several entries
reaches the engine whole, and the `=` forms do what tests/unit/test_skip_layers.py says they do.
(Serving with a three-entry list: tests/data/real-engine/kv-formats/fp8-skip-0-1-2.log, 4,608
KV tokens, which tests/unit/test_kv_formats_real_engine.py checks against the capacity math.)
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

import real_vllm
from kvgate.change.manifests import candidate_container
from kvgate.spec.rollout import RolloutSpec

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]

FLAG = "--kv-cache-dtype-skip-layers"
PARSE = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(argv)
        out.append({"skip": ns.kv_cache_dtype_skip_layers, "dtype": ns.kv_cache_dtype})
    except SystemExit as exc:
        out.append({"exit": exc.code})
print("RESULT " + json.dumps(out))
"""


def real_parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(real_vllm.VLLM_PYTHON), "-c", PARSE, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    result: list[dict[str, Any]] = json.loads(line.removeprefix("RESULT "))
    return result


def test_the_real_parser_reads_the_whole_list_kvgate_writes(vllm_installed: None) -> None:
    parsed = RolloutSpec.from_dict(
        {
            "targetRef": {"name": "qwen", "container": "engine"},
            "engine": "vllm",
            "kvCache": {"format": "fp8", "skipLayers": ["0", "2", "sliding_window"]},
        }
    )
    productions = [
        ["--max-num-seqs", "8"],
        [FLAG, "sliding_window", "--max-num-seqs", "8"],
        [f"{FLAG}=1", "--max-num-seqs", "8"],
        ["--kv_cache_dtype_skip_layers", "1", "3"],
    ]
    candidates = [
        candidate_container(
            parsed, {"name": "engine", "image": "vllm/vllm-openai:v0.32.0", "args": args}
        )["args"]
        for args in productions
    ]
    # what vLLM's own parser says of each, and of the forms kvgate does not write
    results = real_parse([*candidates, [f"{FLAG}=0,1"], [f"{FLAG}=0", "1"]])
    for args, got in zip(candidates, results[: len(candidates)], strict=True):
        assert got == {"skip": ["0", "2", "sliding_window"], "dtype": "fp8"}, args
    assert results[-2] == {"skip": ["0,1"], "dtype": "auto"}  # one entry naming no layer
    assert results[-1] == {"exit": 2}  # "unrecognized arguments: 1"
