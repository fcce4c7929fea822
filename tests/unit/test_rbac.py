"""The chart grants exactly the API calls the operator makes, derived from its source.

The set is read from `operator/kvgate/adapters/kube.py` (every kubernetes client method it
calls, mapped to resource and verb) plus what kopf itself does (watching and patching the
custom resource, posting Events, adopting children), and, for leader election, from the
kubernetes client's resource lock that `operator/kvgate/adapters/leader.py` uses (every call
the lock class makes on its API object). The rendered Roles must grant exactly that: a new
client call without a grant fails here, and so does a grant nobody uses.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_chart import grants, helm, one, render  # noqa: F401  (helm is a fixture)

ROOT = Path(__file__).resolve().parents[2]
KUBE_PY = ROOT / "operator/kvgate/adapters/kube.py"
LEADER_PY = ROOT / "operator/kvgate/adapters/leader.py"
RELEASE_NS = "kvgate-system"  # test_chart.render's namespace

Grant = tuple[str, str, str]

# The API objects of kube.py's `Kube` and their API group.
API_GROUPS = {"core": "", "apps": "apps", "batch": "batch", "networking": "networking.k8s.io"}
# The kubernetes client's API classes a resource lock may hold, and their API group.
API_CLASSES = {"CoordinationV1Api": "coordination.k8s.io", "CoreV1Api": ""}
RESOURCELOCK = "kubernetes.leaderelection.resourcelock"
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
    "network_policy": "networkpolicies",
    "config_map": "configmaps",
    "secret": "secrets",
    "event": "events",
    "service": "services",
    "lease": "leases",
    "node": "nodes",
}
# Cluster-scoped resources kube.py reads: granted in the discovery ClusterRole in either watch
# mode (a Role cannot grant them), and only `get` (the candidate's node's GPU label).
CLUSTER_SCOPED = {"nodes"}
_METHOD = re.compile(
    r"(?P<verb>[a-z]+)_namespaced_(?P<what>[a-z_]+?)(?P<sub>_status|_scale)?$|"
    r"(?P<cverb>[a-z]+)_(?P<cwhat>[a-z_]+?)_for_all_namespaces$|"
    r"(?P<nverb>read)_(?P<nwhat>node)$"
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
# What kopf reads at cluster scope in either mode (CRD discovery, namespace patterns).
KOPF_CLUSTER = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}
SECRET_GET = ("", "secrets", "get")


def _constant(name: str) -> str | None:
    """A string constant of kvgate.vocabulary that kube.py passes (GROUP, PLURAL)."""
    from kvgate import vocabulary as model

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
        verb = VERBS[match["verb"] or match["cverb"] or match["nverb"]]
        what = match["what"] or match["cwhat"] or match["nwhat"]
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


def _grant(method: str, group: str, where: str) -> Grant:
    match = _METHOD.fullmatch(method)
    assert match, f"{where} calls {method}: add it to test_rbac.py's mapping"
    verb = VERBS[match["verb"] or match["cverb"] or match["nverb"]]
    what = match["what"] or match["cwhat"] or match["nwhat"]
    sub = (match["sub"] or "").lstrip("_")
    assert what in RESOURCES, f"{where} calls {method}: add {what!r} to RESOURCES"
    return group, f"{RESOURCES[what]}/{sub}" if sub else RESOURCES[what], verb


def lock_classes(source: str) -> set[tuple[str, str]]:
    """(module, class) of each kubernetes resource lock that leader.py imports and builds."""
    tree = ast.parse(source)
    imported: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(RESOURCELOCK):
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module or "", alias.name)
    built = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    return {imported[name] for name in imported if name in built}


def lock_calls(module: str, cls: str) -> set[Grant]:
    """(apiGroup, resource, verb) for each call the lock class makes on its API objects."""
    tree = ast.parse(
        textwrap.dedent(inspect.getsource(getattr(importlib.import_module(module), cls)))
    )
    apis: dict[str, str] = {}  # self.<attr> = client.<ApiClass>()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr.endswith("Api")
        ):
            api = node.value.func.attr
            assert api in API_CLASSES, f"{cls} builds {api}: add it to API_CLASSES"
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    apis[target.attr] = API_CLASSES[api]
    assert apis, f"{cls}: no kubernetes API object found"
    found: set[Grant] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Attribute) and owner.attr in apis:
            found.add(_grant(node.func.attr, apis[owner.attr], cls))
    return found


def leader_calls() -> set[Grant]:
    """What leader election calls: the lock's API calls (the election loop makes none itself)."""
    locks = lock_classes(LEADER_PY.read_text())
    assert locks, "leader.py builds no kubernetes resource lock"
    for module in (
        "kubernetes.leaderelection.leaderelection",
        "kubernetes.leaderelection.electionconfig",
    ):
        assert "client" not in vars(importlib.import_module(module)), f"{module} calls the API"
    return set().union(*(lock_calls(m, c) for m, c in locks))


