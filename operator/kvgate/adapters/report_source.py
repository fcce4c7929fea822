"""Read one KVCacheRollout for `kvgate report`: from the cluster, or from a file.

The cluster read logs in the standard way (in-cluster service account, else the kubeconfig
named by KUBECONFIG or ~/.kube/config); API failures become `KubeError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kvgate.errors import InputError, KubeError, ParseError
from kvgate.inputs import load_file

GROUP = "kvgate.io"
VERSION = "v1alpha1"
PLURAL = "kvcacherollouts"


def _load_config() -> str | None:
    """Configure the client; return the kubeconfig's namespace when there is one."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    quiet_tls_warnings()
    try:
        config.load_incluster_config()
    except ConfigException:
        pass
    else:
        ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return ns_file.read_text().strip() if ns_file.exists() else None
    try:
        config.load_kube_config()
        _, active = config.list_kube_config_contexts()
    except (ConfigException, OSError) as exc:
        raise KubeError(f"no cluster credentials (in-cluster or kubeconfig): {exc}") from exc
    namespace: str | None = (active or {}).get("context", {}).get("namespace")
    return namespace


def quiet_tls_warnings() -> None:
    """A kubeconfig with `insecure-skip-tls-verify: true` is the user's choice: urllib3's
    two-line InsecureRequestWarning on every call would precede kvgate's one-line error
    (first-hour-2 N19)."""
    import warnings

    from urllib3.exceptions import InsecureRequestWarning

    warnings.filterwarnings("ignore", category=InsecureRequestWarning)


def _read_one(kind: str, short: str, ns: str, name: str, call: Callable[[], Any]) -> Any:
    """`call()`, its failure one KubeError naming `kind` ns/name (404: how to list them)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            raise _not_found(exc, kind, short, ns, name) from exc
        raise KubeError(
            f"reading {kind} {ns}/{name}: {exc.status} {exc.reason}", status=exc.status
        ) from exc
    except HTTPError as exc:
        raise KubeError(f"reading {kind} {ns}/{name}: {exc}") from exc


def read_rollout(name: str, namespace: str | None = None) -> dict[str, Any]:
    """GET one KVCacheRollout; `namespace` defaults to the kubeconfig's, then `default`."""
    from kubernetes import client

    ns = namespace or _load_config() or "default"
    if namespace:
        _load_config()
    obj = _read_one(
        "kvcacherollout", "kvr", ns, name,
        lambda: client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name
        ),
    )  # fmt: skip
    # The client gives the decoded JSON body, typed as object.
    return dict(cast("Mapping[str, Any]", obj))


def _metadata(item: dict[str, Any]) -> dict[str, Any]:
    meta = item.get("metadata")
    return meta if isinstance(meta, dict) else {}


def read_rollout_file(path: str, name: str | None = None) -> dict[str, Any]:
    """A rollout saved with `kubectl get kvr -o json` (or -o yaml); `-` is stdin.

    A list (`kubectl get kvr -o json` without a name) is accepted: `name` picks the item,
    and may be left out when the list holds one rollout.
    """
    obj = load_file(path)  # bounded: size, UTF-8, depth, no YAML aliases
    if isinstance(obj, dict) and isinstance(obj.get("items"), list):
        items = [i for i in obj["items"] if isinstance(i, dict)]
        names = [str(_metadata(i).get("name"))[:253] for i in items]
        if name is not None:
            if name not in names:
                raise ParseError(path, f"no rollout {name!r} in the list ({', '.join(names)})")
            obj = items[names.index(name)]
        elif len(items) == 1:
            obj = items[0]
        else:
            raise ParseError(
                path, f"{len(items)} rollouts in the list; name one of: {', '.join(names)}"
            )
    if not isinstance(obj, dict) or obj.get("kind") != "KVCacheRollout":
        raise ParseError(path, "expected one KVCacheRollout object")
    found = _metadata(obj).get("name")
    if name is not None and found != name:
        raise ParseError(path, f"holds rollout {str(found)[:253]!r}, not {name!r}")
    return obj


