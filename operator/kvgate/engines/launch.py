"""What kvgate knows about vLLM and SGLang: how they are launched, their flags and dtypes.

`detect_engine` reads a container as in a Kubernetes pod spec (`image`, `command`, `args`,
`env`) and says which engine it runs and with what settings; `rewrite_container` returns a
copy with the KV-cache dtype and other flags replaced. Both work on the token list that
Kubernetes runs (`command` + `args`), so a flag may sit in either list.

The engine is recognised by its launcher, generically: a command word `vllm` / `sglang`
(optionally followed by `serve`), or `-m vllm.…` / `-m sglang.…`, anywhere before the first
`--flag`. Wrappers that pass the engine command line through (`python -m some.wrapper vllm
serve M`) are therefore recognised as the engine they wrap. Without a launcher, the image
decides: `vllm/vllm-openai` runs the API server from its entrypoint, so `args` hold only flags.
`sh -c SCRIPT` is searched command by command; flags are then rewritten in the script's text,
so `$VARS` and quoting stay as written.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Final

from kvgate.engines import versions as engine_versions
from kvgate.engines.argtokens import MULTI_VALUE_FLAGS
from kvgate.engines.argtokens import Token as _Token
from kvgate.engines.argtokens import Value as _Value
from kvgate.engines.argtokens import flag_pairs as _flag_pairs
from kvgate.engines.argtokens import replace_flag as _replace_flag
from kvgate.engines.argtokens import replace_values as _replace_values
from kvgate.engines.argtokens import split_flag as _split_flag
from kvgate.engines.argtokens import values_after as _values_after
from kvgate.errors import SpecError, UnsupportedError
from kvgate.vocabulary import ENGINE_NAMES, Engine


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """Fixed per-engine facts (reference/engines.md §7-8)."""

    default_port: int
    default_host: str
    # Flag that turns /metrics on; None when it is always served.
    metrics_flag: str | None
    model_flags: tuple[str, ...]
    attention_backend_env: str | None  # vLLM 0.10-0.14 only (kvgate.engines.versions)
    metrics_path: str = "/metrics"
    health_path: str = "/health"


FACTS: Final[Mapping[Engine, EngineFacts]] = {
    Engine.VLLM: EngineFacts(
        default_port=8000,
        default_host="0.0.0.0",
        metrics_flag=None,
        model_flags=("--model",),
        attention_backend_env="VLLM_ATTENTION_BACKEND",
    ),
    Engine.SGLANG: EngineFacts(
        default_port=30000,
        # SGLang binds loopback unless told otherwise; a pod needs --host 0.0.0.0.
        default_host="127.0.0.1",
        metrics_flag="--enable-metrics",
        model_flags=("--model-path", "--model"),
        attention_backend_env=None,
    ),
}

KV_CACHE_DTYPE_FLAG: Final = "--kv-cache-dtype"
ATTENTION_BACKEND_FLAG: Final = "--attention-backend"
# vLLM took --attention-backend in 0.13.0; before that only the environment variable worked,
# and from 0.15.0 on the environment variable is ignored (kvgate.engines.versions).
VLLM_ATTENTION_BACKEND_ENV_UNTIL: Final = (0, 15, 0)
ATTENTION_CONFIG_FLAGS: Final = ("--attention-config", "-ac")

# Flags that never take a value; everything else in `--flag value` position is read as a pair.
_BOOLEAN_FLAGS: Final = frozenset(
    {
        "--enable-metrics",
        "--trust-remote-code",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--disable-log-stats",
        "--disable-log-requests",
        "--enable-chunked-prefill",
        "--calculate-kv-scales",
        "--skip-server-warmup",
        "--disable-radix-cache",
        "--enable-auto-tool-choice",
        "--enable-expert-parallel",
        "--disable-cuda-graph",
        "--headless",
    }
)
# vLLM's short spellings of config flags (vllm/engine/arg_utils.py 0.13+).
_SHORT_FLAGS: Final = {"-ac": "--attention-config", "-cc": "--compilation-config"}
_SHELLS: Final = frozenset({"sh", "bash", "dash", "ash", "zsh"})
_ENGINE_WORDS: Final = frozenset(ENGINE_NAMES)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """The engine a container runs and the settings kvgate cares about."""

    engine: Engine
    model: str | None
    revision: str | None
    served_model_name: str | None
    host: str
    port: int
    kv_cache_dtype: str  # "auto" when the flag is absent
    attention_backend: str | None  # from the flag, else the environment, else None (engine picks)
    metrics_path: str
    metrics_enabled: bool
    health_path: str
    engine_args: tuple[str, ...]
    findings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        lists = {"engine_args": list(self.engine_args), "findings": list(self.findings)}
        return out | {"engine": str(self.engine), **lists}


@dataclass(frozen=True, slots=True)
class _Launch:
    engine: Engine
    tokens: tuple[_Token, ...]  # engine arguments only (after the launcher)
    script: _Token | None = None  # the `sh -c` script that holds the engine command, if any
    # Flags can be appended at the end of the script: the engine command is its last part.
    script_appendable: bool = False


def validate_kv_cache_dtype(engine: Engine | str, dtype: str, version: str | None = None) -> str:
    """Return `dtype` if the engine accepts it, else raise SpecError saying what to use.

    `version` None accepts only values every known version accepts (what a rewrite for an
    unknown target may use).
    """
    engine = _engine(engine)
    try:
        choices = engine_versions.kv_cache_dtypes(engine.value, version)
    except ValueError as exc:  # engine_versions.parse: not a version like 0.11.0
        raise SpecError("engine_version", str(exc)) from None
    if dtype in choices:
        return dtype
    if engine is Engine.SGLANG and dtype == "fp8":
        raise SpecError(
            "kv_cache_dtype",
            "SGLang rejects 'fp8' (its choices are auto, fp8_e4m3, fp8_e5m2...); "
            "use 'fp8_e4m3', which is what vLLM's 'fp8' means on CUDA",
        )
    where = f"{engine} {version}" if version else f"every {engine} version kvgate knows"
    raise SpecError(
        "kv_cache_dtype",
        f"'{dtype}' is not a --kv-cache-dtype value of {where}; use one of {', '.join(sorted(choices))}",
    )


def image_version(image: str) -> str | None:
    """The engine version in an image tag (`vllm/vllm-openai:v0.11.0` -> `0.11.0`), or None."""
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    found = re.match(r"v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)", tag)
    return found.group(1) if found else None


def detect_engine(container: Mapping[str, Any]) -> EngineInfo:
    """Which engine the container runs, its model, port, KV dtype and attention backend; the
    image tag's version decides whether vLLM reads VLLM_ATTENTION_BACKEND (0.10-0.14)."""
    launch = _find_launch(container)
    version = _image_engine_version(container)
    facts = FACTS[launch.engine]
    texts = [t.text for t in launch.tokens]
    flags = _flag_values(texts)
    env = {  # valueFrom entries have no literal value; record that they are set
        str(entry["name"]): str(entry.get("value", "<valueFrom>"))
        for entry in container.get("env") or []
        if isinstance(entry, Mapping) and "name" in entry
    }
    findings: list[str] = []

    model = _last(flags, *facts.model_flags)
    if model is None and launch.engine is Engine.VLLM and texts and not texts[0].startswith("-"):
        model = texts[0]  # `vllm serve MODEL`
    port_text = _last(flags, "--port")
    port = facts.default_port
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise SpecError("--port", f"'{port_text}' is not a TCP port; use 1-65535")
        port = int(port_text)
    host = _last(flags, "--host") or facts.default_host
    if launch.engine is Engine.SGLANG and host.startswith("127."):
        findings.append(f"SGLang listens on {host}: other pods cannot reach it; add --host 0.0.0.0")
    backend = _last(flags, ATTENTION_BACKEND_FLAG, "--attention-config.backend")
    if backend is None:
        backend = _backend_from_json(_last(flags, ATTENTION_CONFIG_FLAGS[0]))
    env_name = facts.attention_backend_env
    if backend is None and env_name is not None and env_name in env:
        parsed = _safe_version(version)
        if parsed is not None and parsed >= VLLM_ATTENTION_BACKEND_ENV_UNTIL:
            findings.append(
                f"{env_name}={env[env_name]} is ignored by vLLM {version} (read only by 0.10-0.14); "
                f"use {ATTENTION_BACKEND_FLAG} {env[env_name]}"
            )
        else:
            backend = env[env_name]
            if parsed is None:
                findings.append(
                    f"{env_name} chooses the backend only in vLLM 0.10-0.14; the version is "
                    "unknown, so the backend reported may not be the one that runs"
                )
    config_file = _last(flags, "--config")
    if config_file:
        findings.append(
            f"flags in --config {config_file} are not visible here; kvgate reads command and args only"
        )
    metrics_enabled = facts.metrics_flag is None or facts.metrics_flag in flags
    if not metrics_enabled:
        findings.append(
            f"{launch.engine} serves {facts.metrics_path} only with {facts.metrics_flag}"
        )
    return EngineInfo(
        engine=launch.engine,
        model=model,
        revision=_last(flags, "--revision"),
        served_model_name=_last(flags, "--served-model-name"),
        host=host,
        port=port,
        kv_cache_dtype=_last(flags, KV_CACHE_DTYPE_FLAG) or "auto",
        attention_backend=backend,
        metrics_path=facts.metrics_path,
        metrics_enabled=metrics_enabled,
        health_path=facts.health_path,
        engine_args=tuple(texts),
        findings=tuple(findings),
    )


