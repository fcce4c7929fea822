"""Container configurations and error texts made safe to show: status, Events, logs, the report.

A production container's env and args may carry credentials (`HF_TOKEN=hf_...`,
`--api-key sk-...`). kvgate keeps the real values only where it needs them (the JSON patch it
applies, the revert it may have to apply) and shows everything else through these functions:

- `redact_env`: every literal `value` becomes `sha256:<first 12 hex>` (enough to see that two
  values differ, or match a value one already knows), except names listed in `show` that do
  not look secret; `valueFrom` references are kept as they are (a Secret's name and key are
  not the secret).
- `redact_args`: the value of a flag whose name looks secret (`--api-key`, `--hf-token`,
  anything with token, secret, key, password, passwd, credential or auth in its name) becomes
  a fingerprint, in both `--flag v` and `--flag=v` form, also inside an `sh -c` script.
- `redact_config`: both, over a `manifests.container_config` dict (`command`, `args`, `env`).
- `scrub_text`: a free-form message (an exception, a log line) with bearer tokens,
  Authorization headers, PEM blocks, JWTs, Hugging Face / GitHub tokens and URL passwords
  replaced; `clipped`: the same, then cut short (never cut first: a cut token stops matching).
- `hide`: a message without a secret kvgate holds (by value, whatever its shape), then scrubbed.

A fingerprint is a truncated unsalted SHA-256: it hides a high-entropy credential, not a
guessable one (a short password can be found by trying candidates). Pure: no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

REDACTED: Final = "<redacted>"
# "token" but not "tokens" (a count: --max-num-batched-tokens) nor "tokenizer" (a model path).
_SECRET_WORDS: Final = (
    r"token(?!s|iz)",
    "secret",
    "key",
    "password",
    "passwd",
    "credential",
    "auth",
)
_SECRET_NAME_RE: Final = re.compile("|".join(_SECRET_WORDS), re.IGNORECASE)
# A secret-looking `--flag value` / `--flag=value` inside a shell script's text.
_SCRIPT_FLAG_RE: Final = re.compile(
    r"(?<![\w-])(?P<flag>--[\w.-]*(?:" + "|".join(_SECRET_WORDS) + r")[\w.-]*)"
    r"(?P<sep>=|[ \t]+)(?!--)(?P<value>\"[^\"]*\"|'[^']*'|[^\s;&|<>]+)",
    re.IGNORECASE,
)
# A secret-looking `NAME=value` assignment inside a shell script (export HF_TOKEN=...).
_SCRIPT_ASSIGN_RE: Final = re.compile(
    r"(?<![\w-])(?P<name>[A-Za-z_]\w*(?:" + "|".join(_SECRET_WORDS) + r")\w*)="
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s;&|<>]+)",
    re.IGNORECASE,
)


_FINGERPRINT_RE: Final = re.compile(r"sha256:[0-9a-f]{12}")


def fingerprint(value: str) -> str:
    """`sha256:` and the first 12 hex digits of the value's SHA-256.

    A value that already is a fingerprint is returned as it is, so redacting twice (a status
    that was redacted before) changes nothing.
    """
    if _FINGERPRINT_RE.fullmatch(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def looks_secret(name: str) -> bool:
    """True for a flag or variable name that suggests a credential (`--api-key`, `HF_TOKEN`)."""
    return bool(_SECRET_NAME_RE.search(name))


def redact_env(
    env: Iterable[Mapping[str, Any]] | None, *, show: Collection[str] = ()
) -> list[dict[str, Any]]:
    """A copy of a container's env with literal values fingerprinted.

    Names in `show` keep their value unless they look secret (pass the rollout's allowlisted
    names to keep e.g. `VLLM_USE_FLASHINFER_SAMPLER=0` readable). An empty value stays empty.
    """
    out: list[dict[str, Any]] = []
    for entry in env or []:
        if not isinstance(entry, Mapping):
            out.append({"value": REDACTED})
            continue
        item = {k: copy.deepcopy(v) for k, v in entry.items() if k != "value"}
        if "value" in entry:
            value, name = entry["value"], str(entry.get("name", ""))
            keep = value is None or value == "" or (name in show and not looks_secret(name))
            item["value"] = value if keep else fingerprint(str(value))
        out.append(item)
    return out


def redact_args(args: Sequence[str] | None) -> list[str]:
    """A copy of an argument list with the values of secret-looking flags fingerprinted."""
    tokens = [str(t) for t in args or []]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        name, eq, value = token.partition("=")
        if token.startswith("--") and looks_secret(name):
            if eq:
                out.append(f"{name}={fingerprint(value)}")
                continue
            out.append(token)
            if i < len(tokens) and not tokens[i].startswith("--"):
                out.append(fingerprint(tokens[i]))
                i += 1
            continue
        if any(c.isspace() for c in token):  # an `sh -c` script: redact inside its text
            token = _redact_script(token)
        out.append(token)
    return out


def _redact_script(text: str) -> str:
    text = _SCRIPT_FLAG_RE.sub(
        lambda m: f"{m['flag']}{m['sep']}{fingerprint(_unquote(m['value']))}", text
    )
    return _SCRIPT_ASSIGN_RE.sub(lambda m: f"{m['name']}={fingerprint(_unquote(m['value']))}", text)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def redact_config(
    config: Mapping[str, Any] | None, *, show_env: Collection[str] = ()
) -> dict[str, Any]:
    """A `manifests.container_config` dict (`command`, `args`, `env`) safe for status."""
    out: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if key in ("command", "args"):
            out[key] = redact_args(value)
        elif key == "env":
            out[key] = redact_env(value, show=show_env)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- free-form text -------------------------------------------------------------------------------

_TEXT_RULES: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # PEM blocks, also one cut off before its END line.
    (
        re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.DOTALL),
        "<redacted PEM block>",
    ),
    # Authorization: Bearer x / Basic x / Token x, and a bare "Bearer x".
    (
        re.compile(r"(?i)\b(authorization\s*[:=]\s*)((?:bearer|basic|token)\s+)?[^\s,;'\"]+"),
        r"\1\2<redacted>",
    ),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 <redacted>"),
    # JSON Web Tokens (Kubernetes service-account tokens are JWTs).
    (
        re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        "<redacted JWT>",
    ),
    # Hugging Face, GitHub, OpenAI-style keys.
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "<redacted token>"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "<redacted token>"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), "<redacted token>"),
    # user:password@ in URLs.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1<redacted>@"),
    # token=..., api_key=... (query strings, key=value logs) and "token": "..." (JSON). A
    # boolean is a setting, not a credential (a label such as kvgate.io/hub-token=true).
    (
        re.compile(
            r"(?i)\b([\w.-]*(?:token(?!s)|secret|api[_-]?key|password|passwd)[\w.-]*)"
            r"=(?!<redacted)(?!(?:true|false)(?:[\s&,;\"']|$))[^\s&,;\"']+"
        ),
        r"\1=<redacted>",
    ),
    (
        re.compile(
            r"(?i)(\"[\w.-]*(?:token(?!s)|secret|api[_-]?key|password|passwd)[\w.-]*\"\s*:\s*)"
            r"\"(?!<redacted)[^\"]*\""
        ),
        r'\1"<redacted>"',
    ),
)


def scrub_text(text: str) -> str:
    """`text` with anything that looks like a credential replaced by `<redacted ...>`."""
    for pattern, replacement in _TEXT_RULES:
        text = pattern.sub(replacement, text)
    return text


def clipped(text: str, limit: int) -> str:
    """`scrub_text` of `text`, then cut to `limit` characters: scrubbed first, so that a token
    across the cut is still matched whole (cut first, its start would stay, too short to match).
    Only the first 4 KiB are scrubbed: what lies past them is cut anyway."""
    return scrub_text(text[: max(limit, 4096)])[:limit]


def hide(text: str, *secrets: str | None) -> str:
    """`text` without any of `secrets` (as sent, escaped or quoted, or any line of one), then
    `scrub_text`. For messages built from errors that may echo a request (a token in a header)."""
    for secret in secrets:
        if not secret:
            continue
        forms = {
            secret,
            ascii(secret)[1:-1],
            secret.encode("unicode_escape").decode("ascii"),
            repr(secret.encode("utf-8", "replace"))[2:-1],  # b'...' as h11 quotes a header
            "".join(c if c.isprintable() else ascii(c)[1:-1] for c in secret),  # the CLI's line
        }
        # A line or a run of printable characters of it, should a message quote only a part.
        forms.update(p for p in re.split(r"[\s\x00-\x1f\x7f\"'\\]+", secret) if len(p) >= 6)
        for form in sorted(forms, key=len, reverse=True):
            if form:
                text = text.replace(form, "<redacted>")
    return scrub_text(text)
