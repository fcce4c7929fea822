"""kvgate.spec.allowed: what a rollout may change, and the CRD's CEL rules rendered from the same lists."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.spec import allowed as policy
from kvgate.spec.allowed import Allowlist, check_args, check_env_name

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds/kvgate.io_kvcacherollouts.yaml"


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _messages(args: list[str], engine: str | None = "vllm", allow: Allowlist = policy.BUILTIN):
    return [(v.index, v.message) for v in check_args(args, engine, allow)]


# --- args -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--attention-backend", "TRITON_ATTN"]),
        ("vllm", ["--attention-backend=TRITON_ATTN"]),
        ("vllm", ["--attention_backend", "FLASHINFER"]),  # argparse accepts either spelling
        ("vllm", ["--calculate-kv-scales", "--block-size", "16", "--max-num-seqs=128"]),
        ("vllm", ["--gpu-memory-utilization", "0.92", "--no-enable-prefix-caching"]),
        ("sglang", ["--attention-backend", "triton", "--mem-fraction-static", "0.85"]),
        ("sglang", ["--max-running-requests=64", "--chunked-prefill-size", "4096"]),
        (None, ["--attention-backend", "triton", "--mem-fraction-static", "0.8"]),  # auto
        ("vllm", []),
    ],
)
def test_kv_and_attention_flags_pass(engine: str | None, args: list[str]) -> None:
    assert check_args(args, engine) == []


def test_dangerous_flags_are_refused_naming_the_flag_and_the_allowed_ones() -> None:
    ((index, message),) = _messages(["--trust-remote-code"])
    assert index == 0
    assert message.startswith("--trust-remote-code is not an allowed flag (it loads code")
    assert "allowed: --attention-backend, --attention-config.backend, --block-size" in message
    ((index, message),) = _messages(["--attention-backend", "X", "--middleware=evil.mw"])
    assert index == 2 and message.startswith("--middleware is not an allowed flag (")
    # a flag kvgate simply does not know is refused too, without the "dangerous" reason
    ((_, message),) = _messages(["--enforce-eager"])
    assert message.startswith("--enforce-eager is not an allowed flag; allowed: ")


def test_flags_of_the_other_engine_are_refused_once_the_engine_is_known() -> None:
    assert _messages(["--mem-fraction-static", "0.8"], "vllm")[0][1].startswith(
        "--mem-fraction-static is not an allowed flag"
    )
    assert _messages(["--calculate-kv-scales"], "sglang")[0][1].startswith(
        "--calculate-kv-scales is not an allowed flag"
    )
    assert _messages(["--calculate-kv-scales"], None) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["TRITON_ATTN"], [(0, "TRITON_ATTN is not a --flag; give each value after its flag")]),
        (
            ["--attention-backend", "A", "B"],
            [(2, "B is not a --flag; give each value after its flag")],
        ),
        (["--block-size"], [(0, "--block-size needs a value (--flag value or --flag=value)")]),
        (["--calculate-kv-scales=1"], [(0, "--calculate-kv-scales takes no value")]),
        (["--calculate-kv-scales", "yes"], [(0, "--calculate-kv-scales takes no value")]),
        (
            ["--attention-backend", "A;rm -rf /"],
            [
                (
                    1,
                    "the value of --attention-backend may only hold letters, digits and . _ , : + = / -",
                )
            ],
        ),
        (
            ["--attention-backend=$(curl x)"],
            [
                (
                    0,
                    "the value of --attention-backend may only hold letters, digits and . _ , : + = / -",
                )
            ],
        ),
        (
            ["--block-size", "1" * 300],
            [(1, "the value of --block-size is longer than 256 characters")],
        ),
        (
            ["--kv-cache-dtype", "auto"],
            [(0, "--kv-cache-dtype is set by kvgate from spec.kvCacheDtype; set that")],
        ),
        # the skip list is spec.kvCache.skipLayers' (checked entry by entry there): one line for
        # the flag and all its values; '0,1,35' would be one entry that names no layer in vLLM
        (
            ["--kv-cache-dtype-skip-layers", "0", "1", "35", "--block-size", "16"],
            [
                (
                    0,
                    "--kv-cache-dtype-skip-layers is set by kvgate from spec.kvCache.skipLayers; "
                    "set that",
                )
            ],
        ),
        (
            ["--kv_cache_dtype_skip_layers=0,1,35"],
            [
                (
                    0,
                    "--kv-cache-dtype-skip-layers is set by kvgate from spec.kvCache.skipLayers; "
                    "set that",
                )
            ],
        ),
    ],
)
def test_malformed_args_are_refused(args: list[str], expected: list[tuple[int, str]]) -> None:
    assert _messages(args) == expected


def test_a_refused_token_is_shown_bounded_and_printable() -> None:
    ((_, message),) = _messages(["--x\x1b[31m" + "y" * 200])
    assert "\x1b" not in message
    assert message.split(" is not")[0].endswith("...") and len(message.split(" is not")[0]) == 64


def test_operator_config_extends_the_flags_for_both_engines() -> None:
    allow = Allowlist.from_config(args=["--enforce-eager", "--swap_space"])
    assert allow.extra_args == {"--enforce-eager", "--swap-space"}
    for engine in ("vllm", "sglang", None):
        assert check_args(["--enforce-eager", "--swap-space", "4"], engine, allow) == []
    assert check_args(["--enforce-eager"], "vllm") != []  # the built-in list is unchanged


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("--trust-remote-code", "--trust-remote-code is on the denylist the CRD enforces"),
        ("--ssl-keyfile", "--ssl-keyfile is on the denylist the CRD enforces"),
        ("enforce-eager", "'enforce-eager' is not a --flag name"),
        ("--x=1", "'--x=1' is not a --flag name"),
    ],
)
def test_config_cannot_allow_a_denied_or_malformed_flag(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Allowlist.from_config(args=[entry])


# --- env ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "name"),
    [
        ("vllm", "VLLM_USE_FLASHINFER_SAMPLER"),
        ("vllm", "VLLM_ATTENTION_BACKEND"),
        ("sglang", "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS"),
        (None, "VLLM_USE_FLASHINFER_SAMPLER"),
        (None, "SGLANG_IS_FLASHINFER_AVAILABLE"),
    ],
)
def test_attention_variables_pass(engine: str | None, name: str) -> None:
    assert check_env_name(name, engine) is None


@pytest.mark.parametrize(
    "name",
    ["LD_PRELOAD", "PYTHONPATH", "HF_ENDPOINT", "HF_TOKEN", "ld_preload", "MY_API_KEY", "PATH"],
)
def test_dangerous_variables_are_refused_and_denied(name: str) -> None:
    message = check_env_name(name, "vllm")
    assert message is not None
    assert message.startswith(f"{name} is not an allowed variable (it loads code")
    assert message.endswith("allowed: VLLM_ATTENTION_BACKEND, VLLM_FLASHINFER_FORCE_TENSOR_CORES, "
                            "VLLM_FLASH_ATTN_VERSION, VLLM_USE_FLASHINFER_SAMPLER, "
                            "VLLM_USE_TRITON_FLASH_ATTN")  # fmt: skip
    assert policy.env_denied(name)


def test_an_unknown_variable_is_refused_without_the_dangerous_reason() -> None:
    assert check_env_name("KVGATE_SIM_FAULTS", "vllm") == (
        "KVGATE_SIM_FAULTS is not an allowed variable; allowed: "
        + ", ".join(sorted(policy.VLLM_ENV))
    )
    assert check_env_name("VLLM_USE_FLASHINFER_SAMPLER", "sglang") is not None


def test_operator_config_extends_the_variables_with_names_and_prefixes() -> None:
    allow = Allowlist.from_config(env=["KVGATE_SIM_*", "MY_KNOB"])
    assert check_env_name("KVGATE_SIM_FAULTS", "vllm", allow) is None
    assert check_env_name("KVGATE_SIM_LOAD", "sglang", allow) is None
    assert check_env_name("MY_KNOB", None, allow) is None
    assert check_env_name("MY_KNOB2", None, allow) is not None
    assert "KVGATE_SIM_*" in allow.describe_env("vllm")
    # the denylist wins over a prefix that happens to cover a denied name
    wide = Allowlist.from_config(env=["MY_*"])
    assert check_env_name("MY_TOKEN", "vllm", wide) is not None
    assert check_env_name("MY_FLAG", "vllm", wide) is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("LD_PRELOAD", "LD_PRELOAD is on the denylist the CRD enforces"),
        ("HF_*", "HF_* is on the denylist the CRD enforces"),
        ("*", "'*' is not a variable name"),
        ("A-B", "'A-B' is not a variable name"),
    ],
)
def test_config_cannot_allow_a_denied_or_malformed_variable(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Allowlist.from_config(env=[entry])


def test_env_values_must_be_one_bounded_printable_line() -> None:
    assert policy.check_env_value("0") is None and policy.check_env_value("") is None
    assert policy.check_env_value("a\nb") == "holds a control character or line break"
    assert policy.check_env_value("x" * 1025) == "is longer than 1024 characters"


def test_allowed_and_denied_lists_never_overlap() -> None:
    for name in (*policy.VLLM_ARGS, *policy.SGLANG_ARGS):
        assert not policy.arg_denied(name), name
        assert policy.canonical_flag(name) == name
    for name in policy.VLLM_ENV | policy.SGLANG_ENV:
        assert not policy.env_denied(name), name


# --- the CRD's CEL wall reads the same lists ------------------------------------------------------


def _cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _cel_arg_rule() -> str:
    """The rule on each `spec.extraArgs` item: a `--flag` token must not be on the denylist."""
    name = "self.split('=')[0].replace('_', '-').lowerAscii()"
    return (
        f"!self.startsWith('--') || (!({name} in {_cel_list(policy.DENIED_ARGS)}) && "
        f"!{_cel_list(policy.DENIED_ARG_PREFIXES)}.exists(p, {name}.startsWith(p)))"
    )


def _cel_env_rule() -> str:
    """The rule on each `spec.extraEnv` item: its name must not be on the denylist."""
    name = "self.name.upperAscii()"
    return (
        f"!({name} in {_cel_list(policy.DENIED_ENV_NAMES)}) && "
        f"!{_cel_list(policy.DENIED_ENV_PREFIXES)}.exists(p, {name}.startsWith(p)) && "
        f"!{_cel_list(policy.DENIED_ENV_SUFFIXES)}.exists(s, {name}.endsWith(s))"
    )


def _cel_arg_message_expression() -> str:
    """The CRD's error for a refused flag, naming it (the field path is added by the apiserver)."""
    tail = f" is refused for a rollout ({policy.ARG_WHY}); see docs/security.md"
    return "self.split('=')[0] + '" + tail.replace("\\", "\\\\").replace("'", "\\'") + "'"