def rewrite_container(
    container: Mapping[str, Any],
    *,
    kv_cache_dtype: str | None,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    engine_version: str | None = None,
) -> dict[str, Any]:
    """A new container with `--kv-cache-dtype` and each flag of `extra_args` set.

    The dtype must be valid for `engine_version` (else the image tag's version); with neither,
    only a value every known version accepts passes (`bfloat16` is not one: vLLM 0.10 lacks it).

    A flag already present keeps its place and form (`--flag value` or `--flag=value`) and
    gets the new value; a missing flag is appended to `args`. A flag of MULTI_VALUE_FLAGS takes
    every value after it (`--flag a b c`): all its old values are replaced by the new ones, in
    `--flag=a` form only when there was that form and there is one new value. `extra_env` sets
    variables. The input is never modified.
    """
    launch = _find_launch(container)
    wanted: list[tuple[str, _Value]] = _flag_pairs(list(extra_args), source="extra_args")
    if kv_cache_dtype is not None:
        version = engine_version or _image_engine_version(container)
        validate_kv_cache_dtype(launch.engine, kv_cache_dtype, version)
        wanted = [(KV_CACHE_DTYPE_FLAG, kv_cache_dtype), *wanted]
    result = copy.deepcopy(dict(container))
    lists: dict[str, list[str]] = {
        "command": list(result.get("command") or []),
        "args": list(result.get("args") or []),
    }
    if launch.script is not None:
        name = str(container.get("name", "?"))
        script = _rewrite_script(launch.script.text, launch, wanted, name)
        lists[launch.script.list_name][launch.script.index] = script
        wanted = []
    appended: list[str] = []
    for flag, value in wanted:
        if isinstance(value, tuple):
            continue  # below, once the one-value flags are in place (it changes list lengths)
        if not _replace_flag(lists, launch.tokens, flag, value):
            appended.extend([flag] if value is None else [flag, value])
    for flag, value in wanted:
        if isinstance(value, tuple):
            tokens = _find_launch({**result, **lists}).tokens
            if not _replace_values(lists, tokens, flag, value):
                appended.extend([flag, *value])
    lists["args"].extend(appended)
    for name in ("command", "args"):
        if lists[name] or name in result:
            result[name] = lists[name]
    if extra_env:
        result["env"] = _rewrite_env(result.get("env") or [], extra_env)
    return result


