"""Regenerate tests/data/engine-source/ from the engines' published wheels.

    pip download --no-deps --only-binary=:all: vllm==0.10.2 -d /tmp/wheels   # and the others
    python tests/fixtures_from_wheels.py --wheels /tmp/wheels [--check]

Every fixture line is rendered from a format string read out of a wheel (`zipfile`, no
import of the engine): the script finds the string literal (or f-string) that contains a
needle in the named file, records the wheel, the file and the line number, and fills the
`%s` / `{...}` holes with the values given below (those values are the only invented part).
Each log line in a fixture is preceded by a provenance line

    #: <wheel file> <path inside the wheel>:<line of the string> [+<path>:<line> ...]

and the log header (`INFO 09-13 10:00:00 [cache.py:175] `, `[2025-10-06 10:00:00] `) uses the
file name and line of the logging call, as the engine's own formatter would. Tests read only
the committed texts (tests/unit/test_logs_engine_source.py); without the wheels this script
exits 2 and changes nothing. With only some wheels present it keeps the facts read before from the
absent ones (and renders no fixture if one needs an absent wheel), so the 200-400 MB wheels can
be read a few at a time. `facts.json` holds what kvgate.engines.versions is checked
against: the `--kv-cache-dtype` choices, the attention backend names and which flags and
environment variables each version reads.
"""

from __future__ import annotations

import argparse
import ast
import json
import string
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "engine-source"
WHEELS = {
    # 0.6.0-0.10.1: read for facts.json only (the version table below 0.10.2); no fixture.
    "vllm-0.6.0": "vllm-0.6.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.7.0": "vllm-0.7.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.8.0": "vllm-0.8.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.8.5": "vllm-0.8.5-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.9.0": "vllm-0.9.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.10.0": "vllm-0.10.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.10.1": "vllm-0.10.1-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.10.2": "vllm-0.10.2-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.11.0": "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.12.0": "vllm-0.12.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.13.0": "vllm-0.13.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.14.0": "vllm-0.14.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.15.0": "vllm-0.15.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.16.0": "vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.17.0": "vllm-0.17.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.18.0": "vllm-0.18.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.19.0": "vllm-0.19.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.20.0": "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl",
    "vllm-0.21.0": "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl",
    "vllm-0.22.0": "vllm-0.22.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.23.0": "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.24.0": "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.25.0": "vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.26.0": "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.27.0": "vllm-0.27.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.28.0": "vllm-0.28.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.29.0": "vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.30.0": "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.31.0": "vllm-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.32.0": "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.33.0": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "sglang-0.4.6": "sglang-0.4.6-py3-none-any.whl",
    "sglang-0.4.7": "sglang-0.4.7-py3-none-any.whl",
    "sglang-0.4.8": "sglang-0.4.8-py3-none-any.whl",
    "sglang-0.4.9": "sglang-0.4.9-py3-none-any.whl",
    "sglang-0.4.10.post2": "sglang-0.4.10.post2-py3-none-any.whl",
    "sglang-0.5.1": "sglang-0.5.1-py3-none-any.whl",
    "sglang-0.5.2": "sglang-0.5.2-py3-none-any.whl",
    "sglang-0.5.3": "sglang-0.5.3-py3-none-any.whl",
    "sglang-0.5.4": "sglang-0.5.4-py3-none-any.whl",
    "sglang-0.5.5": "sglang-0.5.5-py3-none-any.whl",
    "sglang-0.5.6": "sglang-0.5.6-py3-none-any.whl",
    "sglang-0.5.7": "sglang-0.5.7-py3-none-any.whl",
    "sglang-0.5.8": "sglang-0.5.8-py3-none-any.whl",
    "sglang-0.5.9": "sglang-0.5.9-py3-none-any.whl",
    "sglang-0.5.10": "sglang-0.5.10-py3-none-any.whl",
    "sglang-0.5.11": "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.12": "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.13": "sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.14": "sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.15": "sglang-0.5.15-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.16": "sglang-0.5.16-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.17": "sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.18": "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.19": "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.20": "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.21": "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.22": "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sglang-0.5.23": "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    "uvicorn-0.35.0": "uvicorn-0.35.0-py3-none-any.whl",
    "flashinfer-0.6.1": "flashinfer_python-0.6.1-py3-none-any.whl",
    # the Triton under an SGLang traceback (its frames and its fp8 error)
    "triton-3.9.0": "triton-3.9.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
}


# -- reading format strings --------------------------------------------------------------------


@dataclass
class Source:
    """One string literal found in a wheel: its template, holes and where it sits."""

    wheel: str
    path: str
    line: int  # line of the string literal
    call_line: int  # line of the enclosing call (the logger's %(lineno)d)
    parts: list[str | int]  # literal text and hole indices (f-strings)
    is_fstring: bool
    specs: list[tuple[str, int]] = field(default_factory=list)  # per hole: format spec, conversion

    def render(self, args: Sequence[Any]) -> str:
        if self.is_fstring:
            out = []
            for part in self.parts:
                if isinstance(part, str):
                    out.append(part)
                    continue
                spec, conversion = self.specs[part] if part < len(self.specs) else ("", -1)
                value = args[part]
                if conversion == ord("r"):
                    value = repr(value)
                elif conversion == ord("s"):
                    value = str(value)
                out.append(format(value, spec))
            return "".join(out)
        text = "".join(p for p in self.parts if isinstance(p, str))
        return text % tuple(args) if args else text


