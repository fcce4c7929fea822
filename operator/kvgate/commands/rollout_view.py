"""What `kvgate get`, `wait`, `approve` and `abort` show of a rollout: one typed reading."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.commands.exit_codes import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from kvgate.inputs import kube_name
from kvgate.records.conditions import STALLED, TRUE
from kvgate.records.status import RolloutStatus
from kvgate.vocabulary import Phase


@dataclass(frozen=True, slots=True)
class RolloutView:
    name: str
    namespace: str
    status: RolloutStatus

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> RolloutView:
        meta = metadata(obj)
        return cls(
            name=str(meta.get("name") or "-"),
            namespace=str(meta.get("namespace") or "-"),
            status=RolloutStatus.from_dict(obj.get("status")),
        )

    @property
    def phase(self) -> Phase:
        return self.status.phase or Phase.PENDING

    def exit_code(self) -> int:
        """0 promoted, not needed or a reported pass; 1 rolled back, failed, declined (the pull
        request was closed) or a closed gate (gate mode: any end but a passing verdict is
        Stalled); 3 not ended."""
        stalled = any(c.type == STALLED and c.status == TRUE for c in self.status.conditions)
        if self.status.ended and stalled:
            return EXIT_GATE_FAILED
        if self.phase in (Phase.PROMOTED, Phase.NOT_NEEDED) or self.status.reported:
            return EXIT_OK
        if self.phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.DECLINED):
            return EXIT_GATE_FAILED
        return EXIT_INCONCLUSIVE

    def headline(self) -> str:
        reason = f" ({self.status.reason})" if self.status.reason else ""
        message = clip(self.status.message or "", 300)
        return f"kvr/{self.name} in {self.namespace}: {self.phase.value}{reason}" + (
            f": {message}" if message else ""
        )

    def lines(self, events: Sequence[Mapping[str, Any]] = ()) -> list[str]:
        """The status view: phase, gates, eval progress, the engine's advice, the approval hash
        and recent Events."""
        out = [self.headline()]
        for gate, record in self.status.gates.items():
            outcome = record.outcome.value
            detail = clip(record.message or record.reason, 140)
            out.append(f"  gate {gate:<14} {outcome:<12} {detail}")
        progress = self.status.eval.look_progress if self.status.eval else None
        if progress is not None and not self.status.ended:
            diff = progress.difference
            shown = f", candidate - control {100 * diff:+.1f} pp" if diff is not None else ""
            out.append(
                f"  eval look {progress.look}/{progress.looks_planned or '?'}: "
                f"{progress.questions} questions{shown}"
            )
        if (
            self.phase is Phase.AWAITING_APPROVAL
            and not self.status.reported
            and self.status.config_hash
        ):
            expires = self.status.approval_expires_at  # "2026-12-04T10:48:00Z"
            when = f"; expires {expires[:10]} {expires[11:16]} UTC" if expires else ""
            out.append(
                f"  approve: kvgate approve {self.name} -n {self.namespace}"
                f"  (annotates kvgate.io/approve={self.status.config_hash}{when})"
            )
        pre = self.status.preflight
        for note in pre.advice if pre is not None else ():  # the engine's guidance: not a gate
            out.append(f"  advice {note.code or '?'}: {clip(note.message or '', 140)}")
        pr = self.status.pull_request
        if pr is not None and pr.number is not None:  # pullRequest mode
            merged = f" as {pr.merge_sha[:12]}" if pr.merge_sha else ""
            out.append(
                f"  pull request #{pr.number} {pr.state or '?'}{merged}: {pr.url or pr.repository}"
            )
        for event in list(events)[-5:]:
            message = clip(str(event.get("message") or ""), 140)
            out.append(f"  event {event.get('type', '?'):<7} {event.get('reason', '?')}: {message}")
        return out


def name_arguments(
    parser: argparse.ArgumentParser, *, optional: bool = False, help: str = "KVCacheRollout name"
) -> None:
    """The rollout's name and namespace, refused unless Kubernetes names (before any API call)."""
    parser.add_argument("name", nargs="?" if optional else None, type=kube_name(), help=help)
    parser.add_argument(
        "-n",
        "--namespace",
        type=kube_name(label=True),
        help="namespace (default: the kubeconfig's)",
    )


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut at a word before `limit` with an ellipsis when longer (first-hour-2
    N9, N23: "...4 I (still running after 3s)", "... (margin " with nothing to say it was cut)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:(") + "…"
