"""Pull requests on a Git forge (Gitea, GitHub, GitLab) through its REST API, over httpx.

No clone, no git binary, no SSH key: files are committed through the forge's API (Gitea's
`POST /repos/{o}/{r}/contents`, GitHub's contents API, GitLab's commits API), on a branch
created from the base branch's current head, so a moved base needs no rebase.

Idempotent: an open pull request for the branch is updated, never duplicated, and files that
already hold the content make no new commit. kvgate writes only branches under `kvgate/`.
Every failure is a `ForgeError`; a refused token or a missing permission is a
`ForgeAccessError` naming the repository and the permission. The token never appears in an
error or a log line: it is checked before use (a header value cannot carry it otherwise) and
removed from every text that came back from the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import httpx

from kvgate.adapters.forge.base import ForgeApi, PullRequestState, RestForge
from kvgate.adapters.forge.providers import GITEA, GITHUB, GITLAB
from kvgate.errors import SpecError

__all__ = ["PullRequestState", "RestForge", "forge_for"]

FORGES: Final[Mapping[str, ForgeApi]] = {api.name: api for api in (GITEA, GITHUB, GITLAB)}


def forge_for(
    provider: str, api_url: str, token: str, *, client: httpx.Client | None = None
) -> RestForge:
    """The forge client for `provider` (`gitea`, `github` or `gitlab`)."""
    try:
        api = FORGES[provider]
    except KeyError:
        raise SpecError(
            "promotion.git.provider", f"{provider!r} is not one of {', '.join(FORGES)}"
        ) from None
    return RestForge(api, api_url, token, client=client)
