"""The eval and load Jobs are bounded by default (issue 25): requests and limits from the
operator's config (the chart's evalResources, KVGATE_EVAL_RESOURCES; loadResources,
KVGATE_LOAD_RESOURCES); a rollout may lower an eval value but not raise or drop one (security
finding A of security-2.md: it could zero them or ask for GPUs), and does not change the load
Job's."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from test_controller import World

from kvgate import config
from kvgate.change import manifests
from kvgate.config import OperatorConfig
from kvgate.errors import SpecError


def test_defaults_bound_cpu_and_memory() -> None:
    bounds = OperatorConfig().eval_resources
    assert bounds == config.DEFAULT_EVAL_RESOURCES
    for part in ("requests", "limits"):
        assert set(bounds[part]) == {"cpu", "memory"}, part


def test_a_rollout_lowers_a_value_but_cannot_drop_a_bound() -> None:
    merged = manifests.eval_resources(config.DEFAULT_EVAL_RESOURCES, {"limits": {"memory": "1Gi"}})
    assert merged == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }
    assert manifests.eval_resources({}, {}) == {}  # an operator configured with "{}": none
    assert manifests.eval_resources({}, {"limits": {"cpu": "1"}}) == {"limits": {"cpu": "1"}}


def test_the_operators_bounds_reach_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch, canary={"startupTimeout": "60s", "evalTimeout": "120s",
                                   "resources": {"limits": {"memory": "768Mi"}}})  # fmt: skip
    bounds = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    w.memo.config = dataclasses.replace(w.memo.config, eval_resources=bounds)
    for _ in range(100):
        w.reconcile()
        w.now += dt.timedelta(seconds=2)
        if w.kube.of_kind("Job"):
            break
    (job,) = w.kube.of_kind("Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "768Mi"},  # the rollout's (lower) value for the key it names
    }


def test_resources_from_the_environment() -> None:
    raw = '{"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": 2147483648}}'
    config = OperatorConfig.from_env({"KVGATE_EVAL_RESOURCES": raw})
    assert config.eval_resources == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "2147483648"},
    }
    assert OperatorConfig.from_env({"KVGATE_EVAL_RESOURCES": "{}"}).eval_resources == {}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ("not json", "KVGATE_EVAL_RESOURCES: not JSON"),
        ('{"limit": {}}', "KVGATE_EVAL_RESOURCES: an object with only requests and limits"),
        ('{"limits": []}', "KVGATE_EVAL_RESOURCES.limits: "),
        ('{"limits": {"cpu": "2 cores"}}', "KVGATE_EVAL_RESOURCES.limits.cpu: '2 cores' is not"),
        ('{"limits": {"cpu": true}}', "KVGATE_EVAL_RESOURCES.limits.cpu: "),
        ('{"limits": {"cpu": "-1"}}', "KVGATE_EVAL_RESOURCES.limits.cpu: "),
    ],
)
def test_bad_resources_name_the_variable(raw: str, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        OperatorConfig.from_env({"KVGATE_EVAL_RESOURCES": raw})
    assert str(caught.value).startswith(field), caught.value


def test_the_load_jobs_bounds_come_from_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_controller import THROUGHPUT_GATES, _run_until_load_job

    assert OperatorConfig().load_resources == config.DEFAULT_LOAD_RESOURCES
    assert set(config.DEFAULT_LOAD_RESOURCES["limits"]) == {"cpu", "memory"}
    raw = '{"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "6Gi"}}'
    bounds = OperatorConfig.from_env({"KVGATE_LOAD_RESOURCES": raw}).load_resources
    assert bounds == {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "6Gi"}}
    assert OperatorConfig.from_env({"KVGATE_LOAD_RESOURCES": "{}"}).load_resources == {}
    with pytest.raises(SpecError, match=r"^KVGATE_LOAD_RESOURCES\.limits\.cpu: "):
        OperatorConfig.from_env({"KVGATE_LOAD_RESOURCES": '{"limits": {"cpu": "2 cores"}}'})

    # a rollout's canary.resources bound the eval container, not the load Job's
    w = World(monkeypatch, gates=THROUGHPUT_GATES, canary={
        "startupTimeout": "60s", "evalTimeout": "120s",
        "resources": {"limits": {"memory": "1Gi"}}})  # fmt: skip
    w.memo.config = dataclasses.replace(w.memo.config, load_resources=bounds)
    _run_until_load_job(w)
    job = w.kube.get("Job", "r-load-1")
    assert job is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == bounds
