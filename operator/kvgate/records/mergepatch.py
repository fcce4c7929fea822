"""RFC 7386 JSON merge patches: the status patch the controller sends holds only what changed.

Argo Rollouts' `persistRolloutStatus` does the same: a two-way merge patch of the old status
against the new one, and no request at all when nothing changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `old` into `new`: changed keys only, None for a removed
    key, nested objects patched key by key. `{}` means nothing changed (send no patch).

    A None in `new` means absent (as in a merge patch), so it removes the key or is left out.
    """
    patch: dict[str, Any] = {}
    for key in old:
        if new.get(key) is None and old[key] is not None:
            patch[key] = None
    for key, value in new.items():
        if value is None:
            continue
        was = old.get(key)
        if isinstance(value, Mapping) and isinstance(was, Mapping):
            inner = merge_patch(was, value)
            if inner:
                patch[key] = inner
        elif isinstance(value, Mapping) or was != value or type(was) is not type(value):
            patch[key] = _without_nulls(value)
    return patch


def apply_merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: `patch` applied to a copy of `target` (what the apiserver does with it)."""
    out = {k: v for k, v in target.items()}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            was = out.get(key)
            out[key] = apply_merge_patch(was if isinstance(was, Mapping) else {}, value)
        else:
            out[key] = _without_nulls(value)
    return out


def minimal(
    old: Mapping[str, Any], changes: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the document `changes` makes of `old`, the merge patch of what it really changes):
    a merge patch that sets a key to the value it has is no change."""
    new = apply_merge_patch(old, changes)
    return new, merge_patch(old, new)


def _without_nulls(value: Any) -> Any:
    """A merge-patch value as applied: nulls in objects mean absent; arrays are taken whole."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)