def annotate_rollout(name: str, namespace: str | None, annotations: Mapping[str, str]) -> str:
    """Merge-patch annotations onto one KVCacheRollout; returns the namespace it used.

    The chart's admission policies record who set `kvgate.io/approve` or `kvgate.io/abort`
    (from the request's identity), so the caller's own credentials are the approver's.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    ns = namespace or _load_config() or "default"
    if namespace:
        _load_config()
    body = {"metadata": {"annotations": dict(annotations)}}
    try:
        client.CustomObjectsApi().patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, body
        )
    except ApiException as exc:
        if exc.status == 404:
            raise _not_found(exc, "kvcacherollout", "kvr", ns, name) from exc
        raise KubeError(
            f"annotating kvcacherollout {ns}/{name}: {exc.status} {exc.reason}"
            + (f": {_api_message(exc)}" if _api_message(exc) else ""),
            status=exc.status,
        ) from exc
    except HTTPError as exc:
        raise KubeError(f"annotating kvcacherollout {ns}/{name}: {exc}") from exc
    return ns


@dataclass(frozen=True)
class LiveTarget:
    """A Deployment with the Services and PersistentVolumeClaims of its namespace, for
    `kvgate check` (None: that list could not be read)."""

    namespace: str
    deployment: dict[str, Any]
    services: list[dict[str, Any]] | None
    claims: dict[str, dict[str, Any]] | None


def read_target(name: str, namespace: str | None = None) -> LiveTarget:
    """GET one Deployment and LIST its namespace's Services and PVCs (each list that cannot be
    read, e.g. for RBAC, is None: the check then says what it could not see)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    ns = namespace or _load_config() or "default"
    if namespace:
        _load_config()
    api = client.ApiClient()
    dep = _read_one(
        "deployment", "deploy", ns, name,
        lambda: client.AppsV1Api().read_namespaced_deployment(name, ns),
    )  # fmt: skip
    core = client.CoreV1Api()
    services: list[dict[str, Any]] | None = None
    claims: dict[str, dict[str, Any]] | None = None
    with contextlib.suppress(ApiException, HTTPError):
        found = core.list_namespaced_service(ns).items or []
        services = [api.sanitize_for_serialization(s) for s in found]
    with contextlib.suppress(ApiException, HTTPError):
        pvcs = [
            api.sanitize_for_serialization(c)
            for c in core.list_namespaced_persistent_volume_claim(ns).items or []
        ]
        claims = {str((c.get("metadata") or {}).get("name")): c for c in pvcs}
    return LiveTarget(ns, api.sanitize_for_serialization(dep), services, claims)


def rollout_events(name: str, namespace: str) -> list[dict[str, Any]]:
    """The Events about one KVCacheRollout, oldest first (an empty list when none can be read)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    selector = f"involvedObject.kind=KVCacheRollout,involvedObject.name={name}"
    try:
        found = client.CoreV1Api().list_namespaced_event(namespace, field_selector=selector)
    except (ApiException, HTTPError):
        return []  # Events are context, never the answer: a reader without them still works
    out = [client.ApiClient().sanitize_for_serialization(e) for e in found.items or []]
    return sorted(
        (e for e in out if isinstance(e, dict)),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )


def _not_found(exc: Any, kind: str, short: str, ns: str, name: str) -> Exception:
    """A 404: the object is not there (bad input, exit 2: a typo is not an outage), or, for a
    rollout, the API itself is missing: the CRD is not installed (first-hour-2 N15)."""
    import json

    try:
        details = json.loads(exc.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        details = {}
    if kind == "kvcacherollout" and details.get("name") != name:
        return KubeError(
            f"the KVCacheRollout CRD is not installed in this cluster (no {PLURAL}.{GROUP}); "
            "install kvgate's chart (helm install kvgate charts/kvgate ...)",
            status=404,
        )
    return InputError(f"{kind} {ns}/{name} not found; list them with `kubectl get {short} -n {ns}`")


def _api_message(exc: Any) -> str:
    """The apiserver's own sentence (an admission policy's refusal says why), one line."""
    import json

    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message).split())[:500] if message else ""
