"""A rollout author attacks the eval Job's bounds through spec.canary.resources (security-2.md,
finding A): zeros (BestEffort, unbounded), a huge limit, GPUs, other resources, junk. Each is
refused, naming the field, and a rollout carrying one ends Failed/InvalidSpec in Pending,
before any canary or Job exists."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from test_controller import TERMINAL, World

from kvgate import config
from kvgate.change import manifests
from kvgate.errors import InputError
from kvgate.spec import jobresources
from kvgate.vocabulary import LABEL_ROLLOUT

BOUNDS = config.DEFAULT_EVAL_RESOURCES  # requests 100m/256Mi, limits 2/2Gi

HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "0", "memory": "0"}},
     "spec.canary.resources.requests.cpu: '0' is not a positive quantity"),
    ({"limits": {"memory": "1000Ti"}},
     "spec.canary.resources.limits.memory: 1000Ti is above the operator's limit 2Gi"),
    ({"limits": {"cpu": "2001m"}}, "spec.canary.resources.limits.cpu: 2001m is above"),
    ({"requests": {"memory": "3Gi"}}, "spec.canary.resources.requests.memory: 3Gi is above"),
    ({"limits": {"nvidia.com/gpu": 8}},
     "spec.canary.resources.limits.nvidia.com/gpu: the eval Job takes only cpu and memory"),
    ({"requests": {"nvidia.com/gpu": "0"}}, "spec.canary.resources.requests.nvidia.com/gpu: "),
    ({"limits": {"ephemeral-storage": "1Gi"}}, "limits.ephemeral-storage: the eval Job takes"),
    ({"limits": {"memory": "-1Gi"}}, "limits.memory: '-1Gi' is not a positive quantity"),
    ({"limits": {"memory": "lots"}}, "limits.memory: 'lots' is not a positive quantity"),
    ({"limits": {"memory": True}}, "limits.memory: 'True' is not a positive quantity"),
    ({"limits": {"memory": None}}, "limits.memory: 'None' is not a positive quantity"),
    ({"limits": ["memory"]}, "spec.canary.resources.limits: an object"),
    ({"claims": [{"name": "gpu"}]}, "spec.canary.resources: only requests and limits, not claims"),
    ({"limits": {"memory": "128Mi"}}, "requests.memory 256Mi is above limits.memory 128Mi"),
]  # fmt: skip


@pytest.mark.parametrize(("rollout", "message"), HOSTILE, ids=[m[:40] for _, m in HOSTILE])
def test_a_hostile_value_is_refused_naming_the_field(rollout: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as caught:
        manifests.eval_resources(BOUNDS, rollout)
    assert message in str(caught.value)


def test_lowering_is_allowed_and_every_bound_stays() -> None:
    merged = manifests.eval_resources(
        BOUNDS, {"requests": {"cpu": "50m"}, "limits": {"cpu": "500m", "memory": 1073741824}}
    )
    assert merged == {
        "requests": {"cpu": "50m", "memory": "256Mi"},
        "limits": {"cpu": "500m", "memory": 1073741824},
    }
    equal = manifests.eval_resources(BOUNDS, {"limits": {"memory": "2048Mi", "cpu": 2}})
    assert equal["limits"] == {"cpu": 2, "memory": "2048Mi"}  # at the bound is not above it


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", Decimal("0.5")), ("2", Decimal(2)), ("2Gi", Decimal(2 * 2**30)),
     ("1.5G", Decimal("1.5e9")), (3, Decimal(3)), ("0", Decimal(0))],
)  # fmt: skip
def test_quantity(text: object, value: Decimal) -> None:
    assert jobresources.quantity(text) == value


@pytest.mark.parametrize("text", ["", "-1", "1e3", "2 Gi", "1gi", "Gi", True, None, [1]])
def test_not_a_quantity(text: object) -> None:
    assert jobresources.quantity(text) is None


@pytest.mark.parametrize(
    "resources",
    [
        {"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "0", "memory": "0"}},
        {"limits": {"memory": "1000Ti", "nvidia.com/gpu": 8}},
    ],
    ids=["zeros", "inflated-with-gpus"],
)
def test_the_rollout_fails_in_pending_and_no_job_or_pod_ever_exists(
    monkeypatch: pytest.MonkeyPatch, resources: dict[str, Any]
) -> None:
    w = World(monkeypatch, canary={"startupTimeout": "60s", "resources": resources})
    for _ in range(200):
        delay = w.reconcile()
        made = [
            o["metadata"]["name"]
            for kind in ("Pod", "Job")
            for o in w.kube.of_kind(kind)
            if LABEL_ROLLOUT in (o["metadata"].get("labels") or {})
        ]
        assert made == [], f"{w.phase}: {made}"
        if w.phase in TERMINAL:
            break
        w.now += dt.timedelta(seconds=min(delay, 30))
    status = w.obj["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith("spec.canary.resources.")
    w.assert_invariant()
