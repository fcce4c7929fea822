"""What does the `<rollout>-report` ConfigMap hold? The status just written (scrubbed JSON) and the
text and HTML reports rendered from one view of it; written on a rollout's first finish.
"""

from __future__ import annotations

from kvgate import redact
from kvgate.change import manifests
from kvgate.controller.context import Ctx
from kvgate.controller.ownership import adopt_child
from kvgate.errors import ExternalError, KvgateError
from kvgate.records.status import RolloutStatus


def write_report(ctx: Ctx, new: RolloutStatus) -> None:
    """The `<rollout>-report` ConfigMap: status.json, and the text and HTML reports, rendered
    from one view of the typed spec and the status just written."""
    from kvgate import report

    files = {"status.json": redact.scrub_text(manifests.status_json(new.to_dict()))}
    try:
        view = report.build(ctx.spec, new, namespace=ctx.namespace, name=ctx.name, now=ctx.now)
        files["report.txt"] = report.text.render(view)
        files["report.html"] = report.page.render(view)
    except (KvgateError, ValueError, KeyError, TypeError) as exc:  # status.json still goes
        ctx.logger.warning("report rendering failed: %s", exc)
    cm = manifests.build_report_configmap(rollout=ctx.name, namespace=ctx.namespace, files=files)
    adopt_child(ctx, cm, "report")
    try:
        ctx.kube.replace_configmap(cm)
    except ExternalError as exc:  # the verdict is in status already; the report is a copy
        ctx.logger.warning("could not write the report ConfigMap: %s", exc)
