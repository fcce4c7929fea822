"""Property-based fuzzing of every parser, called directly (test_fuzz_cli.py goes through the
CLI): hostile configs, safetensors headers and indexes, logs, metrics text, eval summaries and
report files give a valid result or kvgate's own error (one line), never another exception or a
hang; the memory cases run in a subprocess under RLIMIT_AS (`ulimit -v`) = 1 GiB.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from evidence import as_summary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.adapters.hub import read_local_checkpoint
from kvgate.checkpoint.capacity import parse_kv_layout
from kvgate.checkpoint.scales import parse_safetensors_header, scan_scales, unknown_scales
from kvgate.commands.report import read_rollout_file
from kvgate.commands.stats import read_saved_result
from kvgate.errors import KvgateError
from kvgate.evaluation.records import read_question_lines
from kvgate.evidence.logs import scan_lines, scan_log
from kvgate.evidence.metrics import parse_metrics
from kvgate.judge.accuracy import assess_accuracy
from kvgate.records.evalsummary import AccuracyStatus
from kvgate.records.joblog import eval_lines
from kvgate.report import render_html, render_text, svg, view_of
from kvgate.report.view import read_accuracy, read_findings
from kvgate.spec.rollout import AccuracyGate

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(
    max_examples=80,
    deadline=10_000,  # a hang, not a slow example on 2 shared cores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
T = TypeVar("T")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 30_000_000, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)


def _own(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | KvgateError:
    """The call's result, or kvgate's own error as a value (one line); anything else raises."""
    try:
        return fn(*args, **kwargs)
    except KvgateError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return exc


def render_svg(status: object) -> str:
    """The accuracy and KV tokens chart of a status alone."""
    return svg.render_svg(view_of({"status": status}))


def _json_dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


# -- model configs -----------------------------------------------------------------------------

CONFIG_KEYS = [
    "architectures",
    "model_type",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "layer_types",
    "sliding_window",
    "max_position_embeddings",
    "torch_dtype",
    "text_config",
    "quantization_config",
    "kv_cache_scheme",
    "full_attention_interval",
    "layers_block_type",
]
PLAUSIBLE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
configs = st.one_of(
    st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values, max_size=10),
    st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values, max_size=4).map(
        lambda extra: {**PLAUSIBLE, **extra}
    ),
)


@FUZZ
@given(configs)
def test_model_config_readers(config: dict[str, Any]) -> None:
    layout = _own(parse_kv_layout, config, "config.json")
    if not isinstance(layout, KvgateError):
        for dtype in ("bf16", "fp8"):
            _own(layout.tokens_per_gib, dtype)
            _own(layout.pool_tokens, 80 << 30, dtype)
    _own(unknown_scales, config, "config.json")
    _own(scan_scales, ["model.layers.0.self_attn.k_scale"], config=config)


# -- safetensors headers and index files -------------------------------------------------------

tensor_entries = st.one_of(
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F8_E4M3", "BF16", "F32", "U8"]) | scalars,
            "shape": st.lists(st.integers(min_value=-2, max_value=2**40) | scalars, max_size=4)
            | scalars,
            "data_offsets": st.lists(st.integers(min_value=-1, max_value=2**40), max_size=3),
        }
    ),
    json_values,
)
tensor_names = st.one_of(
    st.sampled_from(
        [
            "model.layers.0.self_attn.k_scale",
            "model.layers.0.self_attn.v_scale",
            "model.layers.1.self_attn.k_proj.k_scale",
            "model.layers.99999999999999999999.self_attn.v_scale",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.mlp.weight_scale",
            "__metadata__",
        ]
    ),
    st.text(max_size=40),
)
headers = st.dictionaries(tensor_names, tensor_entries, max_size=8)
header_bytes = st.one_of(
    headers.map(lambda h: _json_dumps(h).encode()),
    json_values.map(lambda v: _json_dumps(v).encode()),
    st.binary(max_size=200),
    st.sampled_from([b"", b"{", b"\xff\xfe", b"[" * 100_000, b'{"a":' * 50_000, b"{}"]),
)


@FUZZ
@given(header_bytes)
def test_safetensors_header(header: bytes) -> None:
    tensors = _own(parse_safetensors_header, header, "model.safetensors")
    if not isinstance(tensors, KvgateError):
        report = _own(scan_scales, tensors, config=PLAUSIBLE)
        if not isinstance(report, KvgateError):
            json.dumps(report.to_dict(), allow_nan=False)  # status takes it: finite JSON


@contextmanager
def _model_dir(files: dict[str, bytes]) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "model"
        root.mkdir()
        for name, data in files.items():
            (root / name).write_bytes(data)
        yield root


def _safetensors(header: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header


index_bodies = st.one_of(
    st.fixed_dictionaries(
        {
            "weight_map": st.dictionaries(
                st.text(max_size=10),
                st.sampled_from(
                    ["model.safetensors", "a.safetensors", "../x", "/etc/passwd", "", "."]
                )
                | json_values,
                max_size=4,
            )
            | json_values
        }
    ),
    json_values,
)


@FUZZ
@given(
    st.one_of(st.none(), configs.map(_json_dumps), st.text(max_size=50)),
    st.one_of(st.none(), index_bodies.map(_json_dumps), st.text(max_size=50)),
    header_bytes,
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)),
)
def test_local_checkpoint(
    config: str | None, index: str | None, header: bytes, length: int | None
) -> None:
    files = {
        "model.safetensors": _safetensors(header, length),
        "a.safetensors": _safetensors(b"{}"),
    }
    if config is not None:
        files["config.json"] = config.encode("utf-8", "surrogatepass")
    if index is not None:
        files["model.safetensors.index.json"] = index.encode("utf-8", "surrogatepass")
    with _model_dir(files) as root:
        read = _own(read_local_checkpoint, root)
        if not isinstance(read, KvgateError):
            analysed = _own(read.analyse)
            if not isinstance(analysed, KvgateError):
                json.dumps(analysed[1].to_dict(), allow_nan=False)


# -- logs ----------------------------------------------------------------------------------------


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted((ROOT / "tests/data/engine-source").glob("*.log")):
        lines += [x for x in path.read_text().splitlines() if not x.startswith("#:")]
    return lines


FIXTURE_LINES = _fixture_lines()
log_lines = st.one_of(
    st.sampled_from(FIXTURE_LINES),
    st.text(max_size=80),
    st.tuples(st.sampled_from(FIXTURE_LINES), st.text(max_size=20), st.integers(0, 200)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]
    ),
)


@FUZZ
@given(
    st.lists(log_lines, max_size=30),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.sampled_from([None, "auto", "vllm", "sglang", "VLLM", "trt"]),
)
def test_logs(lines: list[str], newline: str, engine: str | None) -> None:
    text = newline.join(lines)
    whole = _own(scan_log, text, engine)
    streamed = _own(scan_lines, text.splitlines(keepends=True), engine)
    if isinstance(whole, KvgateError):
        assert type(streamed) is type(whole)
    else:
        json.dumps(whole.to_dict(), allow_nan=False)


# -- metrics text ----------------------------------------------------------------------------

METRIC_LINES = [
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{model_name="m"} 3',
    "vllm:kv_cache_usage_perc 0.5",
    "vllm:gpu_cache_usage_perc 0.5",
    "# TYPE vllm:num_preemptions counter",
    "vllm:num_preemptions_total 7",
    "# TYPE vllm:e2e_request_latency_seconds histogram",
    'vllm:e2e_request_latency_seconds_bucket{le="0.5"} 3',
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 4',
    "vllm:e2e_request_latency_seconds_count 4",
    "vllm:e2e_request_latency_seconds_sum 1.5",
    "sglang:token_usage 0.3",
    "sglang:num_running_reqs 2",
    "sglang:num_queue_reqs 1",
]
metric_values = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "1e309", "-0", "0x10", "1_0", "", "١"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
)
metric_lines = st.one_of(
    st.sampled_from(METRIC_LINES),
    st.tuples(st.sampled_from(METRIC_LINES), metric_values).map(
        lambda t: t[0].rsplit(" ", 1)[0] + " " + t[1]
    ),
    st.text(max_size=60),
)


@FUZZ
@given(st.lists(metric_lines, max_size=20), st.sampled_from([None, "auto", "vllm", "sglang", "x"]))
def test_metrics_text(lines: list[str], engine: str | None) -> None:
    snapshot = _own(parse_metrics, "\n".join(lines) + "\n", engine)
    if not isinstance(snapshot, KvgateError):
        json.dumps(snapshot.to_dict(), allow_nan=False)  # status takes it: finite JSON


# -- eval summaries ----------------------------------------------------------------------------

summaries = st.one_of(
    st.fixed_dictionaries(
        {
            "kind": st.just("kvgate.eval/summary"),
            "verdict": st.sampled_from(["pass", "fail", "inconclusive", "error"]) | scalars,
        },
        optional={
            "paired": st.fixed_dictionaries(
                {
                    k: st.integers(-5, 10**7) | scalars
                    for k in ("both", "control_only", "candidate_only", "neither")
                }
            )
            | json_values,
            "accuracy": st.dictionaries(
                st.sampled_from(["control", "candidate", "difference", "n"]), json_values
            )
            | json_values,
            "margin_pp": scalars,
            "confidence": scalars,
            "advice": json_values,
            "error": json_values,
            "bounds": json_values,
            "looks": json_values,
            "nonce": st.just("n0nce") | scalars,
        },
    ),
    json_values,
)
question_lines = st.fixed_dictionaries(
    {
        "kind": st.just("kvgate.eval/question") | scalars,
        "doc_id": st.integers(0, 5) | scalars,
        "control_right": st.booleans() | scalars,
        "candidate_right": st.booleans() | scalars,
    }
)
NONCE_SHA = "2b8a3df1c1a2b0c7a5f1d1b8f6a1a83c0f0a41d93fc1f8b7b9a4c4b6a5f3e2d1"


@FUZZ
@given(summaries)
def test_eval_summary_readers(summary: Any) -> None:
    if isinstance(summary, dict):
        # read once (as the controller does), then judged: neither raises but kvgate's own
        _own(lambda raw: assess_accuracy(AccuracyGate(), AccuracyStatus.from_summary(raw)), summary)
    line = _json_dumps(summary)
    _own(eval_lines, f"noise\n{line}\n", NONCE_SHA)


@FUZZ
@given(
    st.lists(
        st.one_of(
            question_lines.map(_json_dumps), summaries.map(_json_dumps), st.text(max_size=30)
        ),
        max_size=8,
    ),
    st.sampled_from(["text", "binary", "deep"]),
)
def test_saved_eval_results(lines: list[str], form: str) -> None:
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if form == "binary":
        data += b"\xff\xfe\x00"
    elif form == "deep":
        data += b'\n{"kind": "kvgate.eval/question", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.jsonl"
        path.write_bytes(data)
        _own(read_saved_result, path)
        _own(read_question_lines, path)


# -- report files ----------------------------------------------------------------------------

statuses = st.dictionaries(
    st.sampled_from(
        [
            "phase",
            "verdict",
            "accuracy",
            "preflight",
            "conditions",
            "canary",
            "candidate",
            "previous",
            "recommendedArgs",
            "gates",
            "startedAt",
            "finishedAt",
            "logs",
            "capacity",
        ]
    ),
    json_values,
    max_size=8,
)


@FUZZ
@given(statuses, st.sampled_from(["json", "yaml", "raw"]), st.booleans())
def test_report_files(status: dict[str, Any], form: str, as_list: bool) -> None:
    rollout: Any = {"apiVersion": "kvgate.io/v1alpha1", "kind": "KVCacheRollout"}
    rollout["metadata"] = {"name": "r", "namespace": "default"}
    rollout["status"] = status
    _own(read_accuracy, status)
    _own(read_findings, status)
    for render in (render_text, render_html):
        _own(render, rollout)
    _own(render_svg, status)
    document = {"kind": "List", "items": [rollout]} if as_list else rollout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollout"
        if form == "json":
            path.write_text(_json_dumps(document))
        elif form == "yaml":
            import yaml

            path.write_text(yaml.safe_dump(json.loads(json.dumps(document, default=str))))
        else:
            path.write_bytes(b"\xff" + _json_dumps(document).encode()[:40])
        read = _own(read_rollout_file, str(path))
        if isinstance(read, dict):
            _own(render_text, read)


# Every field the report reads, nested as the operator writes it; the fuzz puts any JSON value
# at any of them (or leaves it out), so a wrong type deep in the status is tried, not only at
# the top where a random dictionary would put it.
_ARM_CLOCK = {"smMHz": 0, "memMHz": 0, "smRangeMHz": [0], "memRangeMHz": [0]}
_SCAN = {"kv_cache_dtype": 0, "attention_backend": 0, "capacity": {"kv_tokens": 0,
         "max_concurrency": 0}, "findings": [{"severity": 0, "code": 0, "text": 0, "hint": 0}]}  # fmt: skip
_ARM_SCORE = {"correct": 0, "n": 0, "accuracy": 0, "wilson95": [0]}
REPORT_SHAPE: dict[str, Any] = {
    "phase": 0, "message": 0, "startedAt": 0, "finishedAt": 0, "recommendedArgs": [0],
    "conditions": [{"type": 0, "status": 0, "reason": 0, "message": 0}],
    "findings": [{"gate": 0, "outcome": 0, "reason": 0, "message": 0}],
    "gates": {"accuracy": {"outcome": 0, "message": 0}},
    "verdict": {"decision": 0, "message": 0},
    "preflight": {"checkpointHasScales": 0, "pressure": {"pressured": 0, "max_usage": 0,
                  "mean_waiting": 0, "samples": 0}},
    "remediation": {"firstAttempt": {"message": 0, "attentionBackend": 0}, "args": [0],
                    "env": {"K": 0}, "code": 0, "engine": 0, "engineVersion": 0},
    "arms": {"control": {"kvTokens": 0, "attentionBackend": 0, "scan": _SCAN},
             "candidate": {"scan": _SCAN}},
    "capacity": {"gain": 0, "control": {"kvCacheDtype": 0, "kvTokens": 0, "maxConcurrency": 0},
                 "candidate": {"kvTokens": 0, "attentionBackend": 0}},
    "speed": {"control": {"tokensPerSecond": 0}, "candidate": {"tokensPerSecond": 0},
              "clocks": {"control": _ARM_CLOCK, "candidate": _ARM_CLOCK, "note": 0, "source": 0}},
    "accuracy": {
        "verdict": 0, "task": 0, "margin": 0, "confidence": 0, "questions_used": 0,
        "control": _ARM_SCORE, "candidate": _ARM_SCORE,
        "paired": {"control_only": 0, "candidate_only": 0, "difference": 0, "tango95": [0]},
        "long_context": {"buckets": [{"context_length": 0, "control": {"accuracy": 0},
                         "candidate": {"accuracy": 0}, "recovery": 0, "bounds": {"lower": 0},
                         "verdict": 0, "reason": 0}]},
        "divergence": {"buckets": [{"bucket": 0, "floor": {"mean_kl": 0, "top1_agreement": 0},
                       "candidate": {"mean_kl": 0}, "flagged": 0}]},
    },
}  # fmt: skip


def _shaped(shape: Any) -> st.SearchStrategy[Any]:
    if isinstance(shape, dict):
        fields = {k: _shaped(v) | json_values for k, v in shape.items()}
        return st.fixed_dictionaries({}, optional=fields)
    if isinstance(shape, list):
        return st.lists(_shaped(shape[0]) | json_values, max_size=3)
    return json_values


@FUZZ
@given(_shaped(REPORT_SHAPE))
def test_report_renders_any_value_at_any_field_it_reads(status: dict[str, Any]) -> None:
    from kvgate import report

    rollout = {"metadata": {"name": "r", "namespace": "n"}, "spec": {}, "status": status}
    text, page = render_text(rollout), render_html(rollout)
    assert text.startswith("KVCacheRollout n/r: ") and page.rstrip().endswith("</html>")
    render_svg(status)
    report.svg.render_long_context_svg(report.view_of({"status": status}))
    report.view.read_speed(status)


# -- bounded memory, under RLIMIT_AS = 1 GiB in a subprocess -----------------------------------

MEMORY_CASES = {
    # a safetensors length prefix claiming 10 GB (and one claiming 2**64 - 1)
    "header-10gb": "files = {'model.safetensors': struct.pack('<Q', 10 * 10**9) + b'{}'}\n"
    "run(read_local_checkpoint, write(files))",
    "header-2**64": "files = {'model.safetensors': b'\\xff' * 8 + b'{}'}\n"
    "run(read_local_checkpoint, write(files))",
    # a header that nests a million levels deep
    "header-deep": "h = b'[' * 1_000_000\n"
    "files = {'model.safetensors': struct.pack('<Q', len(h)) + h}\n"
    "run(read_local_checkpoint, write(files))",
    "config-deep": "files = {'config.json': b'{\"a\":' * 1_000_000, "
    "'model.safetensors': struct.pack('<Q', 2) + b'{}'}\n"
    "run(read_local_checkpoint, write(files))",
    "config-30m-layers": "cfg = dict(num_hidden_layers=30_000_000, num_attention_heads=32, "
    "num_key_value_heads=8, hidden_size=4096, model_type='llama', "
    "architectures=['LlamaForCausalLM'])\n"
    "run(parse_kv_layout, cfg)\nrun(unknown_scales, cfg)",
    "index-deep": "files = {'model.safetensors.index.json': b'{\"weight_map\":' + b'[' * 1_000_000}\n"
    "run(read_local_checkpoint, write(files))",
    # a 50 MB log that is one line, and 50 MB of one line of anchors
    "log-50mb-line": "run(scan_log, 'x' * 50_000_000)",
    "log-50mb-anchors": "run(scan_log, 'Error failed cache ' * 2_700_000)",
    "metrics-50mb-line": "run(parse_metrics, 'vllm:kv_cache_usage_perc ' + '9' * 50_000_000)",
    "summary-deep": "p = write({'s.json': b'[' * 5_000_000})\nrun(read_saved_result, p / 's.json')",
    "questions-deep": 'p = write({\'q.jsonl\': b\'{"kind": "kvgate.eval/question", "x": \''
    " + b'[' * 5_000_000})\n"
    "run(read_question_lines, p / 'q.jsonl')",
    "rollout-deep": "p = write({'r.json': b'[' * 5_000_000})\n"
    "run(read_rollout_file, str(p / 'r.json'))",
}
PRELUDE = textwrap.dedent(
    """
    import resource, struct, sys, tempfile
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from kvgate.adapters.hub import read_local_checkpoint
    from kvgate.commands.report import read_rollout_file
    from kvgate.checkpoint.capacity import parse_kv_layout
    from kvgate.checkpoint.scales import unknown_scales
    from kvgate.commands.stats import read_saved_result
    from kvgate.errors import KvgateError
    from kvgate.evaluation.records import read_question_lines
    from kvgate.evidence.logs import scan_log
    from kvgate.evidence.metrics import parse_metrics

    def write(files):
        root = Path(tempfile.mkdtemp())
        for name, data in files.items():
            (root / name).write_bytes(data)
        return root

    def run(fn, *args):
        try:
            fn(*args)
            print("result")
        except KvgateError as exc:
            print("own", type(exc).__name__, str(exc)[:200].replace(chr(10), " "))
    """
)


@pytest.mark.parametrize("case", sorted(MEMORY_CASES))
def test_hostile_input_in_bounded_memory(case: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + MEMORY_CASES[case]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), done.stderr[-2000:]
    for line in done.stdout.splitlines():
        assert line == "result" or line.startswith("own "), line


# -- the defects the fuzzing found, one line each ------------------------------------------------


def _message(fn: Callable[..., Any], *args: Any) -> str:
    with pytest.raises(KvgateError) as caught:
        fn(*args)
    return str(caught.value)


def test_found_a_deep_safetensors_header() -> None:  # was RecursionError
    assert _message(parse_safetensors_header, b"[" * 100_000, "m.safetensors") == (
        "m.safetensors: nests deeper than 8 levels"
    )


@pytest.mark.parametrize("shape", [["x", 3], [1.5], [-1], [2**64], [[1]], [True], [1] * 9])
def test_found_a_shape_that_is_not_sizes(shape: list[Any]) -> None:  # was TypeError later
    header = json.dumps({"w": {"dtype": "F32", "shape": shape}}).encode()
    assert _message(parse_safetensors_header, header, "m.safetensors").startswith(
        "m.safetensors: safetensors header entry 'w' has shape "
    )


def test_found_an_unhashable_weight_map_value() -> None:  # was TypeError
    index = json.dumps({"weight_map": {"w": ["model.safetensors"]}}).encode()
    files = {"model.safetensors.index.json": index, "model.safetensors": _safetensors(b"{}")}
    with _model_dir(files) as root:
        assert _message(read_local_checkpoint, root).endswith(
            "model.safetensors.index.json: field 'weight_map' must map tensor names to file names"
        )


def test_found_30_million_layers_in_the_scale_report() -> None:  # was MemoryError
    config = {**PLAUSIBLE, "num_hidden_layers": 30_000_000}
    assert _message(unknown_scales, config, "x/config.json") == (
        "x/config.json: num_hidden_layers is 30000000; kvgate reads models of at most 4096"
    )


def test_found_advice_that_is_not_an_object() -> None:  # was AttributeError
    summary = {"kind": "kvgate.eval/summary", "verdict": "inconclusive", "advice": True}
    assert assess_accuracy(AccuracyGate(), as_summary(summary)).reason == "AccuracyInconclusive"


def test_found_a_phase_that_is_not_a_string() -> None:  # was TypeError in the report
    status = {"phase": [], "recommendedArgs": ["--kv-cache-dtype", "fp8"]}
    text = render_text({"metadata": {"name": "r"}, "status": status})
    assert "\nCandidate args (under test)\n  --kv-cache-dtype fp8" in text
    assert render_svg({"phase": {}, "finishedAt": None}).startswith("<svg")


def test_found_question_lines_that_are_not_utf8_or_nest_deeply(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\xff\n")  # was UnicodeDecodeError
    assert _message(read_question_lines, path).startswith(f"{path}: ")
    path.write_bytes(b'{"kind": "kvgate.eval/question", "x": ' + b"[" * 50_000)  # RecursionError
    assert (
        _message(read_question_lines, path) == f"{path}:1: not JSON (nests deeper than 64 levels)"
    )
