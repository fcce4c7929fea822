"""What a KVCacheRollout may change in a production container: the one place for the lists.

Creating a rollout is a lower privilege than editing the Deployment, so a rollout may only add
KV-cache and attention flags (`spec.extraArgs`) and a few attention environment variables
(`spec.extraEnv`). Two walls read these lists:

1. the CRD's CEL rules (`crds/kvgate.io_kvcacherollouts.yaml`) refuse the DENYLIST at
   admission. CEL cannot see the operator's configuration, so the CRD cannot hold the
   allowlist (operators extend it per installation); it holds the known-dangerous set instead.
   tests/unit/test_policy.py renders the rules from these lists and checks the CRD carries
   exactly them.
2. the operator (`RolloutSpec.from_dict(spec, allow=...)`) enforces the ALLOWLIST: built-in
   per-engine lists plus what the operator's configuration adds (`KVGATE_EXTRA_ALLOWED_ARGS`,
   `KVGATE_EXTRA_ALLOWED_ENV`). The denylist wins over any extension.

Pure: no I/O. Flags are compared in their canonical spelling (`--kv_cache_dtype` is
`--kv-cache-dtype`, as argparse in both engines accepts either); both `--flag value` and
`--flag=value` are understood. Environment names are compared as written (they are
case-sensitive), the denylist case-insensitively.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, TypeVar

from kvgate.engines.argtokens import MULTI_VALUE_FLAGS
from kvgate.vocabulary import Engine

_X = TypeVar("_X")


class Kind(StrEnum):
    """How a flag takes its value."""

    VALUE = "value"  # `--flag v` or `--flag=v`
    SWITCH = "switch"  # `--flag` alone
    EITHER = "either"  # operator-added flags: kvgate does not know, so both forms pass


# --- the allowlist (the operator's wall) ---------------------------------------------------------

VLLM_ARGS: Final[Mapping[str, Kind]] = {
    "--kv-cache-dtype": Kind.VALUE,  # normally set by kvgate from spec.kvCacheDtype
    "--attention-backend": Kind.VALUE,
    "--attention-config.backend": Kind.VALUE,  # newer vLLM spelling of the same
    "--calculate-kv-scales": Kind.SWITCH,
    "--block-size": Kind.VALUE,
    "--gpu-memory-utilization": Kind.VALUE,
    "--kv-cache-memory-bytes": Kind.VALUE,
    "--num-gpu-blocks-override": Kind.VALUE,
    "--max-num-seqs": Kind.VALUE,
    "--max-num-batched-tokens": Kind.VALUE,
    "--max-model-len": Kind.VALUE,
    "--enable-prefix-caching": Kind.SWITCH,
    "--no-enable-prefix-caching": Kind.SWITCH,
    "--prefix-caching-hash-algo": Kind.VALUE,
    "--enable-chunked-prefill": Kind.SWITCH,
    "--no-enable-chunked-prefill": Kind.SWITCH,
}
SGLANG_ARGS: Final[Mapping[str, Kind]] = {
    "--kv-cache-dtype": Kind.VALUE,
    "--attention-backend": Kind.VALUE,
    "--prefill-attention-backend": Kind.VALUE,
    "--decode-attention-backend": Kind.VALUE,
    "--mem-fraction-static": Kind.VALUE,
    "--max-running-requests": Kind.VALUE,
    "--max-total-tokens": Kind.VALUE,
    "--chunked-prefill-size": Kind.VALUE,
    "--page-size": Kind.VALUE,
    "--context-length": Kind.VALUE,
    "--disable-radix-cache": Kind.SWITCH,
    "--disable-cuda-graph": Kind.SWITCH,
}
VLLM_ENV: Final = frozenset(
    {
        "VLLM_USE_FLASHINFER_SAMPLER",
        "VLLM_ATTENTION_BACKEND",
        "VLLM_FLASH_ATTN_VERSION",
        "VLLM_USE_TRITON_FLASH_ATTN",
        "VLLM_FLASHINFER_FORCE_TENSOR_CORES",
    }
)
SGLANG_ENV: Final = frozenset(
    {
        "SGLANG_IS_FLASHINFER_AVAILABLE",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS",
        "SGLANG_ENABLE_JIT_DEEPGEMM",
    }
)
# kvgate sets these flags itself from the spec field named; a second value in extraArgs would
# win over it (argparse keeps the last), so the candidate would not test what the rollout says.
# The skip list is written from spec.kvCache.skipLayers, whose entries are checked one by one
# (a value like '0,1,35' would be one entry naming no layer: kvgate.spec.kvcache.candidate_args).
KVGATE_OWNED_ARGS: Final[Mapping[str, str]] = {
    "--kv-cache-dtype": "spec.kvCacheDtype",
    "--kv-cache-dtype-skip-layers": "spec.kvCache.skipLayers",
}

# --- the denylist (the CRD's wall; also refused by the operator whatever it is configured) ------

# Flags that load code or files, reach other hosts, change what is served or who may call it.
DENIED_ARGS: Final = (
    "--trust-remote-code",
    "--middleware",
    "--config",
    "--model",
    "--model-path",
    "--tokenizer",
    "--tokenizer-path",
    "--revision",
    "--code-revision",
    "--tokenizer-revision",
    "--download-dir",
    "--load-format",
    "--chat-template",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--root-path",
    "--allowed-origins",
    "--allowed-local-media-path",
    "--tool-parser-plugin",
    "--reasoning-parser-plugin",
    "--logits-processors",
    "--worker-cls",
    "--worker-extension-cls",
    "--kv-transfer-config",
    "--kv-events-config",
    "--otlp-traces-endpoint",
    "--enable-custom-logit-processor",
    "--hf-token",
)
DENIED_ARG_PREFIXES: Final = ("--ssl-", "--hf-", "--override-", "--lora")
# Variables that load code, redirect downloads or traffic, or carry credentials.
DENIED_ENV_NAMES: Final = (
    "PATH",
    "HOME",
    "VLLM_PLUGINS",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_API_KEY",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_USE_MODELSCOPE",
    "VLLM_HOST_IP",
    "VLLM_PORT",
    "POD_IP",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
)
DENIED_ENV_PREFIXES: Final = (
    "LD_",
    "PYTHON",
    "HF_",
    "HUGGINGFACE",
    "HUGGING_FACE",
    "TRANSFORMERS_",
    "SSL_",
    "KUBERNETES_",
    "AWS_",
    "GOOGLE_",
    "AZURE_",
)
DENIED_ENV_SUFFIXES: Final = ("_ENDPOINT", "_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_URL")

MAX_VALUE_LENGTH: Final = 256
MAX_ENV_VALUE_LENGTH: Final = 1024
_VALUE_RE: Final = re.compile(r"[A-Za-z0-9._,:+=/-]+")
_FLAG_RE: Final = re.compile(r"--[a-z0-9][a-z0-9.-]*")
_ENV_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def canonical_flag(token: str) -> str:
    """`--kv_cache_dtype=fp8` -> `--kv-cache-dtype` (the name argparse sees)."""
    return token.partition("=")[0].replace("_", "-").lower()


def arg_denied(name: str) -> bool:
    """True for a flag (canonical name) that the CRD refuses at admission."""
    return name in DENIED_ARGS or name.startswith(DENIED_ARG_PREFIXES)


def env_denied(name: str) -> bool:
    """True for an environment variable name that the CRD refuses at admission."""
    upper = name.upper()
    return (
        upper in DENIED_ENV_NAMES
        or upper.startswith(DENIED_ENV_PREFIXES)
        or upper.endswith(DENIED_ENV_SUFFIXES)
    )


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The flags and variables a rollout may set; built-ins plus operator-configured extras."""

    extra_args: frozenset[str] = frozenset()  # canonical flag names, either form
    extra_env: frozenset[str] = frozenset()  # names; `PREFIX*` matches a prefix
    _env_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefixes = tuple(sorted(e[:-1] for e in self.extra_env if e.endswith("*")))
        object.__setattr__(self, "_env_prefixes", prefixes)

    @classmethod
    def from_config(cls, args: Iterable[str] = (), env: Iterable[str] = ()) -> Allowlist:
        """Validated extras; raises ValueError naming the first bad entry."""
        denied = "{} is on the denylist the CRD enforces; it cannot be allowed"
        arg_set, env_set = set(), set()
        for name in filter(None, (raw.strip() for raw in args)):
            canon = canonical_flag(name)
            if not _FLAG_RE.fullmatch(canon) or "=" in name:
                raise ValueError(f"{name!r} is not a --flag name")
            if arg_denied(canon):
                raise ValueError(denied.format(name))
            arg_set.add(canon)
        for name in filter(None, (raw.strip() for raw in env)):
            bare = name.removesuffix("*")
            if not _ENV_RE.fullmatch(bare):
                raise ValueError(f"{name!r} is not a variable name (or NAME_PREFIX*)")
            if env_denied(bare):
                raise ValueError(denied.format(name))
            env_set.add(name)
        return cls(frozenset(arg_set), frozenset(env_set))

    def args_for(self, engine: Engine | str | None) -> dict[str, Kind]:
        """Allowed flags of `engine` (None or "auto": either engine's) with how they take values."""
        tables = _tables(engine, VLLM_ARGS, SGLANG_ARGS)
        allowed: dict[str, Kind] = {k: v for table in tables for k, v in table.items()}
        for name in self.extra_args:
            allowed.setdefault(name, Kind.EITHER)
        return {k: v for k, v in allowed.items() if not arg_denied(k)}

    def env_for(self, engine: Engine | str | None) -> frozenset[str]:
        """Allowed variable names (exact) of `engine`; prefixes are in `env_allowed`."""
        names = frozenset().union(*_tables(engine, VLLM_ENV, SGLANG_ENV))
        return names | {e for e in self.extra_env if not e.endswith("*")}

    def env_allowed(self, engine: Engine | str | None, name: str) -> bool:
        if env_denied(name):
            return False
        return name in self.env_for(engine) or name.startswith(self._env_prefixes)

    def describe_env(self, engine: Engine | str | None) -> str:
        return ", ".join(sorted(self.env_for(engine) | {f"{p}*" for p in self._env_prefixes}))


