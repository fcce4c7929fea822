"""The suite's tiers, and the fixtures for tests against kvgate's local control plane.

Tiers
-----
Each test belongs to one tier, chosen by marker:

- fast (no marker of the three below): unit tests and the integration tests that start only
  the simulator or local HTTP servers. `pytest` with no flags runs exactly these.
- ``lmeval``: tests that start lm-eval itself (the `kvgate eval` runs, lm-eval's CLI).
- ``tools``: tests that run the other real tools on loopback: inference-perf (the load venv),
  a Gitea forge, checkov, a real Prometheus scraping simulators, and headless Chromium (the HTML
  reports at 1,280 px).
- ``e2e``: tests/e2e, against the local control plane (the ``cluster`` fixture).
- ``harness``: tests/harness, the control plane's and the real node's own tests.
- ``realengine``: tests/realengine, real vLLM (the CPU build in .venv-vllm, `make vllmenv`)
  serving tiny models built offline, under the operator and beside the simulator.

As kopf's tests/conftest.py does for e2e, the slow tiers are opt-in by flag: without
``--with-lmeval``, ``--with-tools``, ``--with-e2e``, ``--with-harness`` or ``--with-realengine``
(or ``--all-tiers``) their tests are
skipped with a message naming the flag, and ``pytest -m TIER --with-TIER`` runs one tier.
Tests under tests/e2e, tests/harness and tests/realengine get their tier's marker by directory; a test in either
that carries another tier's marker is a collection error, so a tier never loses a test.
Under pytest-xdist (`pytest` runs two workers, pyproject.toml) each worker runs whole files;
the e2e ones start a cluster each (``cluster`` below). Collected items run fast tier first, then
lmeval, tools, e2e and harness. `make test` (hack/test_tiers.py)
runs every tier and keeps a junit XML and the durations of each under .test-output/.

Control plane
-------------
The control plane is real: etcd, kube-apiserver (authorization Node,RBAC),
kube-controller-manager and kube-scheduler built from Go modules by
hack/build-binaries.sh, plus hack/kubelet.py, which runs each pod's container
`command` + `args` as a local process (the image is ignored). See hack/cluster.py.
tests/harness/test_real_node.py starts a cluster of its own with the real node instead (kubelet,
kube-proxy and containerd running the project's images; hack/containerd_node.py).

Fixtures
--------
``cluster`` (session): one cluster for the whole session (under pytest-xdist, one per worker,
each with its own slice of pod IPs: hack/cluster.py xdist_kubelet_args), started in a temporary
state dir and torn down at session end (every process it started is killed; the
components also die with the pytest process if it is killed). It also sets
``KUBECONFIG`` for the session, so code under test that calls
``kubernetes.config.load_kube_config()`` finds it. Attributes:

- ``cluster.kubeconfig``: str, path of the admin kubeconfig (system:masters).
- ``cluster.server``: str, e.g. ``https://127.0.0.1:41234``.
- ``cluster.bin_dir``: str, dir with kubectl, helm, etcd, kube-* binaries.
- ``cluster.state_dir``: Path, component logs in ``logs/``, pod logs and work dirs
  in ``kubelet/pods/<ns>_<pod>_<uid>/``.
- ``cluster.kubectl(*args, input=None, check=True, timeout=60.0)``:
  ``subprocess.CompletedProcess[str]`` (stdout/stderr as text); raises
  ``subprocess.CalledProcessError`` when check and kubectl fails.
- ``cluster.api_client()``: a new ``kubernetes.client.ApiClient`` for the cluster.
- ``cluster.delete_namespace(name, wait=60.0)``: bool; deletes and waits (bounded),
  force-deleting stuck pods; True once the namespace is gone.

If the binaries are missing the e2e tests are skipped with a message saying to run
``make binaries``; under ``CI=true`` that is an error instead.

``namespace`` (function): a fresh namespace ``kvgate-e2e-<hex>`` (str) whose
``default`` ServiceAccount exists, deleted after the test. Cleanup never hangs: it
waits at most ~60 s for the namespace to go, force-deletes pods that are left, and
then gives up with a warning.

What pods get (hack/kubelet.py): a unique loopback pod IP 127.x.y.z (in
``status.podIP`` and ``$POD_IP``) that clients reach directly; ``PATH`` starting
with this venv's bin dir (so ``python -m kvgate.sim ...`` and ``kvgate`` work);
``KVGATE_*``, ``HF_*``, ``TRANSFORMERS_*``, ``HOME``, ``LANG``, ``TMPDIR`` passed
through from the environment that started the cluster (nothing else is);
env from value/fieldRef/secretKeyRef/configMapKeyRef/envFrom; http/tcp/exec
probes; restart back-off 10 s doubling (first restart immediate); container logs
through the API (``read_namespaced_pod_log``, ``kubectl logs``, previous, follow).
The working dir is a per-pod dir unless ``workingDir`` is set. Volumes
(emptyDir, configMap, secret, downwardAPI, projected incl. the ServiceAccount
token, hostPath) are bind-mounted at their mountPath in a per-container mount
namespace, so in-cluster clients (``load_incluster_config()``) work as the pod's
ServiceAccount; the rest of the filesystem is the host's.

Limits to keep in mind: pods share the host's port space, so a server should bind
``$POD_IP`` (the kvgate simulator does by default), not 0.0.0.0, or two pods on
one port collide. Services get cluster IPs but no endpoints: the apiserver
accepts loopback pod IPs, but EndpointSlice validation rejects them ("may not be
in the loopback range"), so talk to pod IPs directly. No exec/attach/port-forward.

Example::

    @pytest.mark.e2e
    @pytest.mark.timeout(120)
    def test_something(cluster, namespace):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest_yaml)
        core = kubernetes.client.CoreV1Api(cluster.api_client())
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

# hypothesis' 200 ms per-example deadline is a timed assert: on a busy 2-core machine it fails
# correct examples. Off suite-wide; pytest-timeout still bounds every test, and the fuzz tests
# that guard against hangs keep their own 10 s deadline.
hypothesis_settings.register_profile("kvgate", deadline=None)
hypothesis_settings.load_profile("kvgate")

TESTS_DIR = Path(__file__).resolve().parent
HACK_DIR = TESTS_DIR.parent / "hack"
if str(HACK_DIR) not in sys.path:
    sys.path.insert(0, str(HACK_DIR))

if TYPE_CHECKING:  # the fixture imports hack/cluster.py: the fast tier needs none of it
    from cluster import Cluster

# pytester: tests/unit/test_tiers.py runs this file's tier hooks in a scratch project.
pytest_plugins = ["pytester"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The opt-in tiers in run order (the fast tier, unmarked, runs first); each has a --with-<tier>.
OPT_IN_TIERS = ("lmeval", "tools", "e2e", "harness", "realengine")
# Every test under these directories belongs to that tier.
TIER_DIRS = {
    TESTS_DIR / "e2e": "e2e",
    TESTS_DIR / "harness": "harness",
    TESTS_DIR / "realengine": "realengine",
}
# The longest e2e modules (~11 min each of the tier's ~44 serial on 2 cores), run first: on two
# pytest-xdist workers (hack/test_tiers.py --e2e-workers 2: --dist loadfile
# --no-loadscope-reorder) they start side by side instead of one of them ending the tier alone.
FIRST = ("test_chaos.py", "test_operator_rollouts.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvgate tiers")
    for tier in OPT_IN_TIERS:
        group.addoption(
            f"--with-{tier}", action="store_true", help=f"run the {tier} tier (skipped otherwise)"
        )
    group.addoption("--all-tiers", action="store_true", help="run every tier")


def tier_of(item: pytest.Item) -> str:
    """The item's tier: its directory's, else its one tier marker, else `fast`."""
    marked = {tier for tier in OPT_IN_TIERS if item.get_closest_marker(tier) is not None}
    by_dir = next((t for d, t in TIER_DIRS.items() if d in item.path.parents), None)
    if by_dir is not None and marked - {by_dir}:
        raise pytest.UsageError(
            f"{item.nodeid}: under tests/{by_dir}/ but marked {', '.join(sorted(marked))}"
        )
    if by_dir is None and len(marked) > 1:
        raise pytest.UsageError(
            f"{item.nodeid}: in more than one tier: {', '.join(sorted(marked))}"
        )
    return by_dir or next(iter(marked), "fast")


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so a directory's marker counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = ("fast", *OPT_IN_TIERS)
    tiers = {item.nodeid: tier_of(item) for item in items}
    everything = bool(config.getoption("--all-tiers"))
    for item in items:
        tier = tiers[item.nodeid]
        if tier == "fast":
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if not (everything or config.getoption(f"--with-{tier}")):
            reason = f"{tier} tier: opt in with --with-{tier} (`make test` runs every tier)"
            item.add_marker(pytest.mark.skip(reason=reason))
    # The slow tiers last, as kopf orders its e2e tests (a stable sort keeps file order), and
    # the longest e2e modules first in their tier.
    items.sort(key=lambda item: (order.index(tiers[item.nodeid]), first_rank(item)))


def first_rank(item: pytest.Item) -> int:
    """Where the item's file is in FIRST (len(FIRST) if not there)."""
    return FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Each test ends with os.environ as it found it. Code under test may set variables for its
    own process (NeedleRunner and EvalRunner set HF_HUB_OFFLINE=1, as a Job should): without
    this, a later test in the same process saw them, which only the file order hid; under
    pytest-xdist a worker runs another order (test_tokenizer_revision before
    test_cli_hub_hostile failed its four online preflights)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from cluster import (
        Cluster,
        ClusterError,
        default_bin_dir,
        missing_binaries,
        xdist_kubelet_args,
    )

    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        message = (
            f"control-plane binaries missing in {bin_dir}: {', '.join(missing)}; "
            "run `make binaries` (hack/build-binaries.sh, ~20 min cold)"
        )
        if IN_CI:
            pytest.fail(message + " (CI=true: not skipping)", pytrace=False)
        pytest.skip(message)
    # Under pytest-xdist each worker starts a cluster of its own (its own pod-IP slice). Its
    # ports come from free_port(), so two clusters starting at once can, rarely, pick one port:
    # the losing component exits and start() raises; a second try picks new ports.
    for attempt in (1, 2):
        state_dir = tmp_path_factory.mktemp("cluster")
        c = Cluster(state_dir, bin_dir=bin_dir, kubelet_args=xdist_kubelet_args(os.environ))
        try:
            c.start(timeout=300)
            break
        except ClusterError as exc:
            if attempt == 2:
                raise
            warnings.warn(f"cluster start failed, retrying on new ports: {exc}", stacklevel=1)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = c.kubeconfig
    try:
        yield c
    finally:
        c.stop()
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"kvgate-e2e-{secrets.token_hex(4)}"
    cluster.kubectl("create", "namespace", name)
    # Pods created before the ServiceAccount controller runs are refused.
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ServiceAccount default never appeared in {name}")
        time.sleep(0.2)
    try:
        yield name
    finally:
        if not cluster.delete_namespace(name, wait=60):
            warnings.warn(f"namespace {name} still terminating after cleanup", stacklevel=1)
