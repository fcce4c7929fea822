"""The CLI's Kubernetes client (`kvgate get`, `wait`, `report`, `approve`, `abort`, `check`):
the operator's `Kube` on the user's own credentials, with the reads and the one write the
commands make. The object the user named must be there, and a failure is one line that says
what and why: a 404 is bad input naming how to list them (or, for a rollout, a missing CRD),
any other refusal carries the apiserver's own sentence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kvgate.adapters.kube import Kube, _json, _raw, configure
from kvgate.errors import InputError, KubeError
from kvgate.vocabulary import GROUP, PLURAL, VERSION

_T = TypeVar("_T")
# `kubectl get` short names, for the hint of a "not found"
_SHORT_NAMES = {"kvcacherollout": "kvr", "deployment": "deploy"}


def for_cli(namespace: str | None) -> tuple[CliKube, str]:
    """A Kube on the user's own credentials, and `namespace`, else the credentials', else
    `default`.

    A kubeconfig with `insecure-skip-tls-verify: true` is the user's choice: urllib3's two-line
    InsecureRequestWarning on every call would precede kvgate's one-line error (first-hour-2 N19).
    """
    import warnings

    warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    found = configure()
    return CliKube(k8s.ApiClient()), namespace or found or "default"


class CliKube(Kube):
    def get_rollout(self, namespace: str, name: str) -> dict[str, Any]:
        return self._named(
            "reading", "kvcacherollout", namespace, name,
            lambda: _json(
                self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            ),
        )  # fmt: skip

    def annotate_rollout(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto one KVCacheRollout. The chart's admission policies
        record who set `kvgate.io/approve` or `kvgate.io/abort` (from the request's identity),
        so the caller's own credentials are the approver's."""
        body = {"metadata": {"annotations": dict(annotations)}}
        self._named(
            "annotating", "kvcacherollout", namespace, name,
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body
            ),
        )  # fmt: skip

    def read_target(self, namespace: str, name: str) -> LiveTarget:
        """GET one Deployment and LIST its namespace's Services and PVCs (each list that cannot
        be read, e.g. for RBAC, is None: `kvgate check` then says what it could not see)."""
        deployment = self._named(
            "reading", "deployment", namespace, name,
            lambda: _raw(
                self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
            ),
        )  # fmt: skip
        services = self._items_or_none(
            f"services {namespace}",
            lambda: self.core.list_namespaced_service(namespace, _preload_content=False),
        )
        pvcs = self._items_or_none(
            f"persistentvolumeclaims {namespace}",
            lambda: self.core.list_namespaced_persistent_volume_claim(
                namespace, _preload_content=False
            ),
        )
        claims = None
        if pvcs is not None:
            claims = {str((c.get("metadata") or {}).get("name")): c for c in pvcs}
        return LiveTarget(namespace, deployment, services, claims)

    def rollout_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Events about one KVCacheRollout, oldest first; none when they cannot be read
        (Events are context, never the answer: a reader without them still works)."""
        selector = f"involvedObject.kind=KVCacheRollout,involvedObject.name={name}"
        found = self._items_or_none(
            f"events {namespace}",
            lambda: self.core.list_namespaced_event(
                namespace, field_selector=selector, _preload_content=False
            ),
        )
        return sorted(
            found or [], key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")
        )

    def _items_or_none(self, what: str, fn: Callable[[], Any]) -> list[dict[str, Any]] | None:
        try:
            obj = self._call("list", what, lambda: _raw(fn()))
        except KubeError:
            return None
        return [i for i in (obj or {}).get("items") or [] if isinstance(i, dict)]

    def _named(self, doing: str, kind: str, namespace: str, name: str, fn: Callable[[], _T]) -> _T:
        """`fn()`, its failure one line for the user. A 404 is the object not there (bad input,
        exit 2: a typo is not an outage) or, for a rollout, the API itself missing: the CRD is
        not installed (first-hour-2 N15). Any other refusal carries the apiserver's own
        sentence (an admission policy's says why)."""
        try:
            return cast("_T", self._call(doing, f"{kind} {namespace}/{name}", fn))
        except KubeError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ApiException):
                raise
            try:
                said = json.loads(cause.body or "{}")
            except (TypeError, ValueError):
                said = None
            said = said if isinstance(said, dict) else {}
            details = said.get("details")
            if (
                exc.status == 404
                and kind == "kvcacherollout"
                and not (isinstance(details, dict) and details.get("name") == name)
            ):
                raise KubeError(
                    f"the KVCacheRollout CRD is not installed in this cluster (no {PLURAL}.{GROUP}); "
                    "install kvgate's chart (helm install kvgate charts/kvgate ...)",
                    status=404,
                ) from cause
            if exc.status == 404:
                short = _SHORT_NAMES[kind]
                raise InputError(
                    f"{kind} {namespace}/{name} not found; "
                    f"list them with `kubectl get {short} -n {namespace}`"
                ) from cause
            message = " ".join(str(said.get("message") or "").split())[:500]
            raise KubeError(
                f"{exc}: {message}" if message else str(exc), status=exc.status
            ) from cause


@dataclass(frozen=True)
class LiveTarget:
    """A Deployment with the Services and PersistentVolumeClaims of its namespace, for
    `kvgate check` (None: that list could not be read)."""

    namespace: str
    deployment: dict[str, Any]
    services: list[dict[str, Any]] | None
    claims: dict[str, dict[str, Any]] | None