def test_crd_cel_rules_are_rendered_from_the_policy_lists() -> None:
    spec = _spec_schema()["properties"]
    (arg_rule,) = spec["extraArgs"]["items"]["x-kubernetes-validations"]
    assert arg_rule["rule"] == _cel_arg_rule()
    assert arg_rule["messageExpression"] == _cel_arg_message_expression()
    (env_rule,) = spec["extraEnv"]["items"]["x-kubernetes-validations"]
    assert env_rule["rule"] == _cel_env_rule()
    assert env_rule["fieldPath"] == ".name"
    assert spec["extraEnv"]["items"]["properties"]["value"]["maxLength"] == (
        policy.MAX_ENV_VALUE_LENGTH
    )


def _cel_lists(rule: str) -> list[list[str]]:
    return [re.findall(r"'([^']*)'", m) for m in re.findall(r"\[('[^\]]*')\]", rule)]


def test_crd_cel_lists_equal_the_python_denylists() -> None:
    # Read back from the CRD's text, not from the renderer: a hand edit of the CRD fails here.
    spec = _spec_schema()["properties"]
    arg_lists = _cel_lists(spec["extraArgs"]["items"]["x-kubernetes-validations"][0]["rule"])
    assert arg_lists == [list(policy.DENIED_ARGS), list(policy.DENIED_ARG_PREFIXES)]
    env_lists = _cel_lists(spec["extraEnv"]["items"]["x-kubernetes-validations"][0]["rule"])
    assert env_lists == [
        list(policy.DENIED_ENV_NAMES),
        list(policy.DENIED_ENV_PREFIXES),
        list(policy.DENIED_ENV_SUFFIXES),
    ]


def test_crd_refuses_eval_image() -> None:
    canary = _spec_schema()["properties"]["canary"]
    (rule,) = canary["x-kubernetes-validations"]
    assert rule["rule"] == "!has(self.evalImage)" and rule["fieldPath"] == ".evalImage"
    assert "set by the operator" in rule["message"]


# A small Python model of the CEL rule's semantics (startsWith, split, replace, in, exists), so
# that the denylist check in Python and the CRD agree token by token.
def _cel_arg_ok(token: str) -> bool:
    if not token.startswith("--"):
        return True
    name = token.split("=")[0].replace("_", "-").lower()
    return name not in policy.DENIED_ARGS and not any(
        name.startswith(p) for p in policy.DENIED_ARG_PREFIXES
    )


@pytest.mark.parametrize(
    "token",
    ["--trust-remote-code", "--trust_remote_code=1", "--SSL-KEYFILE=x", "--hf-overrides", "--port",
     "--attention-backend", "TRITON_ATTN", "--lora-modules", "-tp"],
)  # fmt: skip
def test_python_denylist_matches_the_cel_rule(token: str) -> None:
    assert _cel_arg_ok(token) == (
        not token.startswith("--") or not policy.arg_denied(policy.canonical_flag(token))
    )
