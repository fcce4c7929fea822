"""The file kvgate owns in a GitOps repository, and the branch that carries it. Pure.

In `pullRequest` promotion kvgate writes one file, whole, and proposes it on its own branch:
a kustomize strategic-merge patch naming the Deployment and the container. It carries

- `args` as the full tested list (and `command` when the change touched it): both are
  atomic lists in core/v1, so a strategic-merge patch replaces them whole, and a partial
  list would silently drop the flags it does not name;
- `env` as only the entries kvgate changed: env is a map list keyed by `name`, so the patch
  merges them into the manifest's own env; a removed variable becomes `$patch: delete`;
- the pod-template annotation `kvgate.io/verdict` with the verdict key, so the applied pod
  template names the evaluation it was promoted on (and changing the key rolls the pods).

Or, with `kind: helmValues`, a Helm values file holding the same change under a declared
`valuesKey` (`args`: the full list, `env`: the added or changed entries, `podAnnotations`: the
verdict annotation) for a chart that renders those keys into the engine container.

The user references the file once (`patches: [{path: ...}]` in their `kustomization.yaml`);
rewriting it whole means no comment-preserving YAML edit and no conflict with other writers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import yaml

from kvgate.change.container import env_by_name
from kvgate.errors import SpecError
from kvgate.spec.reader import is_label, is_subdomain
from kvgate.spec.rollout import VALUES_KEY

BRANCH_PREFIX: Final = "kvgate/"
ANNOTATION_VERDICT: Final = "kvgate.io/verdict"
HEADER: Final = (
    "# Written by kvgate, whole: edits here are replaced by its next pull request.\n"
    "# The tested container change (args is the full list) and the verdict it was promoted on.\n"
)
_HASH: Final = re.compile(r"^[0-9a-f]{8,64}\Z")
# The verdict key goes into an annotation value and a commit: printable, no whitespace.
_KEY: Final = re.compile(r"^[\x21-\x7e]{1,256}\Z")


def branch_name(rollout: str, config_hash: str) -> str:
    """`kvgate/<rollout>-<configHash>`: one branch per evaluated configuration.

    A rollout name is a DNS-1123 subdomain and the hash is hex, so the result is always a
    valid Git ref (no `..`, no space, no `~^:?*[`, no trailing `.lock` or `/`).
    """
    if not is_subdomain(rollout):
        raise SpecError("metadata.name", f"{rollout!r} is not a Kubernetes object name")
    if not _HASH.match(config_hash):
        raise SpecError("status.configHash", f"{config_hash!r} is not a lowercase hex hash")
    return f"{BRANCH_PREFIX}{rollout}-{config_hash}"


def is_kvgate_branch(branch: str) -> bool:
    """True for a branch under `kvgate/` (the only branches kvgate writes)."""
    rest = branch.removeprefix(BRANCH_PREFIX)
    return (
        branch.startswith(BRANCH_PREFIX)
        and bool(rest)
        and all(part and not part.startswith(".") for part in rest.split("/"))
        and ".." not in rest
        and not rest.endswith(".lock")
        and not any(c.isspace() or c in "~^:?*[\\" or ord(c) < 0x20 for c in rest)
    )


def _string_list(container: Mapping[str, Any], key: str, side: str) -> list[str] | None:
    value = container.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{side}.{key}", "is not a list of strings")
    return list(value)


def render_kustomize_patch(
    *,
    deployment: str,
    container: str,
    previous: Mapping[str, Any],
    candidate: Mapping[str, Any],
    verdict_key: str,
    namespace: str | None = None,
) -> str:
    """The strategic-merge patch file (YAML text) that turns `previous` into `candidate`.

    `previous` and `candidate` are container configs (`command`, `args`, `env`), as
    `manifests.container_config` returns them. Deterministic: the same input gives the same
    bytes, so re-proposing an unchanged verdict makes no new commit.
    """
    if not is_subdomain(deployment):
        raise SpecError("spec.target.name", f"{deployment!r} is not a Deployment name")
    if not is_label(container):
        raise SpecError("spec.target.container", f"{container!r} is not a container name")
    if namespace is not None and not is_label(namespace):
        raise SpecError("metadata.namespace", f"{namespace!r} is not a namespace name")
    if not _KEY.match(verdict_key):
        raise SpecError("verdict key", "must be 1-256 printable characters without spaces")

    entry: dict[str, Any] = {"name": container}
    for key in ("command", "args"):
        before = _string_list(previous, key, "previous")
        after = _string_list(candidate, key, "candidate")
        if key == "args" or before != after:
            # null deletes the field in a strategic-merge patch: the candidate has none.
            entry[key] = after
    env = _env_changes(previous, candidate)
    if env:
        entry["env"] = env

    metadata: dict[str, Any] = {"name": deployment}
    if namespace is not None:
        metadata["namespace"] = namespace
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "template": {
                "metadata": {"annotations": {ANNOTATION_VERDICT: verdict_key}},
                "spec": {"containers": [entry]},
            }
        },
    }
    return HEADER + yaml.safe_dump(patch, sort_keys=False, default_flow_style=False, width=1000)


def _env_changes(
    previous_container: Mapping[str, Any], candidate_container: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The candidate's added or changed env entries, then `$patch: delete` for removed names.

    A changed entry also nulls the keys only the previous one had (`valueFrom` -> `value`),
    since a strategic merge merges the entry's fields and would otherwise keep both.
    """
    previous, candidate = env_by_name(previous_container), env_by_name(candidate_container)
    out: list[dict[str, Any]] = []
    for name, entry in candidate.items():
        before = previous.get(name)
        if before != entry:
            gone = {k: None for k in (before or {}) if k not in entry}
            out.append({**dict(entry), **gone})
    out += [{"name": name, "$patch": "delete"} for name in previous if name not in candidate]
    return out