def _image_engine_version(container: Mapping[str, Any]) -> str | None:
    """The tag's version when the image is an engine's (`vllm/vllm-openai:v0.11.0`)."""
    image = str(container.get("image", ""))
    return image_version(image) if _engine_of_image(image) is not None else None


def _safe_version(version: str | None) -> tuple[int, ...] | None:
    if version is None:
        return None
    try:
        return engine_versions.parse(version)
    except ValueError:
        return None


def _backend_from_json(text: str | None) -> str | None:
    """`-ac '{"backend": "TRITON_ATTN"}'` (vLLM 0.13+ --attention-config JSON)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    backend = value.get("backend") if isinstance(value, dict) else None
    return backend if isinstance(backend, str) else None


def _engine(engine: Engine | str) -> Engine:
    name = str(engine).lower()
    if name not in ENGINE_NAMES:
        raise UnsupportedError(
            f"engine '{engine}' is not known; kvgate supports {', '.join(ENGINE_NAMES)}"
        )
    return Engine(name)


def _find_launch(container: Mapping[str, Any]) -> _Launch:
    name = container.get("name", "?")
    tokens: list[_Token] = []
    for list_name in ("command", "args"):
        values = container.get(list_name) or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SpecError(f"container '{name}'.{list_name}", "must be a list of strings")
        tokens.extend(_Token(list_name, i, v) for i, v in enumerate(values))

    launch = _launcher_in(tokens) or _launcher_in_script(tokens, name)
    if launch is not None:
        return launch
    image = str(container.get("image", ""))
    if not container.get("command"):
        engine = _engine_of_image(image)
        if engine is not None:
            # The image's entrypoint is the server (vllm/vllm-openai) or args start with flags.
            return _Launch(engine, tuple(tokens))
    raise UnsupportedError(
        f"container '{name}' (image '{image}') runs neither vLLM nor SGLang: no `vllm`/`sglang` "
        "command word or `-m vllm…`/`-m sglang…` module before the first flag"
    )


def _launcher_in(tokens: Sequence[_Token]) -> _Launch | None:
    for i, token in enumerate(tokens):
        text = token.text
        if text.startswith("--"):
            return None  # launchers come before the flags
        if text == "-m" and i + 1 < len(tokens):
            root = tokens[i + 1].text.split(".")[0]
            if root in _ENGINE_WORDS:  # python -m vllm.entrypoints.openai.api_server
                return _Launch(Engine(root), _after_serve(tokens, i + 2))
            continue
        word = text.rsplit("/", 1)[-1]
        if word in _ENGINE_WORDS:  # vllm serve M, sglang serve ..., /usr/bin/vllm serve M
            return _Launch(Engine(word), _after_serve(tokens, i + 1))
    return None


def _after_serve(tokens: Sequence[_Token], start: int) -> tuple[_Token, ...]:
    if start < len(tokens) and tokens[start].text == "serve":
        start += 1
    return tuple(tokens[start:])


def _launcher_in_script(tokens: Sequence[_Token], name: str) -> _Launch | None:
    """The engine command inside `sh -c SCRIPT`, looked for in each simple command."""
    texts = [t.text for t in tokens]
    if len(texts) < 3 or texts[0].rsplit("/", 1)[-1] not in _SHELLS or "-c" not in texts[1:-1]:
        return None
    script = tokens[texts.index("-c", 1) + 1]
    lexer = shlex.shlex(script.text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as exc:  # unbalanced quotes
        raise SpecError(f"container '{name}' shell script", f"cannot be split: {exc}") from None
    segment: list[str] = []
    for position, word in enumerate([*words, ";"]):
        if not _is_shell_operator(word):
            segment.append(word)
            continue
        launch = _launcher_in([_Token("script", i, t) for i, t in enumerate(segment)])
        if launch is not None:
            last = position >= len(words)  # nothing (not even `&` or `> log`) after the engine
            return _Launch(launch.engine, launch.tokens, script, last and "#" not in script.text)
        segment = []
    return None


def _flag_then(match: re.Match[str], text: str) -> str:
    """The flag as spelled in the script (with its separator, if matched), then `text`."""
    return match["flag"] + text


def _is_shell_operator(word: str) -> bool:
    return bool(word) and all(c in "();<>|&" for c in word)


def _rewrite_script(
    script: str, launch: _Launch, wanted: Sequence[tuple[str, _Value]], name: str
) -> str:
    """Set flags inside a shell script's text, leaving the rest ($VARS, quoting) as written."""
    present = {_split_flag(t.text)[0] for t in launch.tokens if t.text.startswith("--")}
    appended: list[str] = []
    for flag, value in wanted:
        spelled = "--" + "[-_]".join(re.escape(part) for part in flag[2:].split("-"))
        if flag not in present:
            words = (value,) if isinstance(value, str) else value or ()
            appended.extend([flag, *words])
        elif isinstance(value, tuple):  # every word up to the next option or shell operator
            pattern = re.compile(
                rf"(?<![\w-])(?P<flag>{spelled})"
                rf"(?:=(?:{_SCRIPT_WORD})|(?:[ \t]+(?!-\D)(?:{_SCRIPT_WORD}))*)"
            )
            new = " " + " ".join(shlex.quote(v) for v in value)
            script = pattern.sub(partial(_flag_then, text=new), script)
        elif value is not None:
            pattern = re.compile(rf"(?<![\w-])(?P<flag>{spelled}(?:=|[ \t]+))(?:{_SCRIPT_WORD})")
            script = pattern.sub(partial(_flag_then, text=shlex.quote(value)), script)
    if appended:
        if not launch.script_appendable:
            raise UnsupportedError(
                f"container '{name}': the engine command in its shell script is followed by other "
                f"shell syntax, so {' '.join(appended)} cannot be appended; put the engine "
                "command last in the script or in command/args"
            )
        script = script.rstrip() + " " + shlex.join(appended)
    return script


