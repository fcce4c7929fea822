"""What kvgate changes in the production container, whether it is still there, how to undo it.

kvgate's change is the difference between the evaluated container (`previous`) and the
candidate. The live container may have been edited by others since (an image bump, an arg, a
mutating webhook's env var), so nothing here compares whole containers: each of kvgate's edits
is located in the live container on its own. `revert` removes exactly kvgate's edits that are
still there and keeps everything else (a three-way merge); `carries` says whether all of them
are there; `reverted` whether none is. Pure: containers in, containers and JSON patches out.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

FIELDS: Final = ("command", "args", "env")
GUARDED: Final = ("image", *FIELDS)  # what must be as evaluated before kvgate patches


@dataclass(frozen=True, slots=True)
class _ListEdit:
    """kvgate replaced previous[i1:i2] with candidate[j1:j2] in one list field."""

    field: str
    i1: int
    i2: int
    j1: int
    j2: int


def _list(container: Mapping[str, Any], key: str) -> list[Any]:
    value = container.get(key)
    return list(value) if isinstance(value, list) else []


def env_by_name(container: Mapping[str, Any]) -> dict[str, Any]:
    """env by name (the last entry wins, as in the kubelet)."""
    out: dict[str, Any] = {}
    for item in _list(container, "env"):
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            out[item["name"]] = dict(item)
    return out


def _list_edits(previous: Sequence[Any], candidate: Sequence[Any], key: str) -> list[_ListEdit]:
    matcher = difflib.SequenceMatcher(None, list(previous), list(candidate), autojunk=False)
    return [
        _ListEdit(key, i1, i2, j1, j2)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _live_span(candidate: Sequence[Any], live: Sequence[Any], edit: _ListEdit) -> slice | None:
    """Where the candidate's tokens of `edit` stand in `live`, or None when they are not there.

    The candidate is aligned to the live list; the edit is present when its tokens are aligned
    one to one and contiguous, and (for an edit that only deleted) its neighbours are adjacent.
    """
    matcher = difflib.SequenceMatcher(None, list(candidate), list(live), autojunk=False)
    where: dict[int, int] = {}
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            where[a + k] = b + k
    if edit.j2 > edit.j1:
        positions = [where.get(j) for j in range(edit.j1, edit.j2)]
        if any(p is None for p in positions):
            return None
        first, last = positions[0], positions[-1]
        assert first is not None and last is not None
        if last - first != edit.j2 - edit.j1 - 1:
            return None
        return slice(first, last + 1)
    # kvgate only removed tokens here: present when the neighbours are adjacent in live.
    before = where.get(edit.j1 - 1) if edit.j1 > 0 else -1
    after = where.get(edit.j1) if edit.j1 < len(candidate) else len(live)
    if before is None or after is None or after != before + 1:
        return None
    return slice(after, after)


def _env_changes(previous: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """Names whose entry kvgate added, changed or removed."""
    p, c = env_by_name(previous), env_by_name(candidate)
    return sorted(n for n in p.keys() | c.keys() if p.get(n) != c.get(n))


def _present(
    live: Mapping[str, Any], previous: Mapping[str, Any], candidate: Mapping[str, Any]
) -> tuple[list[tuple[_ListEdit, slice]], list[str], int]:
    """(kvgate's list edits found in live with their spans, env names still as kvgate set
    them, total number of kvgate edits)."""
    found: list[tuple[_ListEdit, slice]] = []
    total = 0
    for key in ("command", "args"):
        cand = _list(candidate, key)
        for edit in _list_edits(_list(previous, key), cand, key):
            total += 1
            span = _live_span(cand, _list(live, key), edit)
            if span is not None:
                found.append((edit, span))
    live_env, cand_env = env_by_name(live), env_by_name(candidate)
    names = _env_changes(previous, candidate)
    total += len(names)
    env_found = [n for n in names if live_env.get(n) == cand_env.get(n)]
    return found, env_found, total


def carries(
    live: Mapping[str, Any], previous: Mapping[str, Any], candidate: Mapping[str, Any]
) -> bool:
    """Every edit kvgate makes is in the live container (and kvgate makes at least one)."""
    found, env_found, total = _present(live, previous, candidate)
    return total > 0 and len(found) + len(env_found) == total


def reverted(
    live: Mapping[str, Any], previous: Mapping[str, Any], candidate: Mapping[str, Any]
) -> bool:
    """None of kvgate's edits is left in the live container."""
    found, env_found, _ = _present(live, previous, candidate)
    return not found and not env_found


