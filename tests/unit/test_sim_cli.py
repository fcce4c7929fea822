"""kvgate.sim command lines: the engines' flags, defaults and argparse errors."""

from __future__ import annotations

import pytest

from kvgate.sim.cli import parse_sglang, parse_vllm


def test_vllm_serve_defaults_and_non_default_args() -> None:
    args = parse_vllm(
        ["Qwen/Qwen3-8B", "--kv-cache-dtype", "fp8", "--max-model-len", "8192"], (0, 11, 0)
    )
    assert (args.engine, args.model, args.served_model_name, args.port, args.host) == (
        "vllm", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", 8000, None,
    )  # fmt: skip
    assert (args.gpu_memory_utilization, args.kv_cache_dtype, args.max_model_len) == (
        0.9,
        "fp8",
        8192,
    )
    assert args.non_default == {
        "model_tag": "Qwen/Qwen3-8B", "model": "Qwen/Qwen3-8B", "max_model_len": 8192, "kv_cache_dtype": "fp8",
    }  # fmt: skip


def test_vllm_api_server_style_and_served_name() -> None:
    args = parse_vllm(
        ["--model", "m", "--served-model-name", "prod", "alias", "--tensor-parallel-size", "1"],
        (0, 16, 0),
    )
    assert (args.model, args.served_model_name) == ("m", "prod")


def test_vllm_backend_names_are_case_insensitive() -> None:
    assert (
        parse_vllm(["m", "--attention-backend", "triton_attn"], (0, 13, 0)).attention_backend
        == "TRITON_ATTN"
    )


def test_vllm_tolerates_real_flags() -> None:
    args = parse_vllm(
        ["m", "--trust-remote-code", "--enforce-eager", "--no-enable-prefix-caching", "-tp", "1",
         "--disable-log-requests", "--max-num-seqs", "64", "--dtype", "bfloat16"],
        (0, 16, 0),
    )  # fmt: skip
    assert args.max_num_seqs == 64


@pytest.mark.parametrize(
    ("argv", "version", "message"),
    [
        (["m", "--bogus"], (0, 16, 0), "vllm serve: error: unrecognized arguments: --bogus"),
        (["m", "--kv-cache-dtype", "fp4"], (0, 11, 0), "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')"),
        # vllm-0.10.2 vllm/config/cache.py:25: CacheDType has no bfloat16 yet
        (["m", "--kv-cache-dtype", "bfloat16"], (0, 10, 2), "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'bfloat16' (choose from 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')"),
        (["m", "--attention-backend", "FLASHY"], (0, 16, 0), "vllm serve: error: argument --attention-backend: Invalid attention backend: 'FLASHY'."),
        (["m", "--gpu-memory-utilization", "1.5"], (0, 16, 0), "argument --gpu-memory-utilization: must be in (0, 1], got 1.5"),
    ],
)  # fmt: skip
def test_vllm_usage_errors_exit_2(capsys, argv, version, message) -> None:
    with pytest.raises(SystemExit) as info:
        parse_vllm(argv, version)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_sglang_flags() -> None:
    args = parse_sglang(
        ["--model-path", "m", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton", "--enable-metrics",
         "--mem-fraction-static", "0.8", "--context-length", "4096", "--tp", "1", "--trust-remote-code"],
        (0, 5, 3),
    )  # fmt: skip
    assert (args.engine, args.model, args.port, args.host) == ("sglang", "m", 30000, None)
    assert (args.kv_cache_dtype, args.attention_backend, args.enable_metrics) == (
        "fp8_e4m3",
        "triton",
        True,
    )
    assert (args.mem_fraction_static, args.max_model_len) == (0.8, 4096)


def test_sglang_refuses_fp8_like_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse_sglang(["--model-path", "m", "--kv-cache-dtype", "fp8"], (0, 5, 3))
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp8' "
        "(choose from 'auto', 'fp8_e5m2', 'fp8_e4m3')"
    )


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["vllm", "--help"], "`vllm serve MODEL`"),
        (["vllm", "Qwen/Qwen3-8B"], "`vllm serve MODEL`"),
        (["llamacpp", "serve"], "unknown engine command 'llamacpp serve'"),
    ],
)
def test_an_unknown_command_exits_2_with_the_way_in(
    capsys: pytest.CaptureFixture[str], argv: list[str], hint: str
) -> None:
    from kvgate.sim.main import main

    # WHEN the simulator is started the way the engine's own CLI would refuse
    code = main(argv)
    # THEN it exits 2 with one line that says how the engine is started
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and hint in err, err
