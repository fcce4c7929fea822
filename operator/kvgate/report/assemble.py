"""What does the report show of one rollout? Its one view (`ReportView`), built once from the
typed spec, the rollout's name and the typed status, which the text, HTML and SVG renderers take
(as Argo Rollouts' CLI builds one `RolloutInfo` for its printers).

`view_of` is the edge for any JSON (`kubectl get kvr NAME -o json`): the status is read once
(`RolloutStatus.from_dict`, total), the spec once (`RolloutSpec.from_dict`; a spec the operator
would refuse is unknown, shown "-"), and nothing is guessed. The controller builds the view
from the records it already holds (`build`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from kvgate.errors import KvgateError
from kvgate.judge import crash
from kvgate.records.status import RolloutStatus
from kvgate.records.timestamps import parse_time
from kvgate.report import view
from kvgate.report.fmt import DASH
from kvgate.report.records import Header, Headline, ReportView
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Phase, PromotionMode


def view_of(rollout: object, now: dt.datetime | None = None) -> ReportView:
    """Any JSON value as the report's view; `now` (default: the clock) only says how long an
    unfinished rollout has been running."""
    if not isinstance(rollout, Mapping):
        rollout = {}
    meta = rollout.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = spec_of(rollout.get("spec"))
    status = RolloutStatus.from_dict(rollout.get("status"))  # the one parse
    return build(spec, status, namespace=meta.get("namespace"), name=meta.get("name"), now=now)


def spec_of(raw: object) -> RolloutSpec | None:
    """The spec as the operator reads it; None for a spec it would refuse (or none at all)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return RolloutSpec.from_dict(raw)
    except (ExceptionGroup, KvgateError, ValueError, TypeError):
        return None


def build(
    spec: RolloutSpec | None,
    status: RolloutStatus,
    *,
    namespace: object,
    name: object,
    now: dt.datetime | None = None,
) -> ReportView:
    """The view of a rollout: each part read once from the typed records."""
    head = _header(spec, status, namespace, name)
    approval = _approval(head, status)
    return view.read_view(
        status,
        head,
        headline=_headline(head.message, bool(approval)),
        production=_production(head, status),
        approval=approval,
        now=now or dt.datetime.now(dt.UTC),
    )


def _header(
    spec: RolloutSpec | None, status: RolloutStatus, namespace: object, name: object
) -> Header:
    """Identity, target, promotion mode, candidate dtype, phase and the message to show."""
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    message = status.message or (ready.message if ready is not None else None)
    return Header(
        namespace=namespace if isinstance(namespace, str) and namespace else DASH,
        name=name if isinstance(name, str) and name else DASH,
        target=f"Deployment/{spec.target.name or DASH}" if spec is not None else DASH,
        mode=spec.promotion.mode.value if spec is not None else None,
        kv_cache_dtype=spec.kv_cache_dtype if spec is not None else None,
        phase=status.phase.value if status.phase is not None else "Pending",
        message=message or None,
        questions_planned=spec.accuracy.questions if spec is not None else None,
    )


def _headline(message: str | None, approval_shown: bool) -> Headline | None:
    """The message to lead with. A crash message (`kvgate.judge.crash`) leads with its classified cause,
    then the remedy and where it goes; the engine's own line is kept in `raw`."""
    if not message:
        return None
    found = crash.read(message)
    if found is None:
        what, remedy = view.split_remedy(message)
        if approval_shown:  # the commands follow, with the hash (first-hour-2 #26)
            what = what.split("; approve with annotation ")[0]
        return Headline(cause=what, remedy=remedy)
    return Headline(
        cause=found.headline, remedy=found.remedy_shown, where=found.where, raw=found.raw
    )


def _production(head: Header, status: RolloutStatus) -> str | None:
    """What the rollout did (or will do) to the target Deployment, in one line."""
    if head.target == DASH:
        return None
    phase = status.phase or Phase.PENDING
    target = head.target.replace("/", " ", 1)
    dtype = head.kv_cache_dtype
    config = (
        "the FP8 config"
        if dtype and dtype.lower().startswith("fp8")
        else f"the --kv-cache-dtype {dtype} config"
        if dtype
        else "the candidate config"
    )
    if head.mode == PromotionMode.REPORT.value:
        return (
            f"{target} unchanged: report mode writes the verdict and the args; apply them yourself"
        )
    if head.mode == PromotionMode.GATE.value:
        return (
            f"{target} unchanged: gate mode writes the verdict (the rollout is Ready only on a "
            "pass); your GitOps change applies the args"
        )
    reverted = status.revert is not None or (
        status.promotion is not None and bool(status.promotion.patched)
    )
    if phase is Phase.PROMOTED:
        return f"{target} now runs {config}"
    if phase.value in view.BAD_PHASES or phase is Phase.NOT_NEEDED:
        return f"{target} back on its previous config (kvgate's change reverted)" if reverted else (
            f"{target} unchanged"
        )  # fmt: skip
    if phase is Phase.REVERTING:
        return f"{target}: kvgate's change is being reverted"
    if phase in (Phase.PROMOTING, Phase.VERIFYING):
        return f"{target} is being changed to {config} ({phase.value})"
    if phase is Phase.AWAITING_APPROVAL:
        return f"{target} unchanged until approved"
    if phase is Phase.PULL_REQUEST_OPEN:
        return f"{target} unchanged until the pull request is merged and applied by GitOps"
    if phase is Phase.PULL_REQUEST_MERGED:
        return f"{target} changes when the GitOps tool applies the merged pull request"
    return f"{target} unchanged so far (the canary pods run beside it)"


def _approval(head: Header, status: RolloutStatus) -> list[str]:
    """Waiting for a manual approval: the commands that give it, and when the chance expires."""
    if status.phase is not Phase.AWAITING_APPROVAL or status.reported or not status.config_hash:
        return []
    ns, name = head.namespace, head.name
    lines = [
        f"kvgate approve {name} -n {ns}",
        f"kubectl annotate kvr/{name} -n {ns} kvgate.io/approve={status.config_hash}",
    ]
    expires = parse_time(status.approval_expires_at)
    if expires is not None:
        lines.append(f"expires {expires.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC")
    return lines
