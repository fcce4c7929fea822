"""The chart's PrometheusRule, checked by Prometheus' own `promtool`.

The chart is rendered with the rule enabled, its `spec.groups` written out as a Prometheus rules
file, `promtool check rules` must accept it, and `promtool test rules` fires each alert on
synthetic series shaped like what the operator exports (controller/telemetry.py, record.py):
every alert has a case where it fires and one where it must not.

Needs helm (hack/build-binaries.sh) and promtool (Debian's `prometheus` package); skips
without them, except under CI=true where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/kvgate"
KUBE = ("--kube-version", "v1.37.2")


def _tool(name: str, found: str | None) -> str:
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing")
        pytest.skip(f"{name} is not installed")
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return _tool("promtool (apt-get install prometheus)", shutil.which("promtool"))


@pytest.fixture(scope="module")
def helm() -> str:
    cache = Path(
        os.environ.get("KVGATE_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvgate"
    )
    found = sorted(cache.glob("bin/*/helm"), reverse=True)
    return _tool("helm (hack/build-binaries.sh)", str(found[0]) if found else shutil.which("helm"))


def render_groups(helm: str, *sets: str) -> list[dict[str, Any]]:
    args = [helm, "template", "kvgate", str(CHART), "--namespace", "kvgate-system", *KUBE]
    for s in ("prometheusRule.enabled=true", *sets):
        args += ["--set", s]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/kvgate-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/kvgate-helm/config",
        "HELM_DATA_HOME": "/tmp/kvgate-helm/data",
    }
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    rules = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]
    assert len(rules) == 1
    groups: list[dict[str, Any]] = rules[0]["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"]}


def expanded(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations with `{{ $labels.x }}` filled in (what Prometheus must produce)."""
    out = {}
    for key, text in rule.get("annotations", {}).items():
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return out


def expect(rule: dict[str, Any], **labels: str) -> dict[str, Any]:
    """One expected alert: the series' labels kept by the expr, plus the rule's own labels."""
    full = {**labels, **rule.get("labels", {})}
    return {"exp_labels": full, "exp_annotations": expanded(rule, full)}


