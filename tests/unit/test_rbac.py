"""The chart grants exactly the API calls the operator makes, derived from its source.

The set is read from `operator/kvgate/adapters/kube.py` (every kubernetes client method it
calls, mapped to resource and verb) plus what kopf itself does (watching and patching the
custom resource, posting Events, adopting children, peering). The rendered Roles must grant
exactly that: a new client call without a grant fails here, and so does a grant nobody uses.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from test_chart import grants, helm, one, render  # noqa: F401  (helm is a fixture)

ROOT = Path(__file__).resolve().parents[2]
KUBE_PY = ROOT / "operator/kvgate/adapters/kube.py"

Grant = tuple[str, str, str]

# The API objects of kube.py's `Kube` and their API group.
API_GROUPS = {"core": "", "apps": "apps", "batch": "batch"}
VERBS = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
    "watch": "watch",
}
RESOURCES = {
    "deployment": "deployments",
    "pod": "pods",
    "pod_log": "pods/log",
    "job": "jobs",
    "config_map": "configmaps",
    "secret": "secrets",
    "event": "events",
    "service": "services",
    "lease": "leases",
}
_METHOD = re.compile(
    r"(?P<verb>[a-z]+)_namespaced_(?P<what>[a-z_]+?)(?P<sub>_status|_scale)?$|"
    r"(?P<cverb>[a-z]+)_(?P<cwhat>[a-z_]+?)_for_all_namespaces$"
)

# kopf's own calls (kopf 1.4x): it lists and watches the resource it serves, patches it
# (finalizer, progress annotations) and its status subresource, and posts core/v1 Events.
# kopf.adopt() sets blockOwnerDeletion on children, which the OwnerReferencesPermission
# admission check allows only with update on the owner's finalizers.
KOPF: set[Grant] = {
    ("kvgate.io", "kvcacherollouts", "list"),
    ("kvgate.io", "kvcacherollouts", "watch"),
    ("kvgate.io", "kvcacherollouts", "patch"),
    ("kvgate.io", "kvcacherollouts/status", "patch"),
    ("kvgate.io", "kvcacherollouts/finalizers", "update"),
    ("", "events", "create"),
}
PEERING_NAMESPACED = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
PEERING_CLUSTER = {
    ("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")
}
# What kopf reads at cluster scope in either mode (CRD discovery, namespace patterns).
KOPF_CLUSTER = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}
SECRET_GET = ("", "secrets", "get")


def _constant(name: str) -> str | None:
    """A string constant of kvgate.model that kube.py passes (GROUP, PLURAL)."""
    from kvgate import model

    value = getattr(model, name, None)
    return value if isinstance(value, str) else None


def client_calls(source: str) -> set[Grant]:
    """(apiGroup, resource, verb) for each kubernetes client call in kube.py's source."""
    tree = ast.parse(source)
    found: set[Grant] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if not (
            isinstance(owner, ast.Attribute)
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
            and owner.attr in (*API_GROUPS, "custom")
        ):
            continue
        method = node.func.attr
        match = _METHOD.fullmatch(method)
        assert match, f"kube.py calls {owner.attr}.{method}: add it to test_rbac.py's mapping"
        verb = VERBS[match["verb"] or match["cverb"]]
        what = match["what"] or match["cwhat"]
        sub = (match["sub"] or "").lstrip("_")
        if owner.attr == "custom":
            assert what == "custom_object", method
            names = [a.id for a in node.args if isinstance(a, ast.Name)]
            group = _constant(names[0]) if names else None
            plural = _constant("PLURAL") if "PLURAL" in names else None
            assert group and plural, f"{method}: cannot tell the custom resource from {names}"
            resource = plural
        else:
            group = API_GROUPS[owner.attr]
            assert what in RESOURCES, f"kube.py calls {method}: add {what!r} to RESOURCES"
            resource = RESOURCES[what]
        found.add((group, f"{resource}/{sub}" if sub else resource, verb))
    return found