def operator_needs(*, secrets: bool, leader: bool) -> tuple[set[Grant], set[Grant], set[Grant]]:
    """(rules per watched namespace, cluster-scoped rules, rules in the release namespace).

    The first set is the same in either watch mode: a Role per namespace or one ClusterRole.
    """
    calls = client_calls(KUBE_PY.read_text())
    cluster = {g for g in calls if g[1] in CLUSTER_SCOPED}
    namespaced = (calls - cluster) | KOPF
    if not secrets:
        namespaced.discard(SECRET_GET)
    return namespaced, KOPF_CLUSTER | cluster, leader_calls() if leader else set()


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
        ("kvgate.io", "kvcacherollouts", "list"),
        ("", "nodes", "get"),
    ]:
        assert grant in calls, grant
    assert ("apps", "deployments", "delete") not in calls
    # nodes: get only (the GPU product label), never list or watch every node
    assert {verb for _, resource, verb in calls if resource == "nodes"} == {"get"}
    assert not any(verb in ("update", "watch") for _, _, verb in calls)
    # rollouts are listed (the reuse lookup), never read one by one: the role has no get
    assert ("kvgate.io", "kvcacherollouts", "get") not in calls


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


def test_the_lease_scan_finds_what_leaselock_calls() -> None:
    # read_namespaced_lease, create_namespaced_lease, replace_namespaced_lease: no list, no
    # watch, no patch, no delete (the Lease outlives the operator).
    assert leader_calls() == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    assert lock_classes(
        "from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock\nLeaseLock(1, 2, 3)"
    ) == {("kubernetes.leaderelection.resourcelock.leaselock", "LeaseLock")}
    assert lock_calls("kubernetes.leaderelection.resourcelock.configmaplock", "ConfigMapLock") == {
        ("", "configmaps", "get"),
        ("", "configmaps", "create"),
        ("", "configmaps", "update"),
    }


CASES = [
    ((), dict(secrets=False, cluster=False, leader=True)),
    (("hubTokenSecrets.enabled=true",), dict(secrets=True, cluster=False, leader=True)),
    (("replicas=2",), dict(secrets=False, cluster=False, leader=True)),
    (("leaderElection.enabled=false",), dict(secrets=False, cluster=False, leader=False)),
    (("leaderElection.enabled=false", "hubTokenSecrets.enabled=true"), dict(secrets=True, cluster=False, leader=False)),
    (("watch.allNamespaces=true",), dict(secrets=False, cluster=True, leader=True)),
    (("watch.allNamespaces=true", "replicas=3", "hubTokenSecrets.enabled=true"),
     dict(secrets=True, cluster=True, leader=True)),
    (("watch.allNamespaces=true", "leaderElection.enabled=false"), dict(secrets=False, cluster=True, leader=False)),
]  # fmt: skip