def revert(
    live: Mapping[str, Any],
    previous: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    view: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The live container's command/args/env with kvgate's edits taken out, all else kept.

    `view` is the live container as `previous` and `candidate` record it (secret values
    fingerprinted token for token): kvgate's edits are located in it, and taken out of `live`.
    """
    found, env_found, _ = _present(view if view is not None else live, previous, candidate)
    out = {k: copy.deepcopy(live[k]) for k in FIELDS if k in live}
    for key in ("command", "args"):
        edits = sorted(((e, s) for e, s in found if e.field == key), key=lambda es: -es[1].start)
        if not edits:
            continue
        tokens = _list(live, key)
        prev = _list(previous, key)
        for edit, span in edits:  # from the end, so earlier spans keep their positions
            tokens[span] = prev[edit.i1 : edit.i2]
        if tokens or key in previous:
            out[key] = tokens
        else:
            out.pop(key, None)
    if env_found:
        prev_env = env_by_name(previous)
        entries: list[Any] = []
        restored: set[str] = set()
        for item in _list(live, "env"):
            name = item.get("name") if isinstance(item, Mapping) else None
            if name in env_found:
                if name in prev_env and name not in restored:
                    entries.append(copy.deepcopy(prev_env[name]))
                    restored.add(name)
                continue
            entries.append(copy.deepcopy(item))
        # A variable kvgate changed and someone moved stays where the live list has it.
        if entries or "env" in previous:
            out["env"] = entries
        else:
            out.pop("env", None)
    return out


def _config(container: Mapping[str, Any]) -> dict[str, Any]:
    """command, args and env (by name) of a container: what a config is, order of env aside."""
    return {"command": _list(container, "command"), "args": _list(container, "args"),
            "env": env_by_name(container)}  # fmt: skip


def changed_around(
    live: Mapping[str, Any], previous: Mapping[str, Any], candidate: Mapping[str, Any]
) -> list[str]:
    """The fields (command, args, env) in which the live container is neither the tested
    candidate nor the config before the rollout: something other than kvgate's change (a backend
    env edit, another arg) now runs with it, or instead of part of it. Empty for the candidate
    and for the previous config (a change not applied yet, or taken out: not a new config)."""
    now, tested, before = _config(live), _config(candidate), _config(previous)
    if now in (tested, before):
        return []
    return [k for k in FIELDS if now[k] != tested[k]]


@dataclass(frozen=True, slots=True)
class Comparison:
    """A live container, as status records it, against the evaluated one and kvgate's change."""

    differences: tuple[str, ...]  # GUARDED fields (env with valueFrom) unlike the evaluated
    carries_candidate: bool  # every edit kvgate makes is there
    ours_present: bool  # at least one edit kvgate makes is there
    changed_around: tuple[str, ...]  # fields where it is neither the candidate nor the previous


def compare(
    live: Mapping[str, Any],
    evaluated: Mapping[str, Any],
    previous: Mapping[str, Any],
    candidate: Mapping[str, Any],
) -> Comparison:
    """`live` against the evaluated container and kvgate's change (`previous` -> `candidate`;
    nothing is changed around an empty candidate: none was recorded)."""
    return Comparison(
        differences=tuple(k for k in GUARDED if evaluated.get(k) != live.get(k)),
        carries_candidate=carries(live, previous, candidate),
        ours_present=not reverted(live, previous, candidate),
        changed_around=tuple(changed_around(live, previous, candidate)) if candidate else (),
    )


def patch_ops(
    index: int, live: Mapping[str, Any], wanted: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A test-and-set JSON patch from the live container's command/args/env to `wanted`'s.

    It tests the container's name and every field it changes at its live value, so a
    Deployment edited between the read and the patch makes the apiserver refuse the patch
    (422) rather than lose the other edit. Returns [] when nothing changes.
    """
    base = f"/spec/template/spec/containers/{index}"
    tests: list[dict[str, Any]] = [{"op": "test", "path": f"{base}/name", "value": live["name"]}]
    ops: list[dict[str, Any]] = []
    for key in FIELDS:
        before, after = live.get(key), wanted.get(key)
        if before == after:
            continue
        if before is not None:
            tests.append({"op": "test", "path": f"{base}/{key}", "value": before})
        if after is None:
            ops.append({"op": "remove", "path": f"{base}/{key}"})
        else:
            ops.append({"op": "add" if before is None else "replace", "path": f"{base}/{key}",
                        "value": after})  # fmt: skip
    return tests + ops if ops else []