_SCRIPT_WORD: Final = r"\"[^\"]*\"|'[^']*'|[^\s;&|<>]+"


def _engine_of_image(image: str) -> Engine | None:
    # Drop the registry host and the tag/digest; look at the repository path words.
    path = image.split("@", 1)[0]
    parts = path.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    if parts:
        parts[-1] = parts[-1].split(":", 1)[0]
    words = set(re.split(r"[^a-z0-9]+", "/".join(parts).lower()))
    for name in ENGINE_NAMES:
        if name in words:
            return Engine(name)
    return None


def _flag_values(texts: Sequence[str]) -> dict[str, list[str]]:
    """Every flag with its values in order; a flag without a value maps to ""."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(texts):
        text = texts[i]
        short = text.partition("=")[0]
        if short in _SHORT_FLAGS:  # vLLM's `-ac JSON` / `-ac=JSON`
            text = _SHORT_FLAGS[short] + text[len(short) :]
        if not text.startswith("--"):
            i += 1
            continue
        name, value = _split_flag(text)
        takes_value = name not in _BOOLEAN_FLAGS and i + 1 < len(texts)
        if value is None and name in MULTI_VALUE_FLAGS:
            values = _values_after(texts, i)
            value = " ".join(values) if values else None
            i += len(values)
        elif value is None and takes_value and not texts[i + 1].startswith("--"):
            value = texts[i + 1]
            i += 1
        flags.setdefault(name, []).append(value if value is not None else "")
        i += 1
    return flags


def _last(flags: Mapping[str, list[str]], *names: str) -> str | None:
    # argparse keeps the last occurrence, so does the engine.
    for name in names:
        if name in flags:
            return flags[name][-1]
    return None


def _rewrite_env(
    env: Sequence[Mapping[str, Any]], changes: Mapping[str, str]
) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in env:
        name = entry.get("name")
        if isinstance(name, str) and name in changes:
            seen.add(name)
            result.append({"name": name, "value": changes[name]})
        else:
            result.append(dict(entry))
    result.extend({"name": n, "value": v} for n, v in changes.items() if n not in seen)
    return result