def _lease_the_operator_takes(docs: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(namespace, name) of the Lease `kvgate run` takes with the Deployment's command line."""
    from kvgate.adapters.leader import lease_name
    from kvgate.cli import build_parser

    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["KVGATE_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    argv = [a.replace("$(POD_IP)", "127.0.0.1") for a in c["args"]]
    args = build_parser(argv).parse_args(argv)
    if not args.leader_elect:
        return None
    # as run.py resolves it: --lease-namespace, else $KVGATE_NAMESPACE (the pod's namespace)
    namespace = args.lease_namespace or one(docs, "Deployment")["metadata"]["namespace"]
    return namespace, lease_name(args.namespace, bool(args.all_namespaces))


@pytest.mark.parametrize(("sets", "mode"), CASES)
def test_rendered_rbac_grants_exactly_what_the_operator_uses(
    helm: str,  # noqa: F811
    sets: tuple[str, ...],
    mode: dict[str, bool],
) -> None:
    docs = render(helm, *sets, "watch.namespaces={team-b,team-a}")
    namespaced, cluster, lease = operator_needs(secrets=mode["secrets"], leader=mode["leader"])
    if mode["cluster"]:
        main = one(docs, "ClusterRole", "kvgate")
        assert set(grants(main["rules"])) == namespaced
        assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kvgate"]
    else:
        roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kvgate"]
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
        for role in roles:
            assert set(grants(role["rules"])) == namespaced
    discovery = one(docs, "ClusterRole", "kvgate-discovery")
    assert set(grants(discovery["rules"])) == cluster
    # Leader election: a Role in the release namespace, on the Lease the operator takes there.
    taken = _lease_the_operator_takes(docs)
    leader_roles = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kvgate-leader"
    ]
    leader_bindings = [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "kvgate-leader"
    ]
    if not mode["leader"]:
        assert taken is None and not leader_roles and not leader_bindings
    else:
        assert taken is not None and taken[0] == RELEASE_NS
        (role,) = leader_roles
        assert role["metadata"]["namespace"] == RELEASE_NS
        assert set(grants(role["rules"])) == lease
        # every verb but create is pinned to the one Lease (RBAC cannot pin create by name)
        for rule in role["rules"]:
            if rule["verbs"] == ["create"]:
                assert "resourceNames" not in rule
            else:
                assert "create" not in rule["verbs"] and rule["resourceNames"] == [taken[1]]
        (binding,) = leader_bindings
        assert binding["metadata"]["namespace"] == RELEASE_NS
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kvgate-leader"
        }  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kvgate", "namespace": RELEASE_NS}
        ]
    # every role bound to the operator is one of the above; the approvers' role (approve,
    # abort) is bound to nobody: those verbs are people's, never the operator's
    bound = {
        b["roleRef"]["name"] for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    assert bound == {"kvgate", "kvgate-discovery"} | (
        {"kvgate-leader"} if mode["leader"] else set()
    )
    approver = one(docs, "ClusterRole", "kvgate-approver")
    assert {verb for _, _, verb in grants(approver["rules"])} >= {"approve", "abort"}
    operator_verbs = {
        verb
        for d in docs
        if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] in bound
        for _, _, verb in grants(d["rules"])
    }
    assert not operator_verbs & {"approve", "abort"}
    # nothing else grants leases, and nothing uses a wildcard
    for role in (d for d in docs if d["kind"] in ("Role", "ClusterRole")):
        if role["metadata"]["name"] != "kvgate-leader":
            assert not [g for g in grants(role["rules"]) if g[1] == "leases"], role["metadata"]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]


def test_secrets_are_get_only_and_can_be_pinned_by_name(helm: str) -> None:  # noqa: F811
    docs = render(helm, "hubTokenSecrets.enabled=true", "hubTokenSecrets.names={hf-token}")
    role = one(docs, "Role", "kvgate")
    (rule,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get"],
        "resourceNames": ["hf-token"],
    }
