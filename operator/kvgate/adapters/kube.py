"""Kubernetes I/O for the operator: Deployments, Pods, Jobs, logs, ConfigMaps, rollouts.

Objects come back as plain camelCase dicts (the API's JSON form), so the core never sees a
kubernetes model class. `ApiException` and transport errors become `KubeError` with the status.
Reads of absent objects return None; creates of existing objects return the existing one, so
every caller is idempotent. The chart's RBAC is derived from the client calls made here
(tests/unit/test_rbac.py): the CLI's own calls, on the user's credentials, are in `kube_cli`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from kvgate.errors import InputError, KubeError
from kvgate.vocabulary import GROUP, PLURAL, VERSION

_T = TypeVar("_T")
_LOG_LIMIT_BYTES = 4 * 1024 * 1024  # enough for a startup log; bounds memory per read
HUB_TOKEN_LABEL = "kvgate.io/hub-token"  # a Secret kvgate may read must carry it, = "true"
# The same opt-in for the Git forge token of a pullRequest promotion (another label, so a
# hub-token Secret is never sent to a forge, nor a forge token to the hub).
FORGE_TOKEN_LABEL = "kvgate.io/forge-token"
# Where a forge token may be sent: its Secret names the forge's API URL and the one repository,
# so a rollout author cannot point `apiUrl` at a server of theirs and receive the token.
FORGE_API_URL_ANNOTATION = "kvgate.io/forge-api-url"
FORGE_REPOSITORY_ANNOTATION = "kvgate.io/forge-repository"
MAX_TOKEN_LENGTH = 512
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# A Node's GPU labels change only when the node is replaced or relabelled: one read serves every
# rollout on it for this long (100 rollouts on one node read it once, not 100 times).
NODE_TTL_S = 60.0


def _decode_token(where: str, key: str, raw: Any, holds: str) -> str:
    """Base64 -> one printable line; errors say what is wrong (`holds`: what the key is for),
    never any of the value."""
    import base64
    import binascii

    try:
        decoded = base64.b64decode(str(raw), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{where} key {key!r} is not valid base64") from None
    try:
        text = decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{where} key {key!r} is not UTF-8 text") from None
    text = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")  # one line end
    if not text:
        raise InputError(f"{where} key {key!r} is empty")
    if len(text) > MAX_TOKEN_LENGTH:
        raise InputError(
            f"{where} key {key!r} holds {len(text)} characters; {holds} is one line of at most "
            f"{MAX_TOKEN_LENGTH}"
        )
    if any(c.isspace() or not c.isprintable() for c in text):
        raise InputError(
            f"{where} key {key!r} holds whitespace, a line break or a control character; "
            f"{holds} is one printable line"
        )
    return text


def configure() -> str | None:
    """Load in-cluster credentials, else the kubeconfig ($KUBECONFIG or ~/.kube/config), as the
    client's default; return the namespace they name (the service account's, the context's)."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        pass
    else:
        return _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else None
    try:
        k8s_config.load_kube_config()
        _, active = k8s_config.list_kube_config_contexts()
    except (k8s_config.ConfigException, OSError) as exc:
        raise KubeError(f"no cluster credentials (in-cluster or kubeconfig): {exc}") from exc
    namespace: str | None = (active or {}).get("context", {}).get("namespace")
    return namespace


def load_api_client() -> k8s.ApiClient:
    """In-cluster credentials, else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    configure()
    return k8s.ApiClient()


def _raw(response: Any) -> dict[str, Any]:
    """The JSON body of a `_preload_content=False` call (non-2xx already raised ApiException).

    Reads decode the raw body: the client's model classes cost CPU and memory per object, and
    the operator turned them straight back into dicts."""
    return cast("dict[str, Any]", json.loads(response.data))


def _json(body: object) -> dict[str, Any]:
    """A custom-object call's decoded JSON body, which the client types as object."""
    return cast("dict[str, Any]", body)


