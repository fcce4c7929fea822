"""The operator's own Prometheus metrics (served on its /metrics)."""

from __future__ import annotations

import prometheus_client as prom

ROLLOUTS = prom.Counter("kvgate_rollouts_total", "Rollouts finished, by outcome.", ["outcome"])

ROLLBACKS = prom.Counter("kvgate_rollbacks_total", "Rollbacks, by reason.", ["reason"])

PHASE = prom.Gauge(
    "kvgate_rollout_phase", "1 for the rollout's current phase.", ["namespace", "name", "phase"]
)

ACCURACY_DELTA = prom.Gauge(
    "kvgate_accuracy_difference_pp",
    "Candidate minus control accuracy (percentage points).",
    ["namespace", "name"],
)

CAPACITY_RATIO = prom.Gauge(
    "kvgate_capacity_ratio", "Candidate over control KV tokens.", ["namespace", "name"]
)

EVENTS = prom.Counter(
    "kvgate_events_total", "Kubernetes Events posted.", ["namespace", "name", "type", "reason"]
)

API_REQUESTS = prom.Counter(
    "kvgate_api_requests_total", "Kubernetes API calls.", ["verb", "resource"]
)

RECONCILE_ERRORS = prom.Counter(
    "kvgate_reconcile_errors_total", "Reconciles that failed, by exception type.", ["type"]
)

REVERT_FAILURES = prom.Counter(
    "kvgate_revert_failures_total",
    "Revert patches refused or not confirmed.",
    ["namespace", "name"],
)

STALE = prom.Gauge(
    "kvgate_verdict_stale",
    "1 when the Deployment runs the tested config on another image than the verdict's.",
    ["namespace", "name"],
)

DRIFTED = prom.Gauge(
    "kvgate_promotion_drifted",
    "1 when a Promoted rollout's Deployment no longer carries the promoted config.",
    ["namespace", "name"],
)
