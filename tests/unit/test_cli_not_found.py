"""A rollout that does not exist is bad input (exit 2), and a cluster without the CRD says so
(first-hour-2 N15: both were exit 4, "cluster unreachable", with the same text)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kvgate.adapters import kube_cli
from kvgate.cli import main

# What the apiserver answers (k8s.io/apimachinery StatusReasonNotFound): an object that is not
# there names it in details; a resource the server does not serve (no CRD) does not.
OBJECT_MISSING = {"kind": "Status", "reason": "NotFound", "code": 404,
                  "message": 'kvcacherollouts.kvgate.io "nosuch" not found',
                  "details": {"name": "nosuch", "group": "kvgate.io", "kind": "kvcacherollouts"}}  # fmt: skip
NO_CRD = {"kind": "Status", "reason": "NotFound", "code": 404,
          "message": "the server could not find the requested resource", "details": {}}  # fmt: skip


def api(monkeypatch: pytest.MonkeyPatch, body: dict[str, Any]) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        error = ApiException(status=404, reason="Not Found")
        error.body = json.dumps(body)
        raise error

    class Api:
        def __init__(self, *args: object) -> None:
            pass

        get_namespaced_custom_object = refuse
        patch_namespaced_custom_object = refuse

    monkeypatch.setattr("kubernetes.client.CustomObjectsApi", Api)
    monkeypatch.setattr(kube_cli, "configure", lambda: "llm")


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "nosuch", "-n", "llm", "--timeout", "1"],
        ["get", "nosuch", "-n", "llm"],
        ["report", "nosuch", "-n", "llm"],
        ["approve", "nosuch", "-n", "llm"],
        ["abort", "nosuch", "-n", "llm", "--reason", "x"],
    ],
)
def test_a_rollout_that_is_not_there_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    api(monkeypatch, OBJECT_MISSING)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "kvcacherollout llm/nosuch not found; list them with `kubectl get kvr -n llm`" in err


@pytest.mark.parametrize(
    "argv", [["wait", "nosuch", "-n", "llm", "--timeout", "1"], ["approve", "nosuch", "-n", "llm"]]
)
def test_a_cluster_without_the_crd_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    api(monkeypatch, NO_CRD)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 4, err
    assert "the KVCacheRollout CRD is not installed in this cluster" in err
    assert "helm install kvgate" in err


def test_a_tls_skipping_kubeconfig_adds_no_warning_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """first-hour-2 N19: two lines of urllib3's InsecureRequestWarning before the one-line error."""
    import warnings

    from kubernetes import config
    from urllib3.exceptions import InsecureRequestWarning

    monkeypatch.setattr(config, "load_incluster_config", lambda: (_ for _ in ()).throw(
        config.config_exception.ConfigException("not in a pod")))  # fmt: skip
    monkeypatch.setattr(config, "load_kube_config", lambda: None)
    monkeypatch.setattr(config, "list_kube_config_contexts", lambda: ([], {"context": {}}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn(InsecureRequestWarning("before"), stacklevel=1)  # the control
        kube_cli.for_cli(None)
        warnings.warn(InsecureRequestWarning("after"), stacklevel=1)
    assert [str(w.message) for w in seen] == ["before"]