BUILTIN: Final = Allowlist()


def _tables(engine: Engine | str | None, vllm: _X, sglang: _X) -> tuple[_X, ...]:
    value = None if engine is None else str(engine)
    if value == Engine.VLLM:
        return (vllm,)
    if value == Engine.SGLANG:
        return (sglang,)
    return (vllm, sglang)  # auto: the engine is known only once the Deployment is read


@dataclass(frozen=True, slots=True)
class Violation:
    """One refused item: `index` into the list checked, and why (never echoing a secret)."""

    index: int
    message: str


def check_args(
    args: Sequence[str], engine: Engine | str | None, allow: Allowlist = BUILTIN
) -> list[Violation]:
    """Every problem in an extraArgs list: unknown or denied flags, values in the wrong place."""
    allowed = allow.args_for(engine)
    out: list[Violation] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            out.append(
                Violation(i, f"{_show(token)} is not a --flag; give each value after its flag")
            )
            i += 1
            continue
        name = canonical_flag(token)
        _, eq, inline = token.partition("=")
        has_next = i + 1 < len(args) and not args[i + 1].startswith("--")
        skip = 2 if has_next and not eq else 1  # the flag, and its value when it is separate
        if name in KVGATE_OWNED_ARGS:
            out.append(Violation(i, f"{name} is set by kvgate from {KVGATE_OWNED_ARGS[name]}; "
                                 "set that"))  # fmt: skip
            if name in MULTI_VALUE_FLAGS and not eq:  # nargs="+": every value up to the next flag
                skip = 1 + _values_after(args, i)
            i += skip
            continue
        kind = allowed.get(name)
        if kind is None:
            why = f" ({ARG_WHY})"
            reason = "is not an allowed flag" + (why if arg_denied(name) else "")
            out.append(
                Violation(i, f"{_show(name)} {reason}; allowed: {', '.join(sorted(allowed))}")
            )
            i += skip
            continue
        value: str | None = inline if eq else None
        value_index = i
        if not eq and has_next and kind is not Kind.SWITCH:
            value, value_index = args[i + 1], i + 1
            i += 1
        if kind is Kind.SWITCH and (eq or has_next):
            out.append(Violation(i, f"{name} takes no value"))
            i += skip
            continue
        if kind is Kind.VALUE and value is None:
            out.append(Violation(i, f"{name} needs a value (--flag value or --flag=value)"))
        elif value is not None:
            problem = _bad_value(value)
            if problem:
                out.append(Violation(value_index, f"the value of {name} {problem}"))
        i += 1
    return out