class Wheels:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._trees: dict[tuple[str, str], ast.Module] = {}

    def available(self, key: str) -> bool:
        return (self.directory / WHEELS[key]).is_file()

    def text(self, key: str, path: str) -> str:
        if key not in self._zips:
            self._zips[key] = zipfile.ZipFile(self.directory / WHEELS[key])
        return self._zips[key].read(path).decode("utf-8")

    def tree(self, key: str, path: str) -> ast.Module:
        if (key, path) not in self._trees:
            self._trees[(key, path)] = ast.parse(self.text(key, path))
        return self._trees[(key, path)]

    def find(self, key: str, path: str, needle: str, nth: int = 0) -> Source:
        """The `nth` string literal of `path` whose literal text contains `needle`."""
        tree = self.tree(key, path)
        parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        found: list[Source] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(parents.get(id(node))) in _fstring_ids(tree):
                    continue
                parts: list[str | int] = [node.value]
                specs: list[tuple[str, int]] = []
                is_f = False
            elif isinstance(node, ast.JoinedStr):
                parts, is_f = _fstring_parts(node), True
                specs = _fstring_specs(node)
            else:
                continue
            literal = "".join(p if isinstance(p, str) else "\x00" for p in parts)
            if needle not in literal:
                continue
            call = node
            while id(call) in parents and not isinstance(call, ast.Call):
                call = parents[id(call)]
            call_line = call.lineno if isinstance(call, ast.Call) else node.lineno
            found.append(Source(WHEELS[key], path, node.lineno, call_line, parts, is_f, specs))
        found.sort(key=lambda s: s.line)
        if len(found) <= nth:
            raise LookupError(f"{key} {path}: no string with {needle!r}")
        return found[nth]


_FSTRING_CACHE: dict[int, set[int]] = {}


def _fstring_ids(tree: ast.Module) -> set[int]:
    if id(tree) not in _FSTRING_CACHE:
        _FSTRING_CACHE[id(tree)] = {
            id(n) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr | ast.FormattedValue)
        }
    return _FSTRING_CACHE[id(tree)]


def _fstring_specs(node: ast.JoinedStr) -> list[tuple[str, int]]:
    specs: list[tuple[str, int]] = []
    for value in node.values:
        if isinstance(value, ast.FormattedValue):
            spec = ""
            if isinstance(value.format_spec, ast.JoinedStr):
                spec = "".join(
                    str(v.value) for v in value.format_spec.values if isinstance(v, ast.Constant)
                )
            specs.append((spec, value.conversion))
    return specs


def _fstring_parts(node: ast.JoinedStr) -> list[str | int]:
    parts: list[str | int] = []
    hole = 0
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        else:
            parts.append(hole)
            hole += 1
    return parts


# -- fixtures ----------------------------------------------------------------------------------


@dataclass
class Line:
    """One log line: a string found by needle (or several joined), rendered with `args`."""

    path: str
    needle: str | Sequence[str]
    args: Sequence[Any] = ()
    level: str = "INFO"
    tag: str = ""  # vLLM process tag, e.g. "(EngineCore_DP0 pid=93) "
    bare: str | None = None  # "raise": `ValueError: msg` without a header; "plain": no header
    exc: str = ""
    tp: str = ""  # SGLang header prefix, e.g. " TP0"
    template: dict[str, str] | None = None  # string.Template colours (vLLM logo)
    more_args: Sequence[Sequence[Any]] = ()  # args of the 2nd, 3rd... needle
    nth: int = 0
    key: str | None = None  # wheel key when not the fixture's (uvicorn)
    expand_dict: bool = False


@dataclass
class Fixture:
    name: str
    key: str
    engine: str
    lines: list[Line | str] = field(default_factory=list)  # str: rendered elsewhere (repr)


def _header(engine: str, key: str, line: Line, src: Source) -> str:
    if line.bare is not None:
        return ""
    if engine == "sglang":
        return f"[2025-10-06 10:00:00{line.tp}] "
    if line.key and line.key.startswith("uvicorn"):
        return f"{line.tag}{line.level}:     "
    name = src.path.rsplit("/", 1)[-1]
    return f"{line.tag}{line.level} 09-13 10:00:00 [{name}:{src.call_line}] "


def render(wheels: Wheels, fixture: Fixture) -> list[str]:
    out: list[str] = []
    for line in fixture.lines:
        if isinstance(line, str):
            out.append(line)
            continue
        key = line.key or fixture.key
        needles = [line.needle] if isinstance(line.needle, str) else list(line.needle)
        sources = [wheels.find(key, line.path, n, line.nth) for n in needles]
        arg_lists = [line.args, *line.more_args]
        texts = []
        for src, args in zip(sources, arg_lists + [()] * len(sources), strict=False):
            if line.template is not None:
                text = "".join(p for p in src.parts if isinstance(p, str))
                texts.append(string.Template(text).substitute(line.template) % tuple(args))
            else:
                texts.append(src.render(args))
        message = "".join(texts)
        where = " + ".join(f"{s.path}:{s.line}" for s in sources)
        rendered = _header(fixture.engine, key, line, sources[0])
        if line.bare == "raise":
            rendered += f"{line.exc}: "
        body = rendered + message
        count = body.count("\n") + 1
        suffix = f" ({count} lines)" if count > 1 else ""
        out.append(f"#: {WHEELS[key]} {where}{suffix}")
        out.append(body)
    return out


