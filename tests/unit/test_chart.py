"""charts/kvgate: lint, render and read back what the chart would install.

Uses the helm binary that hack/build-binaries.sh builds (~/.cache/kvgate/bin/<version>/helm),
or one on PATH. Without helm these tests skip, except under CI=true where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/kvgate"
CRD = "kvgate.io_kvcacherollouts.yaml"
# Without a cluster helm assumes Kubernetes 1.20, below the chart's kubeVersion.
KUBE = ("--kube-version", "v1.37.2")


def find_helm() -> str | None:
    cache = Path(
        os.environ.get("KVGATE_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvgate"
    )
    found = sorted(cache.glob("bin/*/helm"), reverse=True)
    if found:
        return str(found[0])
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    path = find_helm()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("helm is missing: run hack/build-binaries.sh")
        pytest.skip("helm is not built yet (hack/build-binaries.sh puts it in ~/.cache/kvgate/bin)")
    return path


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A private HOME so helm neither reads nor writes the user's helm config.
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/kvgate-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/kvgate-helm/config",
        "HELM_DATA_HOME": "/tmp/kvgate-helm/data",
    }
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def render(helm: str, *sets: str, namespace: str = "kvgate-system") -> list[dict[str, Any]]:
    args = ["template", "kvgate", str(CHART), "--namespace", namespace, *KUBE]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def grants(rules: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    for rule in rules:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    yield group, res, verb


# What the operator needs in every namespace it watches: exactly this, no wildcards
# (tests/unit/test_rbac.py derives the same set from the operator's source).
NAMESPACED = {
    *(("kvgate.io", "kvcacherollouts", v) for v in ("list", "watch", "patch")),
    ("kvgate.io", "kvcacherollouts/status", "patch"),
    ("kvgate.io", "kvcacherollouts/finalizers", "update"),
    *(("apps", "deployments", v) for v in ("get", "patch")),
    *(("", "pods", v) for v in ("create", "get", "list", "delete")),
    ("", "pods/log", "get"),
    *(("batch", "jobs", v) for v in ("create", "get", "delete")),
    *(("networking.k8s.io", "networkpolicies", v) for v in ("create", "get", "delete")),
    *(("", "configmaps", v) for v in ("create", "get", "patch")),
    ("", "events", "create"),
}
CLUSTER = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "nodes", "get"),  # the verdict key's GPU product label, by node name
}


def test_chart_crd_is_the_operator_crd() -> None:
    # A symlink, so the two cannot drift; helm packages the file's content.
    assert (CHART / "crds" / CRD).read_bytes() == (ROOT / "crds" / CRD).read_bytes(), (
        f"ln -sf ../../../crds/{CRD} charts/kvgate/crds/{CRD}"
    )


def test_kubectl_get_shows_the_reason_and_the_eval_progress() -> None:
    crd = yaml.safe_load((ROOT / "crds" / CRD).read_text())
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    # Both in the default view (priority 0), beside the phase they explain
    assert [c["name"] for c in version["additionalPrinterColumns"]][:6] == [
        "Phase", "Reason", "Target", "Dtype", "Progress", "Acc-Delta-pp"
    ]  # fmt: skip
    assert columns["Reason"]["jsonPath"] == ".status.reason"
    assert columns["Progress"]["jsonPath"] == ".status.progress"
    assert all(columns[n].get("priority", 0) == 0 for n in ("Reason", "Progress"))
    # Every status column reads a field the schema keeps (else the apiserver prunes it) and
    # the operator's typed status writes.
    from kvgate.records.status import RolloutStatus

    props = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    written = RolloutStatus.from_dict({"reason": "r", "progress": "p", "message": "m"}).to_dict()
    for name in ("Reason", "Progress", "Message"):
        key = columns[name]["jsonPath"].removeprefix(".status.")
        assert props[key]["type"] == "string" and key in written


def test_kubectl_get_shows_the_measured_throughput_gain() -> None:
    from kvgate.records.status import LoadStatus, RolloutStatus

    crd = yaml.safe_load((ROOT / "crds" / CRD).read_text())
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Gain"]["jsonPath"] == ".status.load.throughputGain"
    assert columns["Gain"]["type"] == "number" and columns["Gain"].get("priority", 0) == 0
    # the schema keeps status.load (else the apiserver prunes it) and the typed status writes it
    props = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert props["load"]["properties"]["throughputGain"]["type"] == "number"  # typed (statusschema)
    written = RolloutStatus(load=LoadStatus(throughput_gain=1.41)).to_dict()
    assert written["load"]["throughputGain"] == 1.41


def test_values_schema_is_json() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


def test_lint_passes(helm: str) -> None:
    for sets in (
        [],
        ["watch.allNamespaces=true"],
        ["watch.namespaces={a,b}", "hubTokenSecrets.enabled=true", "replicas=2"],
        ["metrics.serviceMonitor.enabled=true", "prometheusRule.enabled=true"],
    ):
        args = ["lint", "--strict", str(CHART), *KUBE]
        for s in sets:
            args += ["--set", s]
        proc = run_helm(helm, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 chart(s) failed" in proc.stdout


def test_default_render_runs_one_locked_down_operator(helm: str) -> None:
    docs = render(helm)
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    # the operator's own, and the eval Job's (no token, no RBAC) in the watched namespace
    assert accounts == {pod["serviceAccountName"], "kvgate-eval"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["command"] == ["kvgate"]
    assert c["args"][:2] == ["run", "--namespace=default"]  # namespaced by default
    assert "--liveness=http://$(POD_IP):8080/healthz" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KVGATE_METRICS_PORT"] == "9090"
    assert env["KVGATE_EVAL_IMAGE"] == "ghcr.io/kvgate/kvgate-eval:0.1.0"
    # the eval image's copy by default: the eval Job's policy then opens no HTTPS (security-2 C)
    assert env["KVGATE_GSM8K_DIR"] == "/data/gsm8k"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    svc = one(docs, "Service")
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert not [d for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert env["KVGATE_EVAL_SERVICE_ACCOUNT"] == "kvgate-eval"
    assert env["KVGATE_EVAL_WRITABLE_TMP"] == "1"
    assert env["KVGATE_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "KVGATE_EXTRA_ALLOWED_ENV" not in env
    # leader election by default, on a Lease in the release namespace
    assert "--lease-namespace=kvgate-system" in c["args"] and "--no-leader-elect" not in c["args"]
    role = one(docs, "Role", "kvgate")
    assert role["metadata"]["namespace"] == "default"
    assert set(grants(role["rules"])) == NAMESPACED  # no Secrets unless asked for
    assert not [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "kvgate"]


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(helm: str) -> None:
    docs = render(helm, "watch.allNamespaces=true")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    # the operator's two, and the approvers' (bound to nobody by the chart)
    assert set(roles) == {"kvgate", "kvgate-discovery", "kvgate-approver"}
    assert set(grants(roles["kvgate"]["rules"])) == NAMESPACED
    assert set(grants(roles["kvgate-discovery"]["rules"])) == CLUSTER
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kvgate", "namespace": "kvgate-system"}
        ]


def test_namespace_list_gets_roles_only_there(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a,team-b,team-a}")
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kvgate"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert set(grants(role["rules"])) == NAMESPACED
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "kvgate"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    # the only other Role is the Lease's, in the release namespace
    others = [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"])
              for d in docs if d["kind"] in ("Role", "RoleBinding") and d not in roles + bindings]  # fmt: skip
    assert sorted(others) == [
        ("Role", "kvgate-leader", "kvgate-system"), ("RoleBinding", "kvgate-leader", "kvgate-system")
    ]  # fmt: skip
    (cluster_role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] != "kvgate-approver"
    ]
    assert set(grants(cluster_role["rules"])) == CLUSTER
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["run", "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args


def test_secrets_grant_is_off_unless_enabled(helm: str) -> None:
    role = one(render(helm, "hubTokenSecrets.enabled=true"), "Role", "kvgate")
    assert set(grants(role["rules"])) == NAMESPACED | {("", "secrets", "get")}
    cluster = one(render(helm, "watch.allNamespaces=true"), "ClusterRole", "kvgate")
    assert ("", "secrets", "get") not in set(grants(cluster["rules"]))


def test_the_operator_honours_token_secrets_only_with_the_grant(helm: str) -> None:
    def env_of(*sets: str) -> dict[str, str | None]:
        c = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in c["env"]}

    # Off: the operator fails a rollout that names spec.model.tokenSecretRef (fail closed).
    assert env_of()["KVGATE_HUB_TOKEN_SECRETS"] == "0"
    assert env_of("hubTokenSecrets.enabled=true")["KVGATE_HUB_TOKEN_SECRETS"] == "1"


def test_empty_namespace_list_is_refused(helm: str) -> None:
    proc = run_helm(helm, "template", "kvgate", str(CHART), *KUBE, "--set", "watch.namespaces=null")
    assert proc.returncode != 0
    assert "namespaces" in proc.stderr


def test_schema_rejects_a_misspelt_value(helm: str) -> None:
    proc = run_helm(
        helm, "template", "kvgate", str(CHART), *KUBE, "--set", "watch.allNamespace=false"
    )
    assert proc.returncode != 0
    assert "allNamespace" in proc.stderr


def test_operator_config_becomes_env(helm: str) -> None:
    docs = render(
        helm,
        "config.gsm8kDir=/data/gsm8k",
        "config.hubOffline=true",
        "metrics.enabled=false",
        "image.digest=sha256:" + "a" * 64,
        "writableTmp=false",
    )
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KVGATE_GSM8K_DIR"] == "/data/gsm8k"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["KVGATE_METRICS_PORT"] == "0"
    assert c["image"] == "ghcr.io/kvgate/kvgate@sha256:" + "a" * 64
    assert [p["name"] for p in c["ports"]] == ["health"]
    assert "volumeMounts" not in c
    assert "volumes" not in one(docs, "Deployment")["spec"]["template"]["spec"]
    assert not [d for d in docs if d["kind"] == "Service"]


def test_monitoring_objects_and_alert_rules(helm: str) -> None:
    docs = render(helm, "metrics.serviceMonitor.enabled=true", "prometheusRule.enabled=true")
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    svc_labels = one(docs, "Service")["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    rules = {
        r["alert"]: r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]
    }
    assert set(rules) == {
        "KVGateRolloutRolledBack",
        "KVGateRolloutFailed",
        "KVGateRolloutStuck",
        "KVGateApprovalPending",
        "KVGateVerdictStale",
        "KVGateOperatorDown",
    }
    rollback = rules["KVGateRolloutRolledBack"]
    assert rollback["expr"] == (
        "sum by (reason) ((increase(kvgate_rollbacks_total[15m]) > 0) or "
        "(kvgate_rollbacks_total unless kvgate_rollbacks_total offset 15m)) > 0"
    )
    # Prometheus templates survive helm's own templating.
    assert "{{ $labels.reason }}" in rollback["annotations"]["summary"]
    stuck = rules["KVGateRolloutStuck"]
    assert stuck["expr"].startswith("max by (namespace, name, phase) (kvgate_rollout_phase{")
    assert stuck["for"] == "1h"
    assert rules["KVGateApprovalPending"]["for"] == "24h"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert rules["KVGateOperatorDown"]["expr"] == 'up{service="kvgate-metrics"} == 0'


def test_alert_rules_read_metrics_the_operator_exports(helm: str) -> None:
    """Every kvgate_* metric a rule reads is defined, with those labels, in controller/telemetry.py."""
    import re

    source = (ROOT / "operator/kvgate/controller/telemetry.py").read_text()
    defined = {
        name: set(re.findall(r'"(\w+)"', labels))
        for name, labels in re.findall(
            r'prom\.(?:Counter|Gauge)\(\s*"(kvgate_\w+)",\s*"[^"]*",\s*\[([^\]]*)\]', source
        )
    }
    docs = render(helm, "prometheusRule.enabled=true")
    exprs = [r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    used = 0
    for expr in exprs:
        for metric, selector in re.findall(r"(kvgate_\w+)(\{[^}]*\})?", expr):
            assert metric in defined, f"{metric} is not exported by controller/telemetry.py"
            labels = set(re.findall(r"(\w+)\s*[=!]~?", selector or ""))
            for by in re.findall(r"by \(([^)]*)\)", expr):
                labels |= {x.strip() for x in by.split(",")}
            assert labels <= defined[metric], (metric, labels - defined[metric])
            used += 1
    assert used >= 4


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("watch.namespaces={a,b}", "verbose=true"),
        ("watch.allNamespaces=true", "extraArgs={--poll-interval=2}"),
        ("leaderElection.enabled=false",),
        ("watch.allNamespaces=true", "replicas=2"),
    ],
)
def test_container_args_are_a_valid_kvgate_command_line(helm: str, sets: tuple[str, ...]) -> None:
    from kvgate.cli import build_parser

    c = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["kvgate"]
    argv = [a.replace("$(POD_IP)", "127.0.0.1") for a in c["args"]]
    args = build_parser(argv).parse_args(argv)  # exits 2 on an unknown flag
    assert args.command == "run"
    assert args.liveness == "http://127.0.0.1:8080/healthz"
    assert args.all_namespaces == ("watch.allNamespaces=true" in sets)
    leader = "leaderElection.enabled=false" not in sets
    assert args.leader_elect is leader
    assert args.lease_namespace == ("kvgate-system" if leader else None)


def test_load_image_is_the_load_target_unless_emptied(helm: str) -> None:
    def env_of(*sets: str) -> dict[str, Any]:
        c = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in c["env"]}

    # by default the load image `make images` builds; an empty repository: the eval image
    assert env_of()["KVGATE_LOAD_IMAGE"] == "ghcr.io/kvgate/kvgate-load:0.1.0"
    assert "KVGATE_LOAD_IMAGE" not in env_of("loadImage.repository=")
    env = env_of("loadImage.repository=registry.example/kvgate-load", "loadImage.tag=v2")
    assert env["KVGATE_LOAD_IMAGE"] == "registry.example/kvgate-load:v2"
    digest = "sha256:" + "d" * 64
    env = env_of("loadImage.repository=ghcr.io/kvgate/kvgate-load", f"loadImage.digest={digest}")
    assert env["KVGATE_LOAD_IMAGE"] == f"ghcr.io/kvgate/kvgate-load@{digest}"


def test_eval_image_can_be_pinned_by_digest(helm: str) -> None:
    digest = "sha256:" + "c" * 64
    c = one(render(helm, f"evalImage.digest={digest}"), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KVGATE_EVAL_IMAGE"] == f"ghcr.io/kvgate/kvgate-eval@{digest}"
    proc = run_helm(
        helm, "template", "kvgate", str(CHART), *KUBE, "--set", "evalImage.digest=latest"
    )
    assert proc.returncode != 0 and "digest" in proc.stderr


def test_eval_service_account_in_each_watched_namespace(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a,team-b}")
    sas = [
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "kvgate-eval"
    ]
    assert sorted(sa["metadata"]["namespace"] for sa in sas) == ["team-a", "team-b"]
    assert all(sa["automountServiceAccountToken"] is False for sa in sas)
    # nothing grants the eval ServiceAccount anything
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert all(s["name"] != "kvgate-eval" for s in binding["subjects"])
    # cluster-wide the chart cannot create one everywhere: the Job uses the default SA
    docs = render(helm, "watch.allNamespaces=true")
    assert not [
        d for d in docs if d["kind"] == "ServiceAccount" and "eval" in d["metadata"]["name"]
    ]
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "KVGATE_EVAL_SERVICE_ACCOUNT" not in {e["name"] for e in c["env"]}


def test_prometheus_url_reaches_the_operator(helm: str) -> None:
    from kvgate.config import OperatorConfig

    def env_of(*sets: str) -> dict[str, str | None]:
        c = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in c["env"]}

    assert "KVGATE_PROMETHEUS_URL" not in env_of()  # unset: kvgate scrapes the pods itself
    env = env_of("config.prometheusURL=http://prometheus-operated.monitoring:9090")
    assert env["KVGATE_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring:9090"
    config = OperatorConfig.from_env({k: v for k, v in env.items() if v is not None})
    assert config.prometheus_url == "http://prometheus-operated.monitoring:9090"
    for bad in ("prometheus:9090", "http://u:p@prometheus:9090"):
        proc = run_helm(
            helm, "template", "kvgate", str(CHART), *KUBE, "--set", f"config.prometheusURL={bad}"
        )
        assert proc.returncode != 0 and "prometheusURL" in proc.stderr, bad


def test_extra_allowed_args_and_env_reach_the_operator(helm: str) -> None:
    docs = render(
        helm, "config.extraAllowedArgs={--enforce-eager}", "config.extraAllowedEnv={KVGATE_SIM_*,X}"
    )
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KVGATE_EXTRA_ALLOWED_ARGS"] == "--enforce-eager"
    assert env["KVGATE_EXTRA_ALLOWED_ENV"] == "KVGATE_SIM_*,X"
    from kvgate.config import OperatorConfig

    allow = OperatorConfig.from_env(env).allowlist  # the operator accepts what the chart writes
    assert allow.env_allowed("vllm", "KVGATE_SIM_FAULTS") and "--enforce-eager" in allow.extra_args


def test_replicas_need_leader_election(helm: str) -> None:
    from kvgate.adapters.leader import lease_name

    docs = render(helm, "replicas=2", "watch.namespaces={team-b,team-a}")
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lease-namespace=kvgate-system" in args and "--no-leader-elect" not in args
    # the Lease Role lives in the release namespace, not in the watched ones
    role = one(docs, "Role", "kvgate-leader")
    assert role["metadata"]["namespace"] == "kvgate-system"
    assert one(docs, "RoleBinding", "kvgate-leader")["metadata"]["namespace"] == "kvgate-system"
    pinned = [r for r in role["rules"] if "resourceNames" in r]
    assert pinned == [{
        "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
        "resourceNames": [lease_name(["team-a", "team-b"], False)],
    }]  # fmt: skip
    cluster = one(render(helm, "replicas=3", "watch.allNamespaces=true"), "Role", "kvgate-leader")
    assert [r.get("resourceNames") for r in cluster["rules"]] == [[lease_name([], True)], None]
    for sets in (("replicas=2", "leaderElection.enabled=false"),
                 ("replicas=2", "leaderElection.enabled=false", "watch.allNamespaces=true")):  # fmt: skip
        args = ["template", "kvgate", str(CHART), *KUBE]
        for s in sets:
            args += ["--set", s]
        proc = run_helm(helm, *args)
        assert proc.returncode != 0 and "replicas > 1 needs leaderElection.enabled" in proc.stderr


def test_leader_election_can_be_turned_off(helm: str) -> None:
    docs = render(helm, "leaderElection.enabled=false")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-elect" in args
    assert not [a for a in args if a.startswith("--lease-namespace")]
    assert not [d for d in docs if d["metadata"]["name"] == "kvgate-leader"]
    proc = run_helm(helm, "template", "kvgate", str(CHART), *KUBE,
                    "--set", "leaderElection.enabled=maybe")  # fmt: skip
    assert proc.returncode != 0 and "leaderElection" in proc.stderr


def test_lease_role_when_the_release_namespace_is_watched(helm: str) -> None:
    # The operator's Role and the Lease's share the namespace without clashing.
    docs = render(helm, "watch.namespaces={kvgate-system,team-a}")
    in_release = sorted(
        (d["kind"], d["metadata"]["name"])
        for d in docs
        if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["namespace"] == "kvgate-system"
    )
    assert in_release == [
        ("Role", "kvgate"), ("Role", "kvgate-leader"),
        ("RoleBinding", "kvgate"), ("RoleBinding", "kvgate-leader"),
    ]  # fmt: skip


def test_no_kopf_peering_is_left() -> None:
    # kopf peering freezes operators of equal priority; the Lease replaced it.
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [CRD]
    for path in CHART.rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".tpl", ".json", ".txt"):
            text = path.read_text().lower()
            assert "kopfpeering" not in text and "kopf.dev" not in text, path
            assert "peering" not in text or path.name == "README.md", path


def test_only_the_operator_writes_rollout_status(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a,team-b}")
    policy = one(docs, "ValidatingAdmissionPolicy", "kvgate-status-writer")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["kvcacherollouts/status"] and rule["apiGroups"] == ["kvgate.io"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}  # a PATCH is an UPDATE
    (check,) = policy["spec"]["validations"]
    assert check["expression"] == (
        "request.userInfo.username in ['system:serviceaccount:kvgate-system:kvgate']"
    )
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "kvgate-status-writer")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr == {
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]
    }  # fmt: skip
    extra = one(
        render(helm, "statusAdmissionPolicy.extraUsers={admin}"),
        "ValidatingAdmissionPolicy",
        "kvgate-status-writer",
    )
    assert extra["spec"]["validations"][0]["expression"].endswith(":kvgate', 'admin']")
    off = render(helm, "statusAdmissionPolicy.enabled=false")
    assert not [d for d in off if d["metadata"]["name"] == "kvgate-status-writer"]


def test_approval_policies_and_the_approver_role(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a,team-b}")
    mutating = one(docs, "MutatingAdmissionPolicy", "kvgate-approval-identity")
    validating = one(docs, "ValidatingAdmissionPolicy", "kvgate-approval")
    for policy in (mutating, validating):
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert (rule["apiGroups"], rule["resources"]) == (["kvgate.io"], ["kvcacherollouts"])
        assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    # the recorded identities come from the request, never from the client
    mutations = " ".join(
        m["applyConfiguration"]["expression"] for m in mutating["spec"]["mutations"]
    )
    for key in ("created-by", "approved-by", "approved-generation", "aborted-by"):
        assert f"'kvgate.io/{key}'" in mutations
    variables = {x["name"]: x["expression"] for x in mutating["spec"]["variables"]}
    assert variables["user"] == "request.userInfo.username"
    checks = " ".join(c["expression"] for c in validating["spec"]["validations"])
    assert ".check('approve').allowed()" in checks and ".check('abort').allowed()" in checks
    assert "variables.author != variables.user" in checks  # no self-approval
    assert "group('apps').resource('deployments')" in checks and ".check('patch')" in checks
    for kind, name in (("MutatingAdmissionPolicyBinding", "kvgate-approval-identity"),
                       ("ValidatingAdmissionPolicyBinding", "kvgate-approval")):  # fmt: skip
        binding = one(docs, kind, name)
        assert binding["spec"]["policyName"] == name
        (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert expr["values"] == ["team-a", "team-b"]
    assert one(docs, "ValidatingAdmissionPolicyBinding", "kvgate-approval")["spec"][
        "validationActions"
    ] == ["Deny"]
    # the approver role holds the verbs; the operator's roles never do
    approver = one(docs, "ClusterRole", "kvgate-approver")
    assert set(grants(approver["rules"])) == {
        ("kvgate.io", "kvcacherollouts", v)
        for v in ("get", "list", "watch", "patch", "approve", "abort")
    }
    assert not [
        d
        for d in docs
        if d["kind"].endswith("Binding") and d.get("roleRef", {}).get("name") == "kvgate-approver"
    ]
    env = {
        e["name"]: e.get("value")
        for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (env["KVGATE_APPROVAL_IDENTITY"], env["KVGATE_APPROVAL_TTL"]) == ("1", "72h")
    # switches: self-approval allowed, no target check, no policy at all
    loose = one(render(helm, "approvalPolicy.allowSelfApproval=true",
                       "approvalPolicy.requireTargetPatch=false"),
                "ValidatingAdmissionPolicy", "kvgate-approval")  # fmt: skip
    loose_checks = " ".join(c["expression"] for c in loose["spec"]["validations"])
    assert "variables.author != variables.user" not in loose_checks
    assert "deployments" not in loose_checks
    off = render(helm, "approvalPolicy.enabled=false", "approverRole.create=false")
    assert not [d for d in off if "approv" in d["metadata"]["name"]]
    env = {
        e["name"]: e.get("value")
        for e in one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["KVGATE_APPROVAL_IDENTITY"] == "0"


@pytest.mark.parametrize(
    "bad",
    ["approvalPolicy.expireAfter=soon", "approvalPolicy.selfApproval=true", "approverRole.bind=x"],
)
def test_schema_rejects_bad_approval_values(helm: str, bad: str) -> None:
    proc = run_helm(helm, "template", "kvgate", str(CHART), *KUBE, "--set", bad)
    assert proc.returncode != 0
    assert bad.split("=")[0].split(".")[-1] in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("version", "sets", "refused_by"),
    [
        ("v1.29.9", [], "kubeVersion: >=1.30.0-0"),
        ("v1.35.4", [], "approvalPolicy needs Kubernetes 1.36 or newer"),
        ("v1.35.4", ["approvalPolicy.enabled=false"], None),
        ("v1.30.0", ["approvalPolicy.enabled=false"], None),
        ("v1.36.0", [], None),
    ],
)
def test_the_chart_installs_from_1_30_and_says_what_1_30_to_1_35_need(
    helm: str, version: str, sets: list[str], refused_by: str | None
) -> None:
    """first-hour-2 N6: the floor was 1.36 although only the approval policy needs it. Now 1.30
    (the status policy's v1 ValidatingAdmissionPolicy); before 1.36 the approval policy's
    template stops the install in one line naming approvalPolicy.enabled=false."""
    args = [a for s in sets for a in ("--set", s)]
    result = run_helm(helm, "template", "kvgate", str(CHART), "--kube-version", version, *args)
    if refused_by is None:
        assert result.returncode == 0, result.stderr
        kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
        assert "ValidatingAdmissionPolicy" in kinds  # the status policy stays on
        assert ("MutatingAdmissionPolicy" in kinds) is (not sets)
    else:
        assert result.returncode != 0
        # helm's own lines (the CRD symlink note, "Use --debug") aside, one error says why.
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr
        assert refused_by in errors[0] and version in errors[0], errors
        if "approvalPolicy" in refused_by:
            assert "--set approvalPolicy.enabled=false" in errors[0]


@pytest.mark.parametrize(
    ("value", "field", "limit_cpu"),
    [("evalResources", "eval_resources", "2"), ("loadResources", "load_resources", "4")],
)
def test_the_jobs_are_bounded_by_the_chart_and_the_operator_reads_it(
    helm: str, value: str, field: str, limit_cpu: str
) -> None:
    from kvgate import config
    from kvgate.config import OperatorConfig

    def bounds_of(*sets: str) -> Any:
        c = one(render(helm, *sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        return getattr(OperatorConfig.from_env(env), field)

    # the chart's defaults are the operator's: a `kvgate run` outside the chart is bounded too
    assert bounds_of() == getattr(config, f"DEFAULT_{field.upper()}")
    assert bounds_of(f"{value}.limits.memory=8Gi")["limits"] == {"cpu": limit_cpu, "memory": "8Gi"}
    # null deletes the chart's default, as {} does: no bounds, said explicitly to the operator
    assert bounds_of(f"{value}=null") == {}
    proc = run_helm(helm, "template", "kvgate", str(CHART), *KUBE,
                    "--set", f"{value}.limits.cpu=2 cores")  # fmt: skip
    assert proc.returncode != 0 and value in proc.stderr


def test_the_operators_network_policy_is_optional_and_opens_two_ports(helm: str) -> None:
    assert not [d for d in render(helm) if d["kind"] == "NetworkPolicy"]  # off by default
    docs = render(
        helm, "networkPolicy.enabled=true", "networkPolicy.allowedNamespaces={monitoring}"
    )
    policy = one(docs, "NetworkPolicy", "kvgate")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: apiserver, pods, hub
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    (expr,) = peer["namespaceSelector"]["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("kubernetes.io/metadata.name", "In")
    assert expr["values"] == ["kvgate-system", "monitoring"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}, {"port": 9090, "protocol": "TCP"}]
    # no metrics: the health port only; extra peers are appended as given
    docs = render(helm, "networkPolicy.enabled=true", "metrics.enabled=false",
                  "networkPolicy.extraFrom[0].podSelector.matchLabels.app=prometheus")  # fmt: skip
    (rule,) = one(docs, "NetworkPolicy", "kvgate")["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert rule["from"][1] == {"podSelector": {"matchLabels": {"app": "prometheus"}}}
    proc = run_helm(helm, "template", "kvgate", str(CHART), *KUBE,
                    "--set", "networkPolicy.allowedNamespaces={Not_A_Name}")  # fmt: skip
    assert proc.returncode != 0 and "allowedNamespaces" in proc.stderr


def test_a_token_secret_is_refused_at_admission_unless_enabled(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a}")
    policy = one(docs, "ValidatingAdmissionPolicy", "kvgate-token-secret")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["kvcacherollouts"] and rule["operations"] == ["CREATE", "UPDATE"]
    (check,) = policy["spec"]["validations"]
    assert "!has(object.spec.model.tokenSecretRef)" in check["expression"]
    assert "oldObject.spec.model" in check["expression"]  # stored ones can still be finalized
    assert check["message"].startswith("spec.model.tokenSecretRef: ")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "kvgate-token-secret")
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["team-a"]
    for sets in (("hubTokenSecrets.enabled=true",), ("statusAdmissionPolicy.enabled=false",)):
        assert not [d for d in render(helm, *sets) if "token-secret" in d["metadata"]["name"]]


def test_a_pull_request_is_refused_at_admission_unless_forge_tokens_are_enabled(helm: str) -> None:
    docs = render(helm, "watch.namespaces={team-a,team-b}")
    policy = one(docs, "ValidatingAdmissionPolicy", "kvgate-forge-token")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["kvcacherollouts"] and rule["operations"] == ["CREATE", "UPDATE"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (check,) = policy["spec"]["validations"]
    assert "!has(object.spec.promotion.pullRequest)" in check["expression"]
    assert "oldObject.spec.promotion.pullRequest" in check["expression"]  # stored ones finalize
    assert check["message"].startswith("spec.promotion.pullRequest: ")
    assert "forgeTokenSecrets.enabled=false" in check["message"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "kvgate-forge-token")
    assert binding["spec"]["policyName"] == "kvgate-forge-token"
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["team-a", "team-b"]
    cluster_wide = one(render(helm, "watch.allNamespaces=true"), "ValidatingAdmissionPolicyBinding",
                       "kvgate-forge-token")  # fmt: skip
    assert "matchResources" not in cluster_wide["spec"]
    for sets in (("forgeTokenSecrets.enabled=true",), ("statusAdmissionPolicy.enabled=false",)):
        assert not [d for d in render(helm, *sets) if "forge-token" in d["metadata"]["name"]]
    # the other bindings, now rendered by one helper, still bind their own policy
    for name in ("kvgate-status-writer", "kvgate-token-secret"):
        assert one(docs, "ValidatingAdmissionPolicyBinding", name)["spec"]["policyName"] == name


def notes(helm: str, tmp_path: Path, *args: str) -> str:
    """NOTES.txt as helm renders it after an install (`helm template` leaves NOTES out: a copy
    of the chart renders it through `tpl` into a ConfigMap)."""
    chart = tmp_path / "kvgate"
    shutil.copytree(CHART, chart, symlinks=False)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-source.txt")
    (chart / "templates" / "notes-as-cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
        '{{ tpl (.Files.Get "notes-source.txt") . | indent 4 }}\n'
    )
    proc = run_helm(helm, "template", "kvgate", str(chart), "--show-only",
                    "templates/notes-as-cm.yaml", *args)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return str(yaml.safe_load(proc.stdout)["data"]["notes"])


def test_notes_point_at_kvgate_wait_and_warn_when_the_approval_policy_is_off(
    helm: str, tmp_path: Path
) -> None:
    """first-hour-2 N7 (NOTES advised `kubectl wait --for=condition=Ready`, which waits the
    full 90 minutes after a rollback) and N6 (the cost of approvalPolicy.enabled=false)."""
    default = notes(helm, tmp_path / "a", *KUBE)
    assert "kvgate wait <name> -n <namespace> --timeout 90m" in default
    assert "--for=condition=Ready" not in default and "approvalPolicy" not in default
    off = notes(helm, tmp_path / "b", "--kube-version", "v1.33.0",
                "--set", "approvalPolicy.enabled=false")  # fmt: skip
    assert "Warning: approvalPolicy.enabled=false: a manual approval is an annotation" in off