def run_promtool(
    promtool: str, tmp_path: Path, groups: list[dict[str, Any]], tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    spec = tmp_path / "test.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests})
    )
    return subprocess.run(
        [promtool, "test", "rules", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )


OP = {"job": "kvgate", "instance": "10.0.0.7:9090", "service": "kvgate-metrics"}


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    shown = ", ".join(f'{k}="{v}"' for k, v in {**OP, **labels}.items())
    return {"series": f"{metric}{{{shown}}}", "values": values}


def cases(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    a = alerts(groups)
    rb, failed, stuck, approval, down = (
        a["KVGateRolloutRolledBack"],
        a["KVGateRolloutFailed"],
        a["KVGateRolloutStuck"],
        a["KVGateApprovalPending"],
        a["KVGateOperatorDown"],
    )
    rollout = {"namespace": "team-a", "name": "llama"}
    stale = a["KVGateVerdictStale"]
    return [
        {
            # Stale for 5m fires; a verdict that is stale for 2m (a rollover in flight) does not.
            "interval": "1m",
            "input_series": [
                series("kvgate_verdict_stale", "0x3 1x20", **rollout),
                series("kvgate_verdict_stale", "0x5 1x2 0x15", namespace="team-b", name="qwen"),
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": stale["alert"], "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": stale["alert"],
                    "exp_alerts": [expect(stale, **rollout)],
                },
            ],
        },
        {
            # The operator creates a reason's counter at its first rollback (labels().inc()):
            # the series starts at 1. It must still alert, once per reason, and stop after
            # the window.
            "interval": "1m",
            "input_series": [
                series("kvgate_rollbacks_total", "_x20 1x60", reason="CanaryCrashed"),
                series("kvgate_rollbacks_total", "0x20 1x60", reason="AccuracyRegressed"),
                # a reason that rolled back long ago and not since: no alert once Prometheus
                # has seen it for the window (a brand-new Prometheus alerts on it once)
                series("kvgate_rollbacks_total", "3x80", reason="CapacityNotGained"),
            ],
            "alert_rule_test": [
                {"eval_time": "18m", "alertname": rb["alert"], "exp_alerts": []},
                {
                    "eval_time": "22m",
                    "alertname": rb["alert"],
                    "exp_alerts": [
                        expect(rb, reason="AccuracyRegressed"),
                        expect(rb, reason="CanaryCrashed"),
                    ],
                },
                {"eval_time": "50m", "alertname": rb["alert"], "exp_alerts": []},
            ],
        },
        {
            # A counter that goes on rising (a second rollback with a reason seen before).
            "interval": "1m",
            "input_series": [
                series("kvgate_rollbacks_total", "2x30 3x30", reason="CanaryCrashed"),
            ],
            "alert_rule_test": [
                {"eval_time": "25m", "alertname": rb["alert"], "exp_alerts": []},
                {
                    "eval_time": "35m",
                    "alertname": rb["alert"],
                    "exp_alerts": [expect(rb, reason="CanaryCrashed")],
                },
            ],
        },
        {
            # Failed for 5m fires; a rollout that passes through Failed for 2m does not.
            "interval": "1m",
            "input_series": [
                series("kvgate_rollout_phase", "1x20", phase="Failed", **rollout),
                series(
                    "kvgate_rollout_phase",
                    "0x5 1x2 0x13",
                    phase="Failed",
                    namespace="team-b",
                    name="qwen",
                ),
                series("kvgate_rollout_phase", "1x20", phase="Promoted", namespace="c", name="d"),
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": failed["alert"], "exp_alerts": []},
                {
                    "eval_time": "6m",
                    "alertname": failed["alert"],
                    "exp_alerts": [expect(failed, **rollout)],
                },
                {
                    "eval_time": "15m",
                    "alertname": failed["alert"],
                    "exp_alerts": [expect(failed, **rollout)],
                },
            ],
        },
        {
            # Stuck: a working phase held for the whole `for:` (1h by default); terminal
            # phases (Declined too), AwaitingApproval and PullRequestOpen (both wait for a
            # person) never count, and a phase that moves on resets it.
            "interval": "5m",
            "input_series": [
                series("kvgate_rollout_phase", "1x20", phase="Evaluating", **rollout),
                series("kvgate_rollout_phase", "1x20", phase="Promoted", namespace="c", name="d"),
                series(
                    "kvgate_rollout_phase",
                    "1x20",
                    phase="AwaitingApproval",
                    namespace="e",
                    name="f",
                ),
                series(
                    "kvgate_rollout_phase", "1x20", phase="PullRequestOpen", namespace="i", name="j"
                ),
                series("kvgate_rollout_phase", "1x20", phase="Declined", namespace="k", name="l"),
                series("kvgate_rollout_phase", "1x8 0x12", phase="Canary", namespace="g", name="h"),
                series(
                    "kvgate_rollout_phase", "0x8 1x12", phase="Evaluating", namespace="g", name="h"
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "55m", "alertname": stuck["alert"], "exp_alerts": []},
                {
                    "eval_time": "65m",
                    "alertname": stuck["alert"],
                    "exp_alerts": [expect(stuck, phase="Evaluating", **rollout)],
                },
            ],
        },
        {
            # AwaitingApproval alerts only after 24h (info); an approval that lands earlier
            # clears it.
            # (5m samples: a gauge sampled less often than the 5m lookback would go stale)
            "interval": "5m",
            "input_series": [
                series("kvgate_rollout_phase", "1x320", phase="AwaitingApproval", **rollout),
                series(
                    "kvgate_rollout_phase",
                    "1x200 0x120",
                    phase="AwaitingApproval",
                    namespace="team-b",
                    name="qwen",
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "23h", "alertname": approval["alert"], "exp_alerts": []},
                {
                    "eval_time": "25h",
                    "alertname": approval["alert"],
                    "exp_alerts": [expect(approval, **rollout)],
                },
            ],
        },
        {
            # The operator's scrape target down for 10m; a 3m blip does not alert.
            "interval": "1m",
            "input_series": [
                {
                    "series": 'up{job="kvgate", instance="10.0.0.7:9090", service="kvgate-metrics"}',
                    "values": "1x5 0x20",
                },
                {
                    "series": 'up{job="kvgate", instance="10.0.0.8:9090", service="kvgate-metrics"}',
                    "values": "1x5 0x3 1x20",
                },
                {
                    "series": 'up{job="other", instance="10.0.0.9:80", service="web"}',
                    "values": "0x30",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": down["alert"], "exp_alerts": []},
                {
                    "eval_time": "16m",
                    "alertname": down["alert"],
                    "exp_alerts": [
                        expect(
                            down,
                            job="kvgate",
                            instance="10.0.0.7:9090",
                            service="kvgate-metrics",
                        )
                    ],
                },
            ],
        },
    ]


def test_every_alert_fires_on_its_series_and_only_then(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    groups = render_groups(helm)
    tests = cases(groups)
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"]}
    assert tested == set(alerts(groups)), "every alert in the chart needs a promtool case"
    proc = run_promtool(promtool, tmp_path, groups, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = alerts(groups)["KVGateRolloutRolledBack"]["annotations"]["summary"]
    assert summary == "A KVCacheRollout was rolled back: {{ $labels.reason }}"


def test_values_change_the_windows(helm: str, promtool: str, tmp_path: Path) -> None:
    """stuckAfter=10m: the same series alert after 10 minutes instead of an hour."""
    groups = render_groups(helm, "prometheusRule.stuckAfter=10m")
    stuck = alerts(groups)["KVGateRolloutStuck"]
    rollout = {"namespace": "team-a", "name": "llama"}
    tests = [
        {
            "interval": "1m",
            "input_series": [series("kvgate_rollout_phase", "1x30", phase="Canary", **rollout)],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": stuck["alert"], "exp_alerts": []},
                {
                    "eval_time": "11m",
                    "alertname": stuck["alert"],
                    "exp_alerts": [expect(stuck, phase="Canary", **rollout)],
                },
            ],
        }
    ]
    proc = run_promtool(promtool, tmp_path, groups, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_wrong_expectation_fails(helm: str, promtool: str, tmp_path: Path) -> None:
    """The harness can fail: an alert expected where the rule must stay quiet is reported."""
    groups = render_groups(helm)
    failed = alerts(groups)["KVGateRolloutFailed"]
    rollout = {"namespace": "team-a", "name": "llama"}
    tests = [
        {
            "interval": "1m",
            "input_series": [series("kvgate_rollout_phase", "1x3 0x10", phase="Failed", **rollout)],
            "alert_rule_test": [
                {
                    "eval_time": "8m",
                    "alertname": failed["alert"],
                    "exp_alerts": [expect(failed, **rollout)],
                }
            ],
        }
    ]
    proc = run_promtool(promtool, tmp_path, groups, tests)
    assert proc.returncode != 0
    assert "KVGateRolloutFailed" in proc.stdout + proc.stderr