def operator_needs(*, secrets: bool, peering: bool, cluster: bool) -> tuple[set[Grant], set[Grant]]:
    """(namespaced rules, cluster-scoped rules) the operator needs in this configuration."""
    namespaced = client_calls(KUBE_PY.read_text()) | KOPF
    if not secrets:
        namespaced.discard(SECRET_GET)
    cluster_rules = set(KOPF_CLUSTER)
    if peering:
        if cluster:
            cluster_rules |= PEERING_CLUSTER
        else:
            namespaced |= PEERING_NAMESPACED
    return namespaced, cluster_rules


def test_the_source_scan_finds_the_calls_kube_py_makes() -> None:
    # The derivation must see what is plainly there, or every test below proves nothing.
    calls = client_calls(KUBE_PY.read_text())
    for grant in [
        ("apps", "deployments", "get"),
        ("apps", "deployments", "patch"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
        ("batch", "jobs", "create"),
        ("", "secrets", "get"),
        ("kvgate.io", "kvcacherollouts", "get"),
        ("kvgate.io", "kvcacherollouts", "list"),
    ]:
        assert grant in calls, grant
    assert ("apps", "deployments", "delete") not in calls
    assert not any(verb in ("update", "watch") for _, _, verb in calls)


def test_the_source_scan_maps_method_names() -> None:
    src = """
class Kube:
    def f(self):
        self.core.patch_namespaced_pod_status(1, 2, 3)
        self.batch.list_job_for_all_namespaces()
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, n, b)
        self.core.replace_namespaced_config_map(1, 2, 3)
"""
    assert client_calls(src) == {
        ("", "pods/status", "patch"),
        ("batch", "jobs", "list"),
        ("kvgate.io", "kvcacherollouts/status", "patch"),
        ("", "configmaps", "update"),
    }
    with pytest.raises(AssertionError, match=re.escape("add it to test_rbac.py's mapping")):
        client_calls(
            "class K:\n    def f(self):\n        self.core.connect_get_namespaced_pod_exec()"
        )


CASES = [
    ((), dict(secrets=False, peering=False, cluster=False)),
    (("hubTokenSecrets.enabled=true",), dict(secrets=True, peering=False, cluster=False)),
    (("replicas=2",), dict(secrets=False, peering=True, cluster=False)),
    (("peering.enabled=true", "hubTokenSecrets.enabled=true"), dict(secrets=True, peering=True, cluster=False)),
    (("watch.allNamespaces=true",), dict(secrets=False, peering=False, cluster=True)),
    (("watch.allNamespaces=true", "peering.enabled=true", "hubTokenSecrets.enabled=true"),
     dict(secrets=True, peering=True, cluster=True)),
]  # fmt: skip


@pytest.mark.parametrize(("sets", "mode"), CASES)
def test_rendered_rbac_grants_exactly_what_the_operator_uses(
    helm: str,  # noqa: F811
    sets: tuple[str, ...],
    mode: dict[str, bool],
) -> None:
    docs = render(helm, *sets, "watch.namespaces={team-a,team-b}")
    namespaced, cluster = operator_needs(**mode)
    if mode["cluster"]:
        roles = [d for d in docs if d["kind"] == "ClusterRole"]
        main = one(docs, "ClusterRole", "kvgate")
        assert set(grants(main["rules"])) == namespaced
        assert not [d for d in docs if d["kind"] == "Role"]
    else:
        roles = [d for d in docs if d["kind"] == "Role"]
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
        for role in roles:
            assert set(grants(role["rules"])) == namespaced
        roles = [d for d in docs if d["kind"] == "ClusterRole"]
    discovery = one(docs, "ClusterRole", "kvgate-discovery")
    assert set(grants(discovery["rules"])) == cluster
    for role in (d for d in docs if d["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    del roles


def test_secrets_are_get_only_and_can_be_pinned_by_name(helm: str) -> None:  # noqa: F811
    docs = render(helm, "hubTokenSecrets.enabled=true", "hubTokenSecrets.names={hf-token}")
    role = one(docs, "Role")
    (rule,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get"],
        "resourceNames": ["hf-token"],
    }