class Kube:
    """The operator's view of the API. Counts requests, for the benchmark and metrics."""

    def __init__(
        self, api_client: k8s.ApiClient, on_request: Callable[[str, str], None] | None = None
    ):
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.requests = 0
        self._on_request = on_request
        self._nodes: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._nodes_lock = threading.Lock()

    def _call(
        self, verb: str, what: str, fn: Callable[[], _T], *, missing_ok: bool = False
    ) -> _T | None:
        self.requests += 1
        if self._on_request is not None:  # `what` starts with the resource: "pods ns (sel)"
            self._on_request(verb, what.split(" ", 1)[0].lower().removesuffix("s"))
        try:
            return fn()
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            reason = exc.reason or ""
            raise KubeError(
                f"{verb} {what}: {exc.status} {reason}".strip(), status=exc.status
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(f"{verb} {what}: {exc}") from exc
        except ValueError as exc:  # a body that is not JSON
            raise KubeError(f"{verb} {what}: unreadable response: {exc}") from exc

    def _dict(self, obj: Any) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(obj))

    def _get(self, what: str, read: Callable[[], Any]) -> dict[str, Any] | None:
        """A raw read (`_preload_content=False`) of one object; None when it is not there."""
        return self._call("get", what, lambda: _raw(read()), missing_ok=True)

    # --- reads ---

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"deployment {namespace}/{name}",
            lambda: self.apps.read_namespaced_deployment(name, namespace, _preload_content=False),
        )

    def read_node(self, name: str) -> dict[str, Any] | None:
        """The Node (cluster-scoped; the chart grants `get` on nodes for its GPU label), read
        at most once per NODE_TTL_S and shared by every rollout: callers must not change it."""
        now = time.monotonic()
        with self._nodes_lock:
            kept = self._nodes.get(name)
        if kept is not None and now - kept[0] < NODE_TTL_S:
            return kept[1]
        node = self._get(f"node {name}", lambda: self.core.read_node(name, _preload_content=False))
        with self._nodes_lock:
            self._nodes = {n: v for n, v in self._nodes.items() if now - v[0] < NODE_TTL_S}
            self._nodes[name] = (now, node)
        return node

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        obj = self._call(
            "list",
            f"pods {namespace} ({selector})",
            lambda: _raw(
                self.core.list_namespaced_pod(
                    namespace, label_selector=selector, _preload_content=False
                )
            ),
        )
        return list((obj or {}).get("items") or [])

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"job {namespace}/{name}",
            lambda: self.batch.read_namespaced_job(name, namespace, _preload_content=False),
        )

    def read_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"networkpolicy {namespace}/{name}",
            lambda: self.networking.read_namespaced_network_policy(
                name, namespace, _preload_content=False
            ),
        )

    def read_log(
        self, namespace: str, pod: str, container: str | None = None, *, previous: bool = False
    ) -> str | None:
        """The container log, or None when there is none (pod gone, not started, no previous)."""

        def read() -> str:
            kwargs: dict[str, Any] = {"limit_bytes": _LOG_LIMIT_BYTES, "previous": previous}
            if container:
                kwargs["container"] = container
            text = self.core.read_namespaced_pod_log(pod, namespace, **kwargs)
            return "" if text is None else str(text)  # the client gives None for an empty log

        try:
            return self._call("log", f"pod {namespace}/{pod}", read, missing_ok=True)
        except KubeError as exc:
            if exc.status == 400:  # container not started yet, or no previous instance
                return None
            raise

    def list_rollouts(self, namespace: str) -> list[dict[str, Any]]:
        obj: dict[str, Any] | None = self._call(
            "list",
            f"{PLURAL} {namespace}",
            lambda: _json(
                self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
            ),
        )
        return list((obj or {}).get("items") or [])

    # --- writes ---

    def ensure(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create a Pod, Job, NetworkPolicy or ConfigMap (an existing one with that name is
        returned instead), and whether this call created it: one request when the name is free,
        so a caller need not read the name first (an existing object costs a second, its GET)."""
        wire: Any = body  # the client sends a dict body as it is; its types name model classes
        kind = body["kind"]
        ns = body["metadata"]["namespace"]
        name = body["metadata"]["name"]
        creators: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "Pod": (
                lambda: self.core.create_namespaced_pod(ns, wire, _preload_content=False),
                lambda: self.core.read_namespaced_pod(name, ns, _preload_content=False),
            ),
            "Job": (
                lambda: self.batch.create_namespaced_job(ns, wire, _preload_content=False),
                lambda: self.batch.read_namespaced_job(name, ns, _preload_content=False),
            ),
            "NetworkPolicy": (
                lambda: self.networking.create_namespaced_network_policy(
                    ns, wire, _preload_content=False
                ),
                lambda: self.networking.read_namespaced_network_policy(
                    name, ns, _preload_content=False
                ),
            ),
            "ConfigMap": (
                lambda: self.core.create_namespaced_config_map(ns, wire, _preload_content=False),
                lambda: self.core.read_namespaced_config_map(name, ns, _preload_content=False),
            ),
        }
        create, read = creators[kind]
        made = self._created(f"{kind} {ns}/{name}", create)
        if made is not None:
            return made, True
        found = self._call("get", f"{kind} {ns}/{name}", lambda: _raw(read()))
        return cast("dict[str, Any]", found), False

    def _created(self, what: str, create: Callable[[], Any]) -> dict[str, Any] | None:
        """The object a create made, or None when its name is taken (409)."""
        try:
            return cast("dict[str, Any]", self._call("create", what, lambda: _raw(create())))
        except KubeError as exc:
            if exc.status != 409:
                raise
        return None

    def replace_configmap(self, body: Mapping[str, Any]) -> dict[str, Any]:
        ns = body["metadata"]["namespace"]
        name = body["metadata"]["name"]
        wire: Any = body
        made = self._created(  # create first: the name is usually free (one request)
            f"configmap {ns}/{name}",
            lambda: self.core.create_namespaced_config_map(ns, wire, _preload_content=False),
        )
        if made is not None:
            return made
        return self._dict(
            self._call(
                "patch",
                f"configmap {ns}/{name}",
                lambda: self.core.patch_namespaced_config_map(name, ns, {"data": body["data"]}),
            )
        )

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete a Pod, Job (and the Job's pods) or NetworkPolicy; False when it was already gone.

        With `uid`, only that very object is deleted (a precondition): a newer object that took
        the name meanwhile is left alone (the apiserver answers 409, reported as False).
        """
        opts = k8s.V1DeleteOptions(
            propagation_policy="Background",
            grace_period_seconds=5,
            preconditions=k8s.V1Preconditions(uid=uid) if uid else None,
        )
        deleters: dict[str, Callable[[], Any]] = {
            "Pod": lambda: self.core.delete_namespaced_pod(name, namespace, body=opts),
            "Job": lambda: self.batch.delete_namespaced_job(name, namespace, body=opts),
            "NetworkPolicy": lambda: self.networking.delete_namespaced_network_policy(
                name, namespace, body=opts
            ),
        }
        try:
            done = self._call(
                "delete", f"{kind} {namespace}/{name}", deleters[kind], missing_ok=True
            )
        except KubeError as exc:
            if uid and exc.status == 409:
                return False
            raise
        return done is not None

    def patch_deployment(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch (RFC 6902) to a Deployment."""
        return self._dict(
            self._call(
                "patch",
                f"deployment {namespace}/{name}",
                lambda: self.apps.patch_namespaced_deployment(name, namespace, ops),
            )
        )

    def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        """The hub token in Secret `name`, key `key`, from a Secret labelled HUB_TOKEN_LABEL
        only (a rollout author cannot have any Secret of the namespace sent to a hub), one
        printable line (`_decode_token`). A refusal is an InputError naming the Secret, the key or
        the label, never the value."""
        return self._hub_token(namespace, name, key, forbidden_is_input=False)

    def check_hub_token_secret(self, namespace: str, name: str, key: str) -> None:
        """`read_secret_value`'s rule, before a Job may name the Secret in a `secretKeyRef` (the
        eval Job's HF_TOKEN, which the kubelet resolves without kvgate's RBAC); a Secret the
        operator may not get (403) is refused too: fail closed."""
        self._hub_token(namespace, name, key, forbidden_is_input=True)

    def read_forge_token(
        self, namespace: str, name: str, key: str, *, api_url: str, repository: str
    ) -> str:
        """The Git forge token of a pullRequest promotion: the rule of `read_secret_value`
        with the label `kvgate.io/forge-token: "true"`, and the Secret's annotations
        `kvgate.io/forge-api-url` and `kvgate.io/forge-repository` must name `api_url` and
        `repository` (the token goes only where its Secret says). A 403 is an InputError naming
        the field (the operator was not given `get` on Secrets)."""
        return self._hub_token(
            namespace,
            name,
            key,
            forbidden_is_input=True,
            label=FORGE_TOKEN_LABEL,
            field="spec.promotion.pullRequest.tokenSecretRef",
            holds="a Git forge token",
            enable="enable forgeTokenSecrets",
            pinned={
                FORGE_API_URL_ANNOTATION: (api_url, "spec.promotion.pullRequest.apiUrl"),
                FORGE_REPOSITORY_ANNOTATION: (repository, "spec.promotion.pullRequest.repository"),
            },
        )

    def _hub_token(
        self,
        namespace: str,
        name: str,
        key: str,
        *,
        forbidden_is_input: bool,
        label: str = HUB_TOKEN_LABEL,
        field: str = "spec.model.tokenSecretRef",
        holds: str = "a hub token",
        enable: str = "enable hubTokenSecrets (and list the name in hubTokenSecrets.names)",
        pinned: Mapping[str, tuple[str, str]] | None = None,
    ) -> str:
        where = f"Secret {namespace}/{name}"
        try:
            obj = self._call(
                "get",
                f"secret {namespace}/{name}",
                lambda: self.core.read_namespaced_secret(name, namespace),
                missing_ok=True,
            )
        except KubeError as exc:
            if exc.status == 403 and forbidden_is_input:
                raise InputError(
                    f"{field}: the operator may not read {where} (403); {enable}"
                ) from None
            if exc.status == 403:
                raise KubeError(
                    f"{exc}: the operator may not read Secrets here; enable the chart value "
                    "hubTokenSecrets.enabled (get on secrets, nothing else)",
                    status=403,
                ) from exc
            raise
        if obj is None:
            raise InputError(f"{where} ({field}) does not exist")
        meta = getattr(obj, "metadata", None)
        labels = (meta and meta.labels) or {}
        if labels.get(label) != "true":
            raise InputError(
                f"{where} does not opt in to being read by kvgate: label it "
                f'{label}="true" if it holds {holds}'
            )
        annotations = (meta and meta.annotations) or {}
        for annotation, (wanted, spec_field) in (pinned or {}).items():
            have = annotations.get(annotation)
            if not isinstance(have, str) or have.rstrip("/") != wanted.rstrip("/"):
                raise InputError(
                    f"{where} is not for {spec_field} {wanted!r}: its annotation {annotation} "
                    f"is {'absent' if have is None else repr(str(have)[:200])}; annotate the "
                    f"Secret with the forge it holds a token for (a token goes only there)"
                )
        data = getattr(obj, "data", None) or {}
        raw = data.get(key) if isinstance(data, Mapping) else None
        if not raw:
            keys = ", ".join(sorted(str(k) for k in data)) if isinstance(data, Mapping) else ""
            raise InputError(f"{where} has no key {key!r} (keys: {keys or 'none'})")
        return _decode_token(where, key, raw, holds)