def _sglang_server_args_repr(wheels: Wheels, key: str, overrides: dict[str, Any]) -> list[str]:
    """`server_args=ServerArgs(...)` built from the dataclass fields in server_args.py."""
    path = "sglang/srt/server_args.py"
    tree = wheels.tree(key, path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields: list[str] = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name in overrides:
                value = overrides[name]
            else:
                try:
                    value = ast.literal_eval(node.value) if node.value is not None else None
                except ValueError:
                    value = None
            fields.append(f"{name}={value!r}")
    src = wheels.find(key, "sglang/srt/entrypoints/engine.py", "server_args=")
    return [
        f"#: {WHEELS[key]} {src.path}:{src.line} + {path}:{cls.lineno} (class ServerArgs fields, "
        "defaults via literal_eval, non-literal defaults as None)",
        f"[2025-10-06 10:00:00] server_args=ServerArgs({', '.join(fields)})",
    ]


def _sglang_server_args_dict(wheels: Wheels, key: str, values: dict[str, Any]) -> list[str]:
    src = wheels.find(key, "sglang/srt/entrypoints/engine.py", "server_args=")
    return [
        f"#: {WHEELS[key]} {src.path}:{src.line} (dict of resolved_dict(); keys chosen here)",
        f"[2025-10-06 10:00:00] server_args={values!r}",
    ]


V = "vllm"
S = "sglang"
CORE = "(EngineCore_DP0 pid=93) "
API = "(APIServer pid=1) "
KVU = "vllm/v1/core/kv_cache_utils.py"
KVC = "vllm/model_executor/layers/quantization/kv_cache.py"
UVI = "uvicorn/lifespan/on.py"
READY_V = Line(UVI, "Application startup complete.", tag=API, key="uvicorn-0.35.0")


def _v_banner(version: str, dtype: str, tag: str = CORE) -> Line:
    config = (
        "model='Qwen/Qwen3-8B', speculative_config=None, tokenizer='Qwen/Qwen3-8B', "
        f"dtype=torch.bfloat16, max_seq_len=4096, enforce_eager=False, kv_cache_dtype={dtype}, "
        "device_config=cuda, served_model_name=Qwen/Qwen3-8B"
    )
    return Line(
        "vllm/v1/engine/core.py", "Initializing a V1 LLM engine", (version, config), tag=tag
    )


def _v_scale_warnings(tag: str = "(EngineCore_DP0 pid=93) ") -> list[Line | str]:
    return [
        Line(KVC, "does not provide a q scaling factor", level="WARNING", tag=tag),
        Line(KVC, "Using KV cache scaling factor 1.0", level="WARNING", tag=tag),
        Line(KVC, "Using uncalibrated q_scale", (1.0, 1.0), level="WARNING", tag=tag),
    ]


def fixtures(wheels: Wheels) -> list[Fixture]:
    result: list[Fixture] = []
    # vLLM 0.10.2, FP8 on an L4: V1 refuses, V0 with XFormers, V0 capacity lines.
    f = Fixture("vllm-0.10.2-fp8-v0-fallback-ready", "vllm-0.10.2", V)
    f.lines += [
        Line(
            "vllm/entrypoints/openai/api_server.py",
            "vLLM API server version",
            ("0.10.2",),
            tag=API,
            nth=0,
        ),
        Line(
            "vllm/entrypoints/utils.py",
            "non-default args: %s",
            ({"model": "Qwen/Qwen3-8B", "kv_cache_dtype": "fp8"},),
            tag=API,
        ),
        Line(
            "vllm/config/cache.py",
            "Meanwhile, it may cause accuracy drop",
            tag=API,
        ),
        Line(
            "vllm/engine/arg_utils.py",
            ("is not supported by the V1 Engine. ", "Falling back to V0. "),
            ("--kv-cache-dtype",),
            level="WARNING",
            tag=API,
        ),
        Line(
            "vllm/engine/llm_engine.py",
            "Initializing a V0 LLM engine (v%s) with config: %s, ",
            ("0.10.2", "model='Qwen/Qwen3-8B', kv_cache_dtype=fp8", True),
            tag=API,
        ),
        Line("vllm/platforms/cuda.py", "Cannot use FlashAttention backend for FP8", tag=API),
        Line("vllm/platforms/cuda.py", "Using XFormers backend.", tag=API, nth=1),
        *_v_scale_warnings(API),
        Line(
            "vllm/worker/worker.py",
            "Memory profiling takes",
            (10.5, 22.03, 0.9, 19.83, 15.27, 0.12, 1.2, 3.24),
            tag=API,
        ),
        Line("vllm/executor/executor_base.py", "# %s blocks: %d", ("cuda", 2654, 2048), tag=API),
        Line(
            "vllm/executor/executor_base.py",
            "Maximum concurrency for %s tokens per request",
            (4096, 2654 * 16 / 4096),
            tag=API,
        ),
        READY_V,
    ]
    result.append(f)
    # vLLM 0.10.2 with VLLM_ATTENTION_BACKEND=TRITON_ATTN (the 0.11 name): rejected.
    members = _enum_members(wheels, "vllm-0.10.2", "vllm/platforms/interface.py", "_Backend")
    f = Fixture("vllm-0.10.2-triton-attn-invalid", "vllm-0.10.2", V)
    f.lines += [
        Line("vllm/entrypoints/openai/api_server.py", "vLLM API server version", ("0.10.2",)),
        _v_banner("0.10.2", "auto"),
        Line("vllm/v1/engine/core.py", "EngineCore failed to start.", level="ERROR", tag=CORE),
        Line(
            "vllm/attention/selector.py",
            "Invalid attention backend: '",
            ("TRITON_ATTN", members),
            bare="raise",
            exc="ValueError",
        ),
        Line(
            "vllm/v1/engine/utils.py",
            "Engine core initialization failed. ",
            ({"EngineCore_DP0": 1},),
            bare="raise",
            exc="RuntimeError",
        ),
    ]
    result.append(f)
    # vLLM 0.11.0 on an L4: FP8 falls back to Triton silently.
    f = Fixture("vllm-0.11.0-fp8-triton-ready", "vllm-0.11.0", V)
    f.lines += [
        Line(
            "vllm/entrypoints/openai/api_server.py", "vLLM API server version", ("0.11.0",), tag=API
        ),
        Line("vllm/config/cache.py", "Meanwhile, it may cause accuracy drop", tag=API),
        _v_banner("0.11.0", "fp8"),
        Line("vllm/platforms/cuda.py", "Using Triton backend on V1 engine.", tag=CORE),
        *_v_scale_warnings(),
        Line("vllm/v1/worker/gpu_worker.py", "Available KV cache memory", (5.52,), tag=CORE),
        Line(KVU, "GPU KV cache size: %s tokens", ("80,368",), tag=CORE),
        Line(KVU, "Maximum concurrency for %s tokens", ("4,096", 19.62), tag=CORE),
        READY_V,
    ]
    result.append(f)
    # vLLM 0.15.0 and 0.20.0: FP8 picks FlashInfer; version only in the logo.
    logo = {"w": "", "o": "", "b": "", "r": ""}
    for version, dtype in (("0.15.0", ()), ("0.20.0", ("fp8",))):
        f = Fixture(f"vllm-{version}-fp8-flashinfer-ready", f"vllm-{version}", V)
        f.lines += [
            Line(
                "vllm/entrypoints/utils.py",
                "version ${w}%s${r}",
                (version, "Qwen/Qwen3-8B"),
                tag=API,
                template=logo,
            ),
            # 0.20 formats the dtype in ("Using %s data type"), 0.15 has it in the text
            Line("vllm/config/cache.py", "Meanwhile, it may cause accuracy drop", dtype, tag=API),
            _v_banner(version, "fp8"),
            Line(
                "vllm/platforms/cuda.py",
                "attention backend out of potential backends",
                ("FLASHINFER", ("FLASHINFER", "TRITON_ATTN")),
                tag=CORE,
            ),
            *_v_scale_warnings(),
            Line("vllm/v1/worker/gpu_worker.py", "Available KV cache memory", ("5.5",), tag=CORE),
            Line(KVU, "GPU KV cache size: %s tokens", ("80,080",), tag=CORE),
            Line(KVU, "Maximum concurrency for %s tokens", ("4,096", 19.55), tag=CORE),
            READY_V,
        ]
        result.append(f)
    # vLLM 0.15.0 on an L4 without nvcc: FlashInfer's JIT build fails inside EngineCore. The
    # banner is left out: a front end that dies before EngineCore logs only the logo.
    f = Fixture("vllm-0.15.0-fp8-flashinfer-jit-failed", "vllm-0.15.0", V)
    f.lines += [
        Line(
            "vllm/entrypoints/utils.py",
            "version ${w}%s${r}",
            ("0.15.0", "Qwen/Qwen3-8B"),
            tag=API,
            template=logo,
        ),
        Line("vllm/config/cache.py", "Meanwhile, it may cause accuracy drop", tag=API),
        Line(
            "vllm/platforms/cuda.py",
            "attention backend out of potential backends",
            ("FLASHINFER", ("FLASHINFER", "TRITON_ATTN")),
            tag=CORE,
        ),
        Line("vllm/v1/engine/core.py", "EngineCore failed to start.", level="ERROR", tag=CORE),
        Line(
            "flashinfer/jit/cpp_ext.py",
            "Ninja build failed.",
            bare="raise",
            exc="RuntimeError",
            key="flashinfer-0.6.1",
        ),
        Line(
            "vllm/v1/engine/utils.py",
            "Engine core initialization failed. ",
            ({"EngineCore_DP0": 1},),
            bare="raise",
            exc="RuntimeError",
        ),
    ]
    result.append(f)
    # vLLM 0.15.0 with an explicit FLASH_ATTN on an L4: the selector refuses FP8.
    f = Fixture("vllm-0.15.0-fp8-flash-attn-refused", "vllm-0.15.0", V)
    f.lines += [
        Line(
            "vllm/entrypoints/utils.py",
            "version ${w}%s${r}",
            ("0.15.0", "Qwen/Qwen3-8B"),
            tag=API,
            template=logo,
        ),
        _v_banner("0.15.0", "fp8"),
        Line("vllm/v1/engine/core.py", "EngineCore failed to start.", level="ERROR", tag=CORE),
        Line(
            "vllm/platforms/cuda.py",
            "is not valid for ",
            ("AttentionBackendEnum.FLASH_ATTN", ["kv_cache_dtype not supported"]),
            bare="raise",
            exc="ValueError",
        ),
    ]
    result.append(f)
    # vLLM 0.33.0 with FlashInfer: its own kv_cache_dtype=torch.float8_e4m3fn line; the env
    # variable of old versions is unknown.
    f = Fixture("vllm-0.33.0-fp8-flashinfer-ready", "vllm-0.33.0", V)
    core33 = "(EngineCore pid=93) "
    f.lines += [
        Line(
            "vllm/platforms/interface.py",
            "Unknown vLLM environment variable detected: %s",
            ("VLLM_ATTENTION_BACKEND",),
            level="WARNING",
            tag=API,
        ),
        Line(
            "vllm/entrypoints/common/startup.py",
            "version ${w}%s${r}",
            ("0.33.0", "Qwen/Qwen3-8B"),
            tag=API,
            template=logo,
        ),
        Line("vllm/config/cache.py", "Meanwhile, it may cause accuracy drop", ("fp8",), tag=API),
        _v_banner("0.33.0", "fp8", core33),
        Line(
            "vllm/platforms/cuda.py",
            "attention backend out of potential backends",
            ("FLASHINFER", "['FLASHINFER', 'TRITON_ATTN']"),
            tag=core33,
        ),
        *_v_scale_warnings(core33),
        Line(
            "vllm/v1/attention/backends/flashinfer.py",
            "FlashInfer resolved query dtypes",
            ("torch.bfloat16", "torch.bfloat16", "fa2", "torch.float8_e4m3fn", "sm89"),
            tag=core33,
        ),
        Line("vllm/v1/worker/gpu_worker.py", "Available KV cache memory", ("5.5",), tag=core33),
        Line(
            KVU,
            "%s KV cache size: %s tokens, ",
            ("GPU", "80,080", "4,096", 19.55),
            tag=core33,
        ),
        READY_V,
    ]
    result.append(f)
    # SGLang 0.4.10.post2: ServerArgs repr, default backend, scale warning, pool, summary.
    for key, pool_path, runner in (
        (
            "sglang-0.4.10.post2",
            "sglang/srt/mem_cache/memory_pool.py",
            "model_executor/model_runner.py",
        ),
        ("sglang-0.5.3", "sglang/srt/mem_cache/memory_pool.py", "model_executor/model_runner.py"),
    ):
        version = key.split("-", 1)[1]
        f = Fixture(f"{key}-fp8-tp2-ready", key, S)
        f.lines.extend(
            _sglang_server_args_repr(
                wheels,
                key,
                {"model_path": "Qwen/Qwen3-8B", "kv_cache_dtype": "fp8_e4m3", "tp_size": 2},
            )
        )
        f.lines += [
            Line(
                f"sglang/srt/{runner}",
                "Attention backend not explicitly specified",
                ("flashinfer",),
                tp=" TP0",
            ),
            Line(f"sglang/srt/{runner}", "no scaling factors", tp=" TP0"),
            Line(f"sglang/srt/{runner}", "no scaling factors", tp=" TP1"),
        ]
        if version == "0.5.3":
            f.lines.append(
                Line(
                    f"sglang/srt/{runner}",
                    "Using KV cache dtype: ",
                    ("torch.float8_e4m3fn",),
                    tp=" TP0",
                )
            )
        f.lines += [
            Line(pool_path, "KV Cache is allocated. #tokens: ", (454112, 3.46, 3.46), tp=" TP0"),
            Line(
                "sglang/srt/managers/scheduler.py",
                "max_total_num_tokens=",
                (454112, 8192, 16384, 2048, 40960)
                + (("available_gpu_mem", 8.4) if version == "0.5.3" else (8.4,)),
                tp=" TP0",
            ),
            Line("sglang/srt/entrypoints/http_server.py", "fired up and ready to roll"),
        ]
        result.append(f)
    # SGLang 0.5.10: backend default moved to server_args.py; single GPU: no TP0 prefix.
    f = Fixture("sglang-0.5.10-fp8-ready", "sglang-0.5.10", S)
    f.lines.extend(
        _sglang_server_args_repr(
            wheels, "sglang-0.5.10", {"model_path": "Qwen/Qwen3-8B", "kv_cache_dtype": "fp8_e4m3"}
        )
    )
    f.lines += [
        Line("sglang/srt/server_args.py", "Attention backend not specified. Use", ("flashinfer",)),
        Line("sglang/srt/model_executor/model_runner.py", "no scaling factors"),
        Line(
            "sglang/srt/model_executor/model_runner.py",
            "Using KV cache dtype: ",
            ("torch.float8_e4m3fn",),
        ),
        Line(
            "sglang/srt/mem_cache/memory_pool.py",
            "KV Cache is allocated. #tokens: ",
            (454112, 3.46, 3.46),
        ),
        Line(
            "sglang/srt/managers/scheduler.py",
            "max_total_num_tokens=",
            (454112, 8192, 16384, 2048, 40960, "available_gpu_mem", 8.4),
        ),
        Line("sglang/srt/entrypoints/http_server.py", "fired up and ready to roll"),
    ]
    result.append(f)
    # SGLang 0.5.23: server_args as a dict; explicit triton; a crash before the pool.
    f = Fixture("sglang-0.5.23-fp8-triton-crash", "sglang-0.5.23", S)
    f.lines.extend(
        _sglang_server_args_dict(
            wheels,
            "sglang-0.5.23",
            {
                "model_path": "Qwen/Qwen3-8B",
                "tp_size": 1,
                "kv_cache_dtype": "fp8_e4m3",
                "attention_backend": "triton",
                "host": "0.0.0.0",
                "port": 30000,
            },
        )
    )
    f.lines += [
        Line(
            "sglang/srt/managers/scheduler.py",
            "Scheduler hit an exception: ",
            ("Traceback (most recent call last):",),
            level="ERROR",
        ),
        Line(
            "sglang/srt/entrypoints/engine.py",
            "Received sigquit from a child process",
            nth=0,
        ),
    ]
    result.append(f)
    # The same start on a GPU below sm89 (an A100): Triton cannot type the decode kernel's
    # fp8e4nv K/V pointers, and the scheduler's traceback ends in its CompilationError. The
    # traceback is the `{traceback}` hole of the scheduler's line, its frames read from the two
    # wheels (`_frame`), its last line Triton's own error (triton/language/core.py:599).
    f = Fixture("sglang-0.5.23-fp8-triton-sm80-crash", "sglang-0.5.23", S)
    f.lines.extend(
        _sglang_server_args_dict(
            wheels,
            "sglang-0.5.23",
            {
                "model_path": "Qwen/Qwen3-8B",
                "tp_size": 1,
                "kv_cache_dtype": "fp8_e4m3",
                "attention_backend": "triton",
                "host": "0.0.0.0",
                "port": 30000,
            },
        )
    )
    where, traceback = _fp8e4nv_traceback(wheels)
    f.lines += [
        f"#: frames: {where}",
        Line(
            "sglang/srt/managers/scheduler.py",
            "Scheduler hit an exception: ",
            (traceback,),
            level="ERROR",
        ),
        Line(
            "sglang/srt/entrypoints/engine.py",
            "Received sigquit from a child process",
            nth=0,
        ),
    ]
    result.append(f)
    f = Fixture("sglang-0.5.23-fp8-ready", "sglang-0.5.23", S)
    f.lines.extend(
        _sglang_server_args_dict(
            wheels,
            "sglang-0.5.23",
            {
                "model_path": "Qwen/Qwen3-8B",
                "kv_cache_dtype": "fp8_e4m3",
                "attention_backend": None,
            },
        )
    )
    arg_lines = len(f.lines)
    f.lines += [
        Line(
            "sglang/srt/arg_groups/overrides.py",
            "Attention backend not specified. Use",
            ("flashinfer",),
        ),
        Line(
            "sglang/srt/model_executor/model_runner_components/load_model_utils.py",
            "no scaling factors",
        ),
        Line(
            "sglang/srt/mem_cache/memory_pool.py",
            ". dtype: ",
            ("KV Cache", "is allocated", "torch.float8_e4m3fn", 454112, 3.46, 3.46),
        ),
        Line(
            "sglang/srt/managers/scheduler.py",
            "max_total_num_tokens=",
            (454112, 8192, 16384, 2048, 40960, "available_gpu_mem", 8.4),
        ),
        Line("sglang/srt/entrypoints/http_server.py", "fired up and ready to roll"),
    ]
    result.append(f)
    # SGLang 0.5.23 on a compressed-tensors FP8 KV checkpoint whose attention layers have no k/v
    # scale parameter: maybe_remap_kv_scale_name drops the scales with a warning (sglang#35455,
    # 2026-08-19, made them load); the 1.0 warning SGLang prints anyway proves nothing
    # (sglang#31224). The rest is the served startup above.
    served = f.lines[arg_lines:]  # backend, the 1.0 line, pool, token budget, ready
    f = Fixture("sglang-0.5.23-fp8-scales-dropped", "sglang-0.5.23", S)
    f.lines.extend(
        _sglang_server_args_dict(
            wheels,
            "sglang-0.5.23",
            {
                "model_path": "RedHatAI/Qwen3-8B-FP8-KV",
                "kv_cache_dtype": "fp8_e4m3",
                "attention_backend": None,
            },
        )
    )
    # print_warning_once: one line for k, one for v, whatever the number of layers
    dropped = [
        Line(
            "sglang/srt/model_loader/weight_utils.py",
            "but not found the expected name in the model",
            (
                f".{kv}_scale",
                f"model.layers.0.self_attn.{kv}_scale",
                f"model.layers.0.self_attn.attn.{kv}_scale",
                f".{kv}_scale",
            ),
            nth=1,
        )
        for kv in "kv"
    ]
    f.lines += [served[0], *dropped, *served[1:]]
    result.append(f)
    return result


_SITE = "/usr/local/lib/python3.11/site-packages/"


def _frame(
    wheels: Wheels, key: str, path: str, function: str, needle: str, shown: str | None = None
) -> tuple[str, str]:
    """One traceback frame as Python 3.11 prints it (its `^` markers left out): the first line
    of `function` in `path` that holds `needle`, and where it was read. `shown`: the name
    Python prints when the frame is a lambda inside `function`."""
    lines = wheels.text(key, path).splitlines()
    for node in ast.walk(wheels.tree(key, path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            end = node.end_lineno or node.lineno
            for n in range(node.lineno, end + 1):
                if needle in lines[n - 1]:
                    text = lines[n - 1].strip()
                    frame = f'  File "{_SITE}{path}", line {n}, in {shown or function}\n    {text}'
                    return frame, f"{path}:{n}"
    raise LookupError(f"{key} {path}: no line with {needle!r} in {function}")


def _fp8e4nv_traceback(wheels: Wheels) -> tuple[str, str]:
    """SGLang's scheduler dying in Triton's compile of the FP8 decode kernel: where each frame
    was read, and the traceback (frames between the model runner's construction and the
    attention backend's decode call are left out: the chain there has no fixed depth)."""
    sg, tr = "sglang-0.5.23", "triton-3.9.0"
    sched, kernels = "sglang/srt/managers/scheduler.py", "sglang/kernels/ops/attention/"
    jit, compiler = "triton/runtime/jit.py", "triton/compiler/"
    frames = [
        (sg, sched, "run_scheduler_process", "Scheduler(", None),
        (sg, sched, "__init__", "self.init_model_worker()", None),
        (sg, sched, "init_model_worker", "self.init_tp_model_worker()", None),
        (sg, sched, "init_tp_model_worker", "= TpModelWorker(**worker_kwargs)", None),
        (sg, "sglang/srt/managers/tp_worker.py", "__init__", "self._init_model_runner()", None),
        (sg, "sglang/srt/managers/tp_worker.py", "_init_model_runner", "ModelRunner(", None),
        (sg, "sglang/srt/model_executor/model_runner.py", "__init__", "self.initialize(", None),
        (sg, "sglang/srt/layers/attention/triton_backend.py", "forward_decode",
         "self.decode_attention_fwd(", None),
        (sg, kernels + "decode_attention.py", "decode_attention_fwd",
         "decode_attention_fwd_grouped(", None),
        (sg, kernels + "decode_attention.py", "decode_attention_fwd_grouped",
         "_decode_grouped_att_m_fwd(", None),
        (sg, kernels + "decode_attention.py", "_decode_grouped_att_m_fwd",
         "_fwd_grouped_kernel_stage1[grid](", None),
        (tr, jit, "__getitem__", "lambda *args, **kwargs: self.run(", "<lambda>"),
        (tr, jit, "run", "kernel = self._do_compile(", None),
        (tr, jit, "_do_compile", "kernel = self.compile(src, target=target, options", None),
        (tr, compiler + "compiler.py", "compile", "module = src.make_ir(", None),
        (tr, compiler + "compiler.py", "make_ir", "return ast_to_ttir(", None),
        (tr, compiler + "code_generator.py", "ast_to_ttir", "generator.visit(fn.parse())", None),
        (tr, compiler + "code_generator.py", "visit", "raise CompilationError(", None),
    ]  # fmt: skip
    read = [_frame(wheels, key, path, fn, needle, shown) for key, path, fn, needle, shown in frames]
    # the error: ValueError(f"type {self} not supported in this architecture. The supported
    # fp8 dtypes are {...}"), below sm89 ('fp8e4b15', 'fp8e5') (triton/backends/nvidia/
    # compiler.py:137 and :241, sorted), wrapped as CompilationError(src, node, repr(e))
    error = wheels.find(tr, "triton/language/core.py", "not supported in this architecture")
    message = error.render(("fp8e4nv", ("fp8e4b15", "fp8e5")))
    kernel = wheels.text(sg, kernels + "decode_attention.py").splitlines()
    head = next(line for line in kernel if line.startswith("def _fwd_grouped_kernel_stage1("))
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            *(frame for frame, _ in read),
            f"triton.compiler.errors.CompilationError: at 1:0:\n{head}\n^",
            repr(ValueError(message)),
        ]
    )
    read_in = {key: [w for (k, *_), (_, w) in zip(frames, read, strict=True) if k == key]
               for key in (sg, tr)}  # fmt: skip
    where = " ".join(
        [
            WHEELS[sg],
            *read_in[sg],
            WHEELS[tr],
            *read_in[tr],
            f"triton/language/core.py:{error.line}",
        ]
    )
    return f"{where} (frames from initialize() to forward_decode left out)", text


def _enum_members(wheels: Wheels, key: str, path: str, name: str) -> list[str]:
    tree = wheels.tree(key, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [
                t.id
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                for t in stmt.targets
                if isinstance(t, ast.Name)
            ]
    raise LookupError(f"{key} {path}: no class {name}")


# -- facts ---------------------------------------------------------------------------------------


def _literal_alias(wheels: Wheels, key: str, path: str, name: str) -> list[str]:
    tree = wheels.tree(key, path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            sub = node.value
            if isinstance(sub, ast.Subscript):
                elts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
                return [e.value for e in elts if isinstance(e, ast.Constant)]
    raise LookupError(f"{key} {path}: no Literal alias {name}")


def _contains(wheels: Wheels, key: str, path: str, needle: str) -> bool:
    try:
        return needle in wheels.text(key, path)
    except KeyError:
        return False


def _vllm_backends(wheels: Wheels, key: str) -> list[str]:
    for path, name in (
        ("vllm/v1/attention/backends/registry.py", "AttentionBackendEnum"),
        ("vllm/attention/backends/registry.py", "AttentionBackendEnum"),
        ("vllm/platforms/interface.py", "_Backend"),
        ("vllm/attention/selector.py", "_Backend"),  # 0.6
    ):
        try:
            return _enum_members(wheels, key, path, name)
        except (KeyError, LookupError):
            continue
    raise LookupError(f"{key}: no attention backend enum")


def _sglang_choices(wheels: Wheels, key: str, flag: str) -> list[str]:
    """Choices of an argparse flag: the `choices=` list literal or named constant."""
    names = [n for n in wheels._zip_names(key) if n.startswith("sglang/srt/") and n.endswith(".py")]
    for path in names:
        text = wheels.text(key, path)
        if f'"{flag}"' not in text:
            continue
        tree = wheels.tree(key, path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if not any(isinstance(a, ast.Constant) and a.value == flag for a in node.args):
                continue
            for kw in node.keywords:
                if kw.arg == "choices":
                    try:
                        return list(ast.literal_eval(kw.value))
                    except ValueError:
                        return _resolve_name(wheels, key, kw.value)
    # 0.5.23: `kv_cache_dtype: A[str, Arg(choices=[...])]` fields in sglang/srt/arg_groups/
    field_name = flag[2:].replace("-", "_")
    for path in names:
        if f"{field_name}: A[" not in wheels.text(key, path):
            continue
        for node in ast.walk(wheels.tree(key, path)):
            if not (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == field_name
            ):
                continue
            for call in ast.walk(node.annotation):
                for kw in getattr(call, "keywords", []):
                    if kw.arg == "choices":
                        try:
                            return list(ast.literal_eval(kw.value))
                        except ValueError:
                            return _resolve_name(wheels, key, kw.value)
    return []


def _resolve_name(wheels: Wheels, key: str, node: ast.expr) -> list[str]:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    for path in wheels._zip_names(key):
        if not (path.startswith("sglang/srt/") and path.endswith(".py")):
            continue
        if f"{name} =" not in wheels.text(key, path):
            continue
        for stmt in ast.walk(wheels.tree(key, path)):  # 0.5.1: a local of add_cli_args
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets
            ):
                try:
                    return list(ast.literal_eval(stmt.value))
                except ValueError:
                    return [f"<{name}: not a literal>"]
    return [f"<{name}: not found>"]


# Log text kvgate.evidence.logs reads (each a needle of one of its rules) that must be in every version's
# source: which of them a wheel holds is recorded as `log_strings` (a raw substring search of
# the engine's .py files; strings split across literals are not listed here).
LOG_STRINGS: dict[str, dict[str, str]] = {
    "vllm": {
        "kv-memory": "Available KV cache memory: ",
        "kv-size": "KV cache size: ",
        "concurrency": "Maximum concurrency for ",
        "banner": " LLM engine (v",
        "dtype": "data type to store kv cache",
        "scale-default": "Using KV cache scaling factor 1.0",
        "q-scale": "does not provide a q scaling factor",
        "backend-auto": "attention backend out of potential backends",
    },
    "sglang": {
        "pool": "KV Cache ",
        "pool-post": "Post-capture KV sizing: KV cache allocated.",
        "summary": "max_total_num_tokens=",
        "ready": "The server is fired up and ready to roll",
        "server-args": "server_args=",
    },
}


def _log_strings(wheels: Wheels, key: str, engine: str) -> list[str]:
    package = "vllm/" if engine == "vllm" else "sglang/srt/"
    found: set[str] = set()
    for path in wheels._zip_names(key):
        if not (path.startswith(package) and path.endswith(".py")):
            continue
        text = wheels.text(key, path)
        found.update(name for name, s in LOG_STRINGS[engine].items() if s in text)
    return sorted(found)


def facts(wheels: Wheels) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in WHEELS:
        if not wheels.available(key) or not key.startswith(("vllm", "sglang")):
            continue
        entry: dict[str, Any] = {"wheel": WHEELS[key]}
        if key.startswith("vllm"):
            config = _vllm_cache_config_path(wheels, key)
            entry["kv_cache_dtypes"] = sorted(_vllm_kv_cache_dtypes(wheels, key, config))
            entry["attention_backends"] = _vllm_backends(wheels, key)
            envs = wheels.text(key, "vllm/envs.py")
            entry["env_VLLM_ATTENTION_BACKEND"] = '"VLLM_ATTENTION_BACKEND"' in envs
            entry["env_VLLM_USE_FLASHINFER_SAMPLER"] = '"VLLM_USE_FLASHINFER_SAMPLER"' in envs
            args = wheels.text(key, "vllm/engine/arg_utils.py")
            entry["flag_attention_backend"] = '"--attention-backend"' in args
            entry["flag_attention_config"] = '"--attention-config"' in args
            cache = wheels.text(key, config)
            entry["calculate_kv_scales"] = "calculate_kv_scales" in cache
            # 0.19-0.27: a field validator warns "The `--calculate-kv-scales` option is
            # deprecated and will be removed" (vllm/config/cache.py:240 in 0.20.0).
            entry["calculate_kv_scales_deprecated"] = (
                "def _warn_deprecated_calculate_kv_scales" in cache
            )
            entry["log_strings"] = _log_strings(wheels, key, "vllm")
        else:
            entry["kv_cache_dtypes"] = sorted(_sglang_choices(wheels, key, "--kv-cache-dtype"))
            entry["attention_backends"] = sorted(
                _sglang_choices(wheels, key, "--attention-backend")
            )
            entry["log_strings"] = _log_strings(wheels, key, "sglang")
            # the KV dtype source SGLang's /metrics lack (kvgate.evidence.metrics.SERVER_INFO_PATHS)
            http = wheels.text(key, "sglang/srt/entrypoints/http_server.py")
            entry["endpoints_server_info"] = [
                p for p in ("/get_server_info", "/server_info") if f'@app.get("{p}")' in http
            ]
        out[key] = entry
    return out


def _vllm_cache_config_path(wheels: Wheels, key: str) -> str:
    """CacheConfig's module: vllm/config/cache.py from 0.10.2, the one vllm/config.py before."""
    if _contains(wheels, key, "vllm/config/cache.py", ""):
        return "vllm/config/cache.py"
    return "vllm/config.py"


def _vllm_kv_cache_dtypes(wheels: Wheels, key: str, config: str) -> list[str]:
    """`CacheDType` (0.8.5+), else the argparse `choices=` of `--kv-cache-dtype` (0.6-0.8.4)."""
    try:
        return _literal_alias(wheels, key, config, "CacheDType")
    except LookupError:
        pass
    path = "vllm/engine/arg_utils.py"
    for node in ast.walk(wheels.tree(key, path)):
        if isinstance(node, ast.Call) and any(
            isinstance(a, ast.Constant) and a.value == "--kv-cache-dtype" for a in node.args
        ):
            for kw in node.keywords:
                if kw.arg == "choices":
                    return list(ast.literal_eval(kw.value))
    raise LookupError(f"{key}: no --kv-cache-dtype choices")


def _zip_names(self: Wheels, key: str) -> list[str]:
    self.text(key, "sglang/__init__.py" if key.startswith("sglang") else "vllm/__init__.py")
    return self._zips[key].namelist()


Wheels._zip_names = _zip_names  # type: ignore[attr-defined]


# -- main ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    wheels = Wheels(args.wheels)
    missing = [k for k in WHEELS if not wheels.available(k)]
    if len(missing) == len(WHEELS):
        print(
            f"no wheels in {args.wheels}; the committed fixtures stay as they are", file=sys.stderr
        )
        return 2
    changed = 0
    try:
        chosen = list(fixtures(wheels) if not missing else _available(wheels, missing))
    except FileNotFoundError as exc:  # a fixture needs a wheel that is absent
        print(f"fixtures not rendered (wheel absent: {exc.filename})", file=sys.stderr)
        chosen = []
    for fixture in chosen:
        text = (
            "\n".join(
                [f"#: engine={fixture.engine} source={fixture.key}", *render(wheels, fixture)]
            )
            + "\n"
        )
        changed += _write(args, OUT / f"{fixture.name}.log", text)
    # A wheel absent this time keeps the facts read from it before (wheels are 200-400 MB:
    # read a few, delete them, read the next).
    kept = json.loads((OUT / "facts.json").read_text()) if (OUT / "facts.json").exists() else {}
    read = {k: v for k, v in kept.items() if k in WHEELS and k in missing} | facts(wheels)
    text = json.dumps(read, indent=1, sort_keys=True) + "\n"
    changed += _write(args, OUT / "facts.json", text)
    if missing:
        print(f"skipped (wheel absent): {', '.join(missing)}", file=sys.stderr)
    return 1 if args.check and changed else 0


def _available(wheels: Wheels, missing: list[str]) -> Iterator[Fixture]:
    for fixture in fixtures(wheels):
        if fixture.key not in missing:
            yield fixture


def _write(args: argparse.Namespace, path: Path, text: str) -> int:
    old = path.read_text() if path.exists() else None
    if old == text:
        return 0
    if args.check:
        print(f"differs: {path}", file=sys.stderr)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