HELM_HEADER: Final = (
    "# Written by kvgate, whole: edits here are replaced by its next pull request.\n"
    "# The tested container change (args is the full list, env the entries kvgate changes)\n"
    "# and the verdict it was promoted on, for the chart to render into the engine container.\n"
)


def render_helm_values(
    *,
    values_key: str,
    previous: Mapping[str, Any],
    candidate: Mapping[str, Any],
    verdict_key: str,
) -> str:
    """A Helm values file (YAML text) with the change under `values_key` (dotted, e.g.
    `vllm.container`): `args`, `env` and `podAnnotations` (the verdict key). Deterministic.

    Helm merges values maps but replaces lists, so `args` is the full tested list (as in the
    kustomize patch) and `env` only the entries kvgate adds or changes, for the chart to merge
    by name. A removed variable or a changed `command` cannot be expressed as values: SpecError
    (use kustomizePatch).
    """
    if not VALUES_KEY.match(values_key):
        raise SpecError("spec.promotion.pullRequest.valuesKey", f"{values_key!r} is not a.b.c")
    if not _KEY.match(verdict_key):
        raise SpecError("verdict key", "must be 1-256 printable characters without spaces")
    if _string_list(previous, "command", "previous") != _string_list(
        candidate, "command", "candidate"
    ):
        raise SpecError(
            "spec.promotion.pullRequest.kind",
            "the tested change sets the container's command, which helmValues does not carry; "
            "use kustomizePatch",
        )
    env = _env_changes(previous, candidate)
    removed = [e["name"] for e in env if e.get("$patch") == "delete"]
    if removed:
        raise SpecError(
            "spec.promotion.pullRequest.kind",
            f"the tested change removes env {', '.join(removed)}, which helmValues cannot "
            "express; use kustomizePatch",
        )
    block: dict[str, Any] = {"args": _string_list(candidate, "args", "candidate") or []}
    if env:
        block["env"] = [{k: v for k, v in e.items() if v is not None} for e in env]
    block["podAnnotations"] = {ANNOTATION_VERDICT: verdict_key}
    values: dict[str, Any] = block
    for part in reversed(values_key.split(".")):
        values = {part: values}
    return HELM_HEADER + yaml.safe_dump(
        values, sort_keys=False, default_flow_style=False, width=1000
    )