def _values_after(args: Sequence[str], i: int) -> int:
    """How many tokens after args[i] are not flags (the values an owned flag took)."""
    n = 0
    while i + 1 + n < len(args) and not args[i + 1 + n].startswith("--"):
        n += 1
    return n


def check_env_name(
    name: str, engine: Engine | str | None, allow: Allowlist = BUILTIN
) -> str | None:
    """Why `name` may not be set by a rollout, or None when it may."""
    if allow.env_allowed(engine, name):
        return None
    why = f" ({ENV_WHY})" if env_denied(name) else ""
    return f"{_show(name)} is not an allowed variable{why}; allowed: {allow.describe_env(engine)}"


def check_env_value(value: str) -> str | None:
    """Why an extraEnv value is refused (control characters, unbounded), or None."""
    if len(value) > MAX_ENV_VALUE_LENGTH:
        return f"is longer than {MAX_ENV_VALUE_LENGTH} characters"
    if any(not c.isprintable() for c in value):
        return "holds a control character or line break"
    return None


def _bad_value(value: str) -> str | None:
    if not value:
        return "is empty"
    if len(value) > MAX_VALUE_LENGTH:
        return f"is longer than {MAX_VALUE_LENGTH} characters"
    if not _VALUE_RE.fullmatch(value):
        return "may only hold letters, digits and . _ , : + = / -"
    return None


def _show(text: str, limit: int = 64) -> str:
    """A token for a message: printable, bounded (a refused token may be pasted junk)."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


ARG_WHY: Final = "it loads code, reaches other hosts or changes what is served"
ENV_WHY: Final = "it loads code, redirects downloads or traffic, or carries a credential"
