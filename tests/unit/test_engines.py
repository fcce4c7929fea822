"""kvgate.engines.launch: recognise vLLM / SGLang containers, read and rewrite their flags."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvgate.engines import versions as engine_versions
from kvgate.engines.launch import (
    FACTS,
    detect_engine,
    rewrite_container,
    validate_kv_cache_dtype,
)
from kvgate.errors import SpecError, UnsupportedError
from kvgate.vocabulary import Engine


def container(
    command: list[str] | None = None, args: list[str] | None = None, image: str = "python:3.11"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "server", "image": image}
    if command is not None:
        spec["command"] = command
    if args is not None:
        spec["args"] = args
    return spec


DETECT = [
    # container, engine, model, port, kv dtype
    (container(["vllm", "serve", "Qwen/Qwen3-8B"]), "vllm", "Qwen/Qwen3-8B", 8000, "auto"),
    (
        container(
            ["/usr/local/bin/vllm"], ["serve", "m", "--port=9000", "--kv-cache-dtype", "fp8"]
        ),
        "vllm",
        "m",
        9000,
        "fp8",
    ),
    (
        container(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"]),
        "vllm",
        "M",
        8000,
        "auto",
    ),
    (
        container(
            ["python3", "-m", "sglang.launch_server"], ["--model-path", "M", "--port", "31000"]
        ),
        "sglang",
        "M",
        31000,
        "auto",
    ),
    (
        container(["sglang", "serve", "--model-path", "M", "--kv-cache-dtype=fp8_e4m3"]),
        "sglang",
        "M",
        30000,
        "fp8_e4m3",
    ),
    # the image entrypoint is the vLLM API server: args only
    (
        container(
            args=["--model", "M", "--kv_cache_dtype", "fp8_e5m2"], image="vllm/vllm-openai:v0.11.0"
        ),
        "vllm",
        "M",
        8000,
        "fp8_e5m2",
    ),
    (
        container(args=["--model-path", "M"], image="docker.io/lmsysorg/sglang:v0.5.3-cu126"),
        "sglang",
        "M",
        30000,
        "auto",
    ),
    # wrappers that pass the engine command line through are recognised by the same rules
    (
        container(["python", "-m", "kvgate.sim", "vllm", "serve", "Qwen/Qwen3-8B"]),
        "vllm",
        "Qwen/Qwen3-8B",
        8000,
        "auto",
    ),
    (
        container(["python", "-m", "kvgate.sim", "sglang"], ["--model-path", "Qwen/Qwen3-8B"]),
        "sglang",
        "Qwen/Qwen3-8B",
        30000,
        "auto",
    ),
    (
        container(["/bin/sh", "-c", "exec vllm serve M --kv-cache-dtype fp8 --port 8080"]),
        "vllm",
        "M",
        8080,
        "fp8",
    ),
]


@pytest.mark.parametrize(("spec", "engine", "model", "port", "dtype"), DETECT)
def test_detect_engine(
    spec: dict[str, Any], engine: str, model: str, port: int, dtype: str
) -> None:
    info = detect_engine(spec)
    assert (info.engine, info.model, info.port, info.kv_cache_dtype) == (engine, model, port, dtype)
    assert info.metrics_path == "/metrics"


def test_detect_reads_revision_served_name_and_backend() -> None:
    info = detect_engine(
        container(
            ["vllm", "serve", "M"],
            [
                "--revision",
                "abc123",
                "--served-model-name",
                "qwen",
                "--attention-backend=FLASHINFER",
            ],
        )
    )
    assert (info.revision, info.served_model_name, info.attention_backend) == (
        "abc123",
        "qwen",
        "FLASHINFER",
    )


def test_vllm_backend_from_environment() -> None:
    spec = container(["vllm", "serve", "M"])
    spec["env"] = [{"name": "VLLM_ATTENTION_BACKEND", "value": "TRITON_ATTN"}]
    assert detect_engine(spec).attention_backend == "TRITON_ATTN"


def test_last_flag_wins_like_argparse() -> None:
    info = detect_engine(
        container(["vllm", "serve", "M", "--kv-cache-dtype", "fp8", "--kv-cache-dtype=auto"])
    )
    assert info.kv_cache_dtype == "auto"


def test_sglang_metrics_and_loopback_findings() -> None:
    info = detect_engine(container(["python3", "-m", "sglang.launch_server", "--model-path", "M"]))
    assert not info.metrics_enabled
    assert info.host == "127.0.0.1"
    assert info.findings == (
        "SGLang listens on 127.0.0.1: other pods cannot reach it; add --host 0.0.0.0",
        "sglang serves /metrics only with --enable-metrics",
    )
    enabled = detect_engine(
        container(
            [
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "M",
                "--enable-metrics",
                "--host",
                "0.0.0.0",
            ]
        )
    )
    assert (enabled.metrics_enabled, enabled.findings) == (True, ())


def test_config_file_flags_are_invisible() -> None:
    info = detect_engine(container(["vllm", "serve", "M", "--config", "/etc/vllm.yaml"]))
    assert info.findings == (
        "flags in --config /etc/vllm.yaml are not visible here; kvgate reads command and args only",
    )


def test_boolean_flag_does_not_swallow_the_model() -> None:
    info = detect_engine(container(["vllm", "serve", "--trust-remote-code", "--model", "M"]))
    assert info.model == "M"


NOT_ENGINES = [
    (
        container(["nginx", "-g", "daemon off;"], image="nginx"),
        "container 'server' (image 'nginx') runs neither vLLM nor SGLang: no `vllm`/`sglang` "
        "command word or `-m vllm…`/`-m sglang…` module before the first flag",
    ),
    # a model path that ends in /vllm is a flag value, not a launcher
    (
        container(["python", "serve.py", "--model", "/models/vllm"]),
        "container 'server' (image 'python:3.11') runs neither vLLM nor SGLang: no `vllm`/`sglang` "
        "command word or `-m vllm…`/`-m sglang…` module before the first flag",
    ),
]


@pytest.mark.parametrize(("spec", "message"), NOT_ENGINES)
def test_not_an_engine(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedError) as caught:
        detect_engine(spec)
    assert str(caught.value) == message


def test_bad_port_and_bad_lists() -> None:
    with pytest.raises(SpecError) as caught:
        detect_engine(container(["vllm", "serve", "M", "--port", "http"]))
    assert str(caught.value) == "--port: 'http' is not a TCP port; use 1-65535"
    with pytest.raises(SpecError) as caught:
        detect_engine({"name": "x", "command": "vllm serve M"})
    assert str(caught.value) == "container 'x'.command: must be a list of strings"


REWRITES = [
    # before (command, args), kwargs, expected (command, args)
    (
        (["vllm", "serve", "M"], ["--kv-cache-dtype", "auto"]),
        {"kv_cache_dtype": "fp8"},
        (["vllm", "serve", "M"], ["--kv-cache-dtype", "fp8"]),
    ),
    (
        (["vllm", "serve", "M", "--kv-cache-dtype=auto"], None),
        {"kv_cache_dtype": "fp8"},
        (["vllm", "serve", "M", "--kv-cache-dtype=fp8"], None),
    ),
    (
        (["vllm", "serve", "M"], None),
        {"kv_cache_dtype": "fp8", "extra_args": ("--attention-backend", "TRITON_ATTN")},
        (["vllm", "serve", "M"], ["--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"]),
    ),
    (
        (["vllm", "serve", "M"], ["--attention-backend", "FLASHINFER", "--port", "8000"]),
        {"kv_cache_dtype": None, "extra_args": ("--attention-backend=TRITON_ATTN",)},
        (["vllm", "serve", "M"], ["--attention-backend", "TRITON_ATTN", "--port", "8000"]),
    ),
    (
        (["python3", "-m", "sglang.launch_server"], ["--model-path", "M"]),
        {"kv_cache_dtype": "fp8_e4m3", "extra_args": ("--enable-metrics",)},
        (
            ["python3", "-m", "sglang.launch_server"],
            ["--model-path", "M", "--kv-cache-dtype", "fp8_e4m3", "--enable-metrics"],
        ),
    ),
    # a boolean flag already present is left alone; a flag spelled with _ is still found
    (
        (
            ["python3", "-m", "sglang.launch_server"],
            ["--model-path", "M", "--enable-metrics", "--kv_cache_dtype=auto"],
        ),
        {"kv_cache_dtype": "fp8_e5m2", "extra_args": ("--enable-metrics",)},
        (
            ["python3", "-m", "sglang.launch_server"],
            ["--model-path", "M", "--enable-metrics", "--kv_cache_dtype=fp8_e5m2"],
        ),
    ),
    # duplicated flag: every copy gets the value, so the last one cannot win back
    (
        (["vllm", "serve", "M", "--kv-cache-dtype", "auto"], ["--kv-cache-dtype", "auto"]),
        {"kv_cache_dtype": "fp8"},
        (["vllm", "serve", "M", "--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8"]),
    ),
]


@pytest.mark.parametrize(("before", "kwargs", "after"), REWRITES)
def test_rewrite_container(
    before: tuple[list[str], list[str] | None],
    kwargs: dict[str, Any],
    after: tuple[list[str], list[str] | None],
) -> None:
    original = container(*before)
    frozen = copy.deepcopy(original)
    rewritten = rewrite_container(original, **kwargs)
    assert (rewritten.get("command"), rewritten.get("args")) == after
    assert original == frozen  # never mutated


def test_rewrite_image_only_container_appends_to_args() -> None:
    spec = container(args=["--model", "M"], image="vllm/vllm-openai:latest")
    rewritten = rewrite_container(spec, kv_cache_dtype="fp8")
    assert "command" not in rewritten
    assert rewritten["args"] == ["--model", "M", "--kv-cache-dtype", "fp8"]


def test_rewrite_env_sets_and_replaces() -> None:
    spec = container(["vllm", "serve", "M"])
    spec["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "1"},
        {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"},
    ]
    rewritten = rewrite_container(
        spec, kv_cache_dtype="fp8", extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "NEW": "x"}
    )
    assert rewritten["env"] == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"},
        {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"},
        {"name": "NEW", "value": "x"},
    ]


def test_rewrite_refuses_sglang_fp8() -> None:
    with pytest.raises(SpecError) as caught:
        rewrite_container(container(["sglang", "serve", "--model-path", "M"]), kv_cache_dtype="fp8")
    assert str(caught.value) == (
        "kv_cache_dtype: SGLang rejects 'fp8' (its choices are auto, fp8_e4m3, fp8_e5m2...); "
        "use 'fp8_e4m3', which is what vLLM's 'fp8' means on CUDA"
    )


SCRIPTS = [
    # command, args, kwargs, expected script
    (
        ["sh", "-c", "vllm serve M --kv-cache-dtype auto"],
        None,
        {"kv_cache_dtype": "fp8"},
        "vllm serve M --kv-cache-dtype fp8",
    ),
    (
        ["/bin/bash", "-c", 'exec vllm serve "$MODEL" --port 8000\n'],
        None,
        {"kv_cache_dtype": "fp8", "extra_args": ("--attention-backend", "TRITON_ATTN")},
        'exec vllm serve "$MODEL" --port 8000 --kv-cache-dtype fp8 --attention-backend TRITON_ATTN',
    ),
    (
        ["sh", "-c"],
        [
            "pip install x --upgrade && python3 -m sglang.launch_server --model-path M --kv_cache_dtype='auto'"
        ],
        {"kv_cache_dtype": "fp8_e4m3"},
        "pip install x --upgrade && python3 -m sglang.launch_server --model-path M --kv_cache_dtype=fp8_e4m3",
    ),
    # a flag already present is rewritten in place even when other shell syntax follows
    (
        ["sh", "-c", "vllm serve M --kv-cache-dtype auto 2>&1 | tee /tmp/log"],
        None,
        {"kv_cache_dtype": "fp8"},
        "vllm serve M --kv-cache-dtype fp8 2>&1 | tee /tmp/log",
    ),
]


@pytest.mark.parametrize(("command", "args", "kwargs", "script"), SCRIPTS)
def test_rewrite_shell_scripts(
    command: list[str], args: list[str] | None, kwargs: dict[str, Any], script: str
) -> None:
    spec = container(command, args)
    rewritten = rewrite_container(spec, **kwargs)
    holder = rewritten["args"] if args is not None else rewritten["command"]
    assert holder[-1] == script
    assert detect_engine(rewritten).kv_cache_dtype == kwargs["kv_cache_dtype"]


@pytest.mark.parametrize(
    "script", ["vllm serve M 2>&1 | tee /tmp/log", "vllm serve M &", "vllm serve M  # fp16 for now"]
)
def test_rewrite_refuses_to_append_after_shell_syntax(script: str) -> None:
    with pytest.raises(UnsupportedError) as caught:
        rewrite_container(container(["sh", "-c", script]), kv_cache_dtype="fp8")
    assert str(caught.value) == (
        "container 'server': the engine command in its shell script is followed by other shell "
        "syntax, so --kv-cache-dtype fp8 cannot be appended; put the engine command last in the "
        "script or in command/args"
    )


def test_unbalanced_quotes_in_script() -> None:
    with pytest.raises(SpecError) as caught:
        detect_engine(container(["sh", "-c", "vllm serve 'M"]))
    assert (
        str(caught.value)
        == "container 'server' shell script: cannot be split: No closing quotation"
    )


def test_rewrite_rejects_positional_extra_args() -> None:
    with pytest.raises(SpecError) as caught:
        rewrite_container(
            container(["vllm", "serve", "M"]), kv_cache_dtype=None, extra_args=("fp8",)
        )
    assert (
        str(caught.value) == "extra_args: 'fp8' is not a --flag; pass flags as ('--flag', 'value')"
    )


VALID = [
    ("vllm", "fp8", None),
    ("vllm", "fp8_e4m3", "0.11.0"),
    ("vllm", "bfloat16", "0.11.0"),
    ("vllm", "fp8_ds_mla", "0.12.0"),
    ("vllm", "nvfp4", "v0.20.0"),
    ("sglang", "fp8_e4m3", "0.4.6.post5"),
    ("sglang", "bf16", "0.5.10"),
    ("sglang", "mxfp8", "0.5.23"),
]


@pytest.mark.parametrize(("engine", "dtype", "version"), VALID)
def test_valid_dtypes(engine: str, dtype: str, version: str | None) -> None:
    assert validate_kv_cache_dtype(engine, dtype, version) == dtype


INVALID = [
    (
        "vllm",
        "bfloat16",
        "0.10.2",
        "kv_cache_dtype: 'bfloat16' is not a --kv-cache-dtype value of vllm 0.10.2; use one of "
        "auto, fp8, fp8_e4m3, fp8_e5m2, fp8_inc",
    ),
    (
        "sglang",
        "bf16",
        "0.5.3",
        "kv_cache_dtype: 'bf16' is not a --kv-cache-dtype value of sglang 0.5.3; use one of "
        "auto, fp8_e4m3, fp8_e5m2",
    ),
    (
        "sglang",
        "fp8",
        None,
        "kv_cache_dtype: SGLang rejects 'fp8' (its choices are auto, fp8_e4m3, fp8_e5m2...); "
        "use 'fp8_e4m3', which is what vLLM's 'fp8' means on CUDA",
    ),
]


@pytest.mark.parametrize(("engine", "dtype", "version", "message"), INVALID)
def test_invalid_dtypes(engine: str, dtype: str, version: str | None, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_kv_cache_dtype(engine, dtype, version)
    assert str(caught.value) == message


def test_unknown_engine() -> None:
    with pytest.raises(UnsupportedError) as caught:
        validate_kv_cache_dtype("tgi", "fp8")
    assert str(caught.value) == "engine 'tgi' is not known; kvgate supports vllm, sglang"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("0.11.0", (0, 11, 0)), ("v0.4.6.post5", (0, 4, 6)), ("0.11.0rc1+cu128", (0, 11, 0))],
)
def test_parse_version(text: str, parsed: tuple[int, ...]) -> None:
    assert engine_versions.parse(text) == parsed


@pytest.mark.parametrize(
    ("engine", "version", "settings"),
    [
        # 0.10 spells it TRITON_ATTN_VLLM_V1 (vllm/platforms/interface.py `_Backend`)
        ("vllm", "0.10.2", ((), {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1"})),
        ("vllm", "0.11.0", ((), {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"})),
        ("vllm", "0.12.0", ((), {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"})),
        ("vllm", "0.13.0", (("--attention-backend", "TRITON_ATTN"), {})),
        ("vllm", "0.33.0", (("--attention-backend", "TRITON_ATTN"), {})),
        ("sglang", "0.5.3", (("--attention-backend", "triton"), {})),
    ],
)
def test_backend_settings(
    engine: str, version: str, settings: tuple[tuple[str, ...], dict[str, str]]
) -> None:
    assert engine_versions.backend_settings(engine, "TRITON_ATTN", version) == settings


def test_sglang_facts() -> None:
    facts = FACTS[Engine.SGLANG]
    assert (facts.default_port, facts.metrics_flag) == (30000, "--enable-metrics")
    assert engine_versions.kv_cache_dtypes("sglang", "0.4.6") == {"auto", "fp8_e4m3", "fp8_e5m2"}


def test_backend_settings_reject_names_of_other_versions() -> None:
    with pytest.raises(ValueError, match="no attention backend 'TRITON_ATTN_VLLM_V1'"):
        engine_versions.backend_settings("vllm", "TRITON_ATTN_VLLM_V1", "0.11.0")
    with pytest.raises(ValueError, match="XFORMERS"):
        engine_versions.backend_settings("vllm", "XFORMERS", "0.15.0")


@pytest.mark.parametrize(
    ("image", "env_backend", "finding"),
    [
        ("vllm/vllm-openai:v0.11.0", "TRITON_ATTN", None),
        ("vllm/vllm-openai:v0.14.0", "TRITON_ATTN", None),
        ("vllm/vllm-openai:v0.15.0", None, "is ignored by vLLM 0.15.0"),
        ("vllm/vllm-openai:v0.33.0", None, "is ignored by vLLM 0.33.0"),
        ("python:3.11", "TRITON_ATTN", "only in vLLM 0.10-0.14"),
    ],
)
def test_backend_env_only_where_the_version_reads_it(
    image: str, env_backend: str | None, finding: str | None
) -> None:
    spec = container(["vllm", "serve", "M"])
    spec["image"] = image
    spec["env"] = [{"name": "VLLM_ATTENTION_BACKEND", "value": "TRITON_ATTN"}]
    info = detect_engine(spec)
    assert info.attention_backend == env_backend
    assert any(finding in f for f in info.findings) if finding else not info.findings


@pytest.mark.parametrize(
    "args",
    [
        ["-ac", '{"backend": "FLASHINFER"}'],
        ['-ac={"backend": "FLASHINFER"}'],
        ["--attention-config", '{"backend": "FLASHINFER", "x": 1}'],
        ["--attention-config.backend", "FLASHINFER"],
    ],
)
def test_backend_from_attention_config(args: list[str]) -> None:
    assert detect_engine(container(["vllm", "serve", "M", *args])).attention_backend == "FLASHINFER"


def test_rewrite_validates_the_dtype_for_the_target_version() -> None:
    spec = container(["vllm", "serve", "M"])
    spec["image"] = "vllm/vllm-openai:v0.10.2"
    with pytest.raises(
        SpecError, match=r"'bfloat16' is not a --kv-cache-dtype value of vllm 0\.10\.2"
    ):
        rewrite_container(spec, kv_cache_dtype="bfloat16")
    spec["image"] = "vllm/vllm-openai:v0.11.0"
    assert "bfloat16" in rewrite_container(spec, kv_cache_dtype="bfloat16")["args"]
    spec["image"] = "python:3.11"  # unknown version: only values every version takes
    with pytest.raises(SpecError, match="every vllm version"):
        rewrite_container(spec, kv_cache_dtype="bfloat16")
    assert rewrite_container(spec, kv_cache_dtype="bfloat16", engine_version="0.33.0")["args"]
