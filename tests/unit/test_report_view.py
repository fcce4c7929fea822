"""The report's one view (issue 38, item 5): built once from the typed spec and status; the text,
HTML and SVG renderers take it and read nothing else; any JSON still renders.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from test_controller import World
from test_fuzz_parsers import FUZZ, json_values
from test_report import PROMOTED

from kvgate import report
from kvgate.records.status import RolloutStatus
from kvgate.report import assemble
from kvgate.spec.rollout import RolloutSpec

REPORT = Path(__file__).resolve().parents[2] / "operator" / "kvgate" / "report"
RENDERERS = ("text.py", "page.py", "svg.py")


@pytest.mark.parametrize("module", RENDERERS)
def test_a_renderer_takes_the_view_and_reads_no_status(module: str) -> None:
    tree = ast.parse((REPORT / module).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # no status record, no status reader, no spec: the view is all a renderer sees
    assert not modules & {"kvgate.records.status", "kvgate.spec.rollout", "kvgate.report.fields"}, (
        modules
    )
    assert not {n for n in imported if n.startswith("read_") or n == "view"}, imported
    public = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    ]
    takes_view = [
        f.name
        for f in public
        if f.args.args
        and ast.unparse(f.args.args[0].annotation or ast.Constant("")) == "ReportView"
    ]
    assert takes_view and len(takes_view) >= len(public) - 1, [f.name for f in public]


def test_a_render_parses_the_status_and_the_spec_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    status_read, spec_read = RolloutStatus.from_dict.__func__, RolloutSpec.from_dict.__func__  # type: ignore[attr-defined]

    def counted_status(cls: type, raw: object) -> RolloutStatus:
        parsed.append("status")
        return status_read(cls, raw)  # type: ignore[no-any-return]

    def counted_spec(cls: type, raw: Any, **kw: Any) -> RolloutSpec:
        parsed.append("spec")
        return spec_read(cls, raw, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(RolloutStatus, "from_dict", classmethod(counted_status))
    monkeypatch.setattr(RolloutSpec, "from_dict", classmethod(counted_spec))
    for render in (report.render_text, report.render_html):
        parsed.clear()
        assert render(PROMOTED)
        assert sorted(parsed) == ["spec", "status"], render.__name__


def test_the_header_is_the_typed_spec_not_a_guessed_key() -> None:
    spec = {
        "targetRef": {"name": "llm"},
        "engine": "sglang",
        "kvCache": {"format": "fp8_e4m3"},  # no kvCacheDtype: the report used to miss it
        "promotion": {"mode": "manual"},
        "gates": {"accuracy": {"questions": 300}},
    }
    view = report.view_of({"metadata": {"name": "r", "namespace": "n"}, "spec": spec})
    head = view.header
    assert (head.target, head.mode, head.kv_cache_dtype) == ("Deployment/llm", "manual", "fp8_e4m3")
    assert head.questions_planned == 300  # spec.gates.accuracy.questions, not spec.accuracy
    # spellings the CRD does not have are not guessed: that spec is not one the operator reads
    guessed = report.view_of({"spec": {"target": "llm", "mode": "report"}})
    assert (guessed.header.target, guessed.header.mode, guessed.production) == ("-", None, None)


def test_the_view_is_what_every_renderer_shows() -> None:
    now = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
    view = report.view_of(PROMOTED, now)
    assert report.text.render(view) == report.render_text(PROMOTED, now)
    assert report.page.render(view) == report.render_html(PROMOTED, now)
    assert report.svg.render_svg(view) == report.svg.render_svg(
        report.view_of({"status": PROMOTED["status"]})
    )
    # a figure changed in the view is what the renderers show: they read nothing else
    changed = dataclasses.replace(view, args=["--kv-cache-dtype", "fp8_e5m2"])
    assert "fp8_e5m2" in report.text.render(changed) and "fp8_e5m2" in report.page.render(changed)


def test_the_controller_renders_its_report_from_the_typed_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[object, object]] = []
    build = assemble.build

    def recorded(spec: Any, status: Any, **kw: Any) -> report.ReportView:
        built.append((spec, status))
        return build(spec, status, **kw)

    monkeypatch.setattr(report, "build", recorded)
    world = World(monkeypatch)
    assert world.run() == "Promoted"
    assert len(built) == 1
    spec, status = built[0]
    assert isinstance(spec, RolloutSpec) and isinstance(status, RolloutStatus)
    # the status just written at the first finish (later reconciles only clear pendingActions)
    assert status.finished_at == world.obj["status"]["finishedAt"] and status.reported is False
    assert status.verdict == RolloutStatus.from_dict(world.obj["status"]).verdict
    cm = world.kube.get("ConfigMap", "r-report")
    assert cm is not None and "Promoted" in cm["data"]["report.txt"]


@FUZZ
@given(json_values, json_values)
def test_any_json_renders_spec_and_status_alike(spec: Any, status: Any) -> None:
    rollout = {"metadata": {"name": "r", "namespace": "n"}, "spec": spec, "status": status}
    text, page = report.render_text(rollout), report.render_html(rollout)
    assert text.startswith("KVCacheRollout n/r: ") and page.rstrip().endswith("</html>")
    assert report.render_text(spec).startswith("KVCacheRollout -/-: ")  # not even a rollout
