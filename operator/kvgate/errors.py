"""The one exception tree of kvgate.

    KvgateError
    ├── InputError (also ValueError)   bad input: retrying will not help
    │   ├── SpecError        .field     a KVCacheRollout spec or CLI value
    │   ├── ParseError       .source .line_no   a file or text that cannot be read
    │   └── UnsupportedError            engine, version or architecture not known
    └── ExternalError                   something outside failed; it may pass
        ├── KubeError        .status
        ├── ScrapeError      .url
        ├── PrometheusError  .url      the Prometheus HTTP API (config.prometheusURL)
        ├── HubError
        ├── EvalError
        └── ForgeError       .repo     a Git forge's REST API (GitHub, GitLab, Gitea)
            └── ForgeAccessError        the token cannot read or write the repository

Messages are one sentence that names the field or file, the value and the fix.
"""

from __future__ import annotations


class KvgateError(Exception):
    """Root of every error kvgate raises on purpose."""


class InputError(KvgateError, ValueError):
    """The input is wrong; the same call will fail again."""


class SpecError(InputError):
    """A spec or option value is invalid; `field` names it (e.g. `spec.accuracy.margin`)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class ParseError(InputError):
    """A file or text cannot be parsed; `source` names it, `line_no` points at the line."""

    def __init__(self, source: str, message: str, line_no: int | None = None) -> None:
        self.source = source
        self.line_no = line_no
        where = f"{source}:{line_no}" if line_no is not None else source
        super().__init__(f"{where}: {message}")


class UnsupportedError(InputError):
    """An engine, version or model architecture kvgate does not know."""


class ExternalError(KvgateError):
    """Something outside kvgate failed (API server, endpoint, hub, eval job)."""


class KubeError(ExternalError):
    """A Kubernetes API call failed; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ScrapeError(ExternalError):
    """An HTTP endpoint (metrics, health, completions) could not be read; `url` names it."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        self.url = url
        self.status = status  # the HTTP status of an answer that was not 2xx, else None
        super().__init__(f"{url}: {message}")


class PrometheusError(ExternalError):
    """Prometheus could not be read, or answered with something that is not a PromQL result."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        super().__init__(f"{url}: {message}")


class HubError(ExternalError):
    """The Hugging Face hub (or its mirror) could not be read; `unreachable`: no answer at all
    (HF_HUB_OFFLINE, no route), so a local cache may serve instead."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        self.unreachable = unreachable
        super().__init__(message)


class EvalError(ExternalError):
    """The accuracy evaluation could not produce a result (not an accuracy failure)."""


class ForgeError(ExternalError):
    """A Git forge's REST API failed for `repo` (`owner/name`); the token is never in the text."""

    def __init__(self, repo: str, message: str, status: int | None = None) -> None:
        self.repo = repo
        self.status = status
        super().__init__(f"repository {repo}: {message}")


class ForgeAccessError(ForgeError):
    """The token was refused, or lacks a permission kvgate needs on the repository."""


def brief(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters, for error messages about hostile input."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"  # repr of a huge int is slow
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
