"""A real node for the local cluster: Kubernetes' own kubelet and kube-proxy on containerd + runc.

hack/cluster.py starts it with `--node=containerd` (or `Cluster(node="containerd")`); the
default node is still the process kubelet (hack/kubelet.py). The binaries come from
`hack/build-binaries.sh --node`; runc and the CNI plugins (bridge, host-local, loopback) from
Debian (`apt-get install runc containernetworking-plugins iptables`).

Everything the node makes is its own and is undone by `teardown()`, which works from the state
directory alone (a supervisor that was SIGKILLed leaves enough to clean up after it):
- the bridge `kvgate0` (10.244.0.1/24), which this module creates; pods get addresses on it
  from host-local, and the apiserver and kubelet listen on its gateway address, so pods reach
  the apiserver through the `kubernetes` Service (kube-proxy, iptables mode) and the apiserver
  reaches the kubelet for logs. No other address is used;
- network namespaces, kept under the state directory (`netns_mounts_under_state_dir`);
- shim sockets under /run/kvgate-<hash>/ and runc state under the state directory;
- mounts (overlay root file systems, /dev/shm, volumes) under the state directory;
- the `kubepods` cgroups, and the KUBE-* iptables chains of the kubelet and kube-proxy
  (`start` refuses to run beside a foreign set of them);
- the sysctls it turned on (ip_forward, bridge-nf-call-iptables), set back to what they were;
- with `network_policy` (`cluster.py up --network-policy`), the NetworkPolicy engine's
  iptables chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*: KUBE-* like the others) and
  its ipsets (KUBE-SRC-*, KUBE-DST-*, and its TMP-<16 base32> swap sets).

NetworkPolicy: kube-proxy and the CNI bridge enforce none. With `network_policy` the cluster
also runs kube-router's network policy controller (`--run-firewall` only: no routing, no
service proxy) as a host process with a ServiceAccount token of its own
(`POLICY_ENGINE_RBAC`). It enforces policies with iptables filter rules and ipsets, which
bridged pod-to-pod traffic on `kvgate0` passes (bridge-nf-call-iptables=1, `physdev`). The
SIG Network reference engine, kube-network-policies, cannot run on this kernel: its rules use
nftables' `queue` expression, and the kernel is built without CONFIG_NFT_QUEUE and without
module support (`nft add rule ... queue num 100` fails with "No such file or directory").

The pod sandbox image is `hack/go/pause` (a static program of our own), written here as an
OCI archive and imported, since public pause images cannot be pulled.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

BRIDGE = "kvgate0"
GATEWAY = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SANDBOX_IMAGE = "localhost/kvgate-pause:1"
NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "kvgate-pause",
    "kube-router",
)
# The NetworkPolicy engine: kube-router's network policy controller (hack/go/kube-router).
POLICY_ENGINE = "kube-router"
POLICY_ENGINE_SA = ("kube-system", "kvgate-netpol")
# What kube-router's firewall reads (its informers list and watch each of these); nothing else.
POLICY_ENGINE_RBAC: tuple[dict[str, object], ...] = (
    {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": POLICY_ENGINE_SA[1], "namespace": POLICY_ENGINE_SA[0]},
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kvgate:netpol"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kvgate:netpol"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "kvgate:netpol",
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": POLICY_ENGINE_SA[1],
                "namespace": POLICY_ENGINE_SA[0],
            }
        ],
    },
)
# The chain kube-router's firewall hooks into FORWARD once it has synced.
POLICY_ENGINE_FORWARD_CHAIN = "KUBE-ROUTER-FORWARD"
# Its ipsets: per policy and pod selector, and the swap sets it restores through.
_ENGINE_IPSET = re.compile(r"^(KUBE-SRC-|KUBE-DST-|TMP-[A-Z2-7]{16}$)")
CNI_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
# The cgroup v1 controllers kubelet makes `kubepods` under (cgroupfs driver).
CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    # Pod -> Service -> pod on the same bridge: replies must pass the host's conntrack.
    "net/bridge/bridge-nf-call-iptables": "1",
}


# A unix socket path holds at most 107 bytes (sun_path is 108 with its NUL). The kubelet binds
# sockets under its root dir, the longest `device-plugins/kubelet.sock` and `pod-resources/`
# plus a 10-digit temp name; past the limit it exits with `bind: invalid argument`.
SOCKET_PATH_MAX = 107
KUBELET_SOCKET_TAIL = "kubelet/device-plugins/kubelet.sock"


def check_socket_room(state: Path) -> None:
    """Refuse, in one line, a state dir too deep for the kubelet's sockets (before any change)."""
    longest = len(os.fsencode(state / KUBELET_SOCKET_TAIL))
    if longest > SOCKET_PATH_MAX:
        room = SOCKET_PATH_MAX - len(KUBELET_SOCKET_TAIL) - 1
        raise NodeError(
            f"the state directory {state} is {len(os.fsencode(state))} bytes long; the kubelet's "
            f"unix sockets under it need it to be at most {room} (use a shorter --state-dir)"
        )


class NodeError(RuntimeError):
    """The node cannot be started here; the message says what is missing."""


def missing(bin_dir: Path) -> list[str]:
    """What the node needs and this machine lacks, one entry per thing, each naming its fix."""
    out = [
        f"{b} (hack/build-binaries.sh --node)"
        for b in NODE_BINARIES
        if not os.access(bin_dir / b, os.X_OK)
    ]
    if not shutil.which("runc"):
        out.append("runc (apt-get install runc)")
    out += [
        f"{CNI_DIR / p} (apt-get install containernetworking-plugins)"
        for p in CNI_PLUGINS
        if not os.access(CNI_DIR / p, os.X_OK)
    ]
    for tool, pkg in (("iptables", "iptables"), ("ip", "iproute2"), ("ipset", "ipset")):
        if not shutil.which(tool):
            out.append(f"{tool} (apt-get install {pkg})")
    return out


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


class ContainerdNode:
    """Files, processes and network of one node; `state` is its own directory."""

    def __init__(self, state: Path, bin_dir: Path, node_name: str) -> None:
        self.state = state
        self.bin_dir = bin_dir
        self.node_name = node_name
        self.socket = state / "containerd.sock"
        # Unix socket paths are short: shim sockets go to /run/kvgate-<hash of the state dir>.
        digest = hashlib.sha256(str(state).encode()).hexdigest()[:10]
        self.run_dir = Path(f"/run/kvgate-{digest}")

    # -- before the control plane --

    def prepare(self) -> None:
        """Check the machine, then make the bridge: the apiserver listens on its gateway."""
        lacking = missing(self.bin_dir)
        if lacking:
            raise NodeError("the containerd node needs: " + "; ".join(lacking))
        if (self.state / "bridge").exists() or _link_exists(BRIDGE):
            # A previous run of ours died: clean it up; a foreign bridge stays and we stop.
            teardown(self.state, log=lambda _m: None)
            if _link_exists(BRIDGE):
                raise NodeError(
                    f"a network interface {BRIDGE} exists and is not this cluster's "
                    "(another local cluster is up? run `hack/cluster.py down` for it)"
                )
        foreign = _kube_chains()
        if foreign:
            raise NodeError(
                "iptables already has chains "
                + ", ".join(sorted(foreign)[:4])
                + " from another kubelet or kube-proxy on this host; refusing to share them"
            )
        foreign_sets = _engine_ipsets()
        if foreign_sets:
            raise NodeError(
                "ipset already has sets "
                + ", ".join(foreign_sets[:4])
                + " from another NetworkPolicy engine on this host; refusing to share them"
            )
        check_socket_room(self.state)
        for sub in ("cni-conf", "cni-ipam", "kubelet", "runc", "netns", "opt"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        _write_json(self.state / "sysctls.json", {k: _sysctl(k) for k in SYSCTLS})
        for key, value in SYSCTLS.items():
            _set_sysctl(key, value)
        (self.state / "bridge").write_text(BRIDGE + "\n")  # before creating: teardown finds it
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        self._write_configs()

    def _write_configs(self) -> None:
        s = self.state
        runc = shutil.which("runc") or "runc"
        (s / "containerd.toml").write_text(
            f"""version = 3
root = "{s / "root"}"
state = "{s / "cstate"}"

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{s / "opt"}"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{self.run_dir / "s"}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # This host's root has no CAP_SYS_RESOURCE: a negative oom_score_adj cannot be set.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # Our shim, not the first on PATH: a host with Debian's containerd or docker.io has a
      # 1.x containerd-shim-runc-v2 in /usr/bin, which this containerd cannot start
      # ("io.containerd.runc.v2: type with url ...: not found").
      runtime_path = "{self.bin_dir / "containerd-shim-runc-v2"}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
        Root = "{s / "runc"}"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_DIR}"]
    conf_dir = "{s / "cni-conf"}"

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"
"""
        )
        _write_json(
            s / "cni-conf" / "10-kvgate.conflist",
            {
                "cniVersion": "1.0.0",
                "name": "kvgate",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "isDefaultGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                            "dataDir": str(s / "cni-ipam"),
                        },
                    },
                    {"type": "loopback"},
                ],
            },
        )

    # -- processes (the cluster spawns them; these give the command lines) --

    def containerd_argv(self) -> list[str]:
        return [str(self.bin_dir / "containerd"), f"--config={self.state / 'containerd.toml'}"]

    def containerd_ready(self) -> bool:
        return (
            self.socket.exists()
            and _run(*self._ctr(), "version", check=False, timeout=10).returncode == 0
        )

    def kubelet_argv(self, kubeconfig: str, pki: Path, port: int, healthz_port: int) -> list[str]:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host is cgroup v1 (hybrid); kubelet 1.35+ refuses it unless told.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "failSwapOn": False,
            "address": GATEWAY,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "tlsCertFile": str(pki / "kubelet.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "serializeImagePulls": False,
            # Images are imported, never pulled: garbage collection must not delete them.
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {},
            "enforceNodeAllocatable": [],
            "localStorageCapacityIsolation": False,
            "resolvConf": "",
            "podCIDR": POD_CIDR,
            "maxPods": 60,
            "nodeStatusUpdateFrequency": "4s",
        }
        _write_json(self.state / "kubelet.yaml", config)
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={self.state / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.state / 'kubelet'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={GATEWAY}",
            "--v=1",
        ]

    def kube_proxy_argv(self, kubeconfig: str, metrics_port: int, healthz_port: int) -> list[str]:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": kubeconfig},
            "hostnameOverride": self.node_name,
            "clusterCIDR": POD_CIDR,
            "bindAddress": GATEWAY,
            "healthzBindAddress": f"127.0.0.1:{healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{metrics_port}",
            # Pod -> Service -> pod on one bridge: masquerade so replies come back through us.
            "iptables": {"masqueradeAll": True},
            # No conntrack table resizing: that sysctl belongs to the host, not to this node.
            "conntrack": {"maxPerCore": 0},
            "nodePortAddresses": [f"{GATEWAY}/32"],
        }
        _write_json(self.state / "kube-proxy.yaml", config)
        return [
            str(self.bin_dir / "kube-proxy"),
            f"--config={self.state / 'kube-proxy.yaml'}",
            "--v=1",
        ]

    def policy_engine_kubeconfig(self, server: str, ca: Path, token: str) -> Path:
        """A kubeconfig for the engine, as its own ServiceAccount (a bound token)."""
        path = self.state / "netpol.kubeconfig"
        path.touch(mode=0o600)
        _write_json(
            path,
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kvgate",
                        "cluster": {"server": server, "certificate-authority": str(ca)},
                    }
                ],
                "users": [{"name": "netpol", "user": {"token": token}}],
                "contexts": [
                    {"name": "netpol", "context": {"cluster": "kvgate", "user": "netpol"}}
                ],
                "current-context": "netpol",
            },
        )
        return path

    def policy_engine_argv(self, kubeconfig: Path, service_cidr: str) -> list[str]:
        """kube-router as a NetworkPolicy engine only: no routes, no service proxy, no ports."""
        return [
            str(self.bin_dir / POLICY_ENGINE),
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.node_name}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--run-loadbalancer=false",
            "--enable-ipv4=true",
            "--enable-ipv6=false",
            f"--service-cluster-ip-range={service_cidr}",
            # No health or metrics listener: nothing of it is reachable from the pods.
            "--health-port=0",
            "--metrics-port=0",
            "--iptables-sync-period=30s",
            "--v=1",
        ]

    def policy_engine_ready(self) -> bool:
        """Its first full sync is done: FORWARD jumps to its chain."""
        out = _run("iptables-save", "-t", "filter", check=False).stdout
        return f"-j {POLICY_ENGINE_FORWARD_CHAIN}" in out

    # -- images --

    def _ctr(self) -> list[str]:
        return [str(self.bin_dir / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io"]

    def import_archive(self, archive: Path) -> None:
        """Import an OCI/docker archive into the node's image store (`k8s.io` namespace)."""
        _run(*self._ctr(), "images", "import", "--no-unpack=false", str(archive), timeout=600)

    def import_sandbox_image(self) -> None:
        archive = self.state / "pause.oci.tar"
        write_oci_archive(archive, self.bin_dir / "kvgate-pause", SANDBOX_IMAGE)
        self.import_archive(archive)


# -- teardown (from the state directory alone) ---------------------------------------------------


def teardown(state: Path, log: Callable[[str], None]) -> list[str]:
    """Undo everything a node rooted in `state` made; returns what was left over and removed."""
    removed: list[str] = []
    if not state.exists():
        return removed
    digest = hashlib.sha256(str(state).encode()).hexdigest()[:10]
    run_dir = Path(f"/run/kvgate-{digest}")
    # What is global to the host (the bridge, KUBE-* chains, kubepods cgroups) is this node's
    # only if this state dir made the bridge: one real node runs at a time, and `prepare`
    # refuses to start beside another.
    owns_host_parts = (state / "bridge").exists()
    # 1. Processes: shims (reparented to init, own sessions) and whatever runs in the pods.
    for pid in _pids_mentioning(str(state), str(run_dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            removed.append(f"process {pid}")
    if owns_host_parts:
        _kill_cgroup_tree(removed)
    # 2. Mounts under the state dir, deepest first (overlays, shm, tmpfs volumes, netns).
    for _ in range(3):
        mounts = [m for m in _mounts() if m == str(state) or m.startswith(str(state) + "/")]
        if not mounts:
            break
        for m in sorted(mounts, key=len, reverse=True):
            if _run("umount", "-l", m, check=False).returncode == 0:
                removed.append(f"mount {m}")
    # 3. Network: the bridge (veths die with their netns); iptables chains; sysctls.
    if owns_host_parts:
        if _link_exists(BRIDGE):
            _run("ip", "link", "delete", BRIDGE, check=False)
            removed.append(f"bridge {BRIDGE}")
        for veth in _veths_on(BRIDGE):
            _run("ip", "link", "delete", veth, check=False)
        removed += [f"iptables chain {c}" for c in _remove_kube_chains()]
        # The engine's ipsets, once no rule refers to them any more.
        removed += [f"ipset {n}" for n in _remove_engine_ipsets()]
    with contextlib.suppress(OSError, ValueError):
        for key, value in json.loads((state / "sysctls.json").read_text()).items():
            if value is not None:
                _set_sysctl(key, value)
        (state / "sysctls.json").unlink()
    # 4. cgroups and files; the bridge marker goes last, once nothing global is left.
    if owns_host_parts:
        _remove_cgroups(removed)
        (state / "bridge").unlink(missing_ok=True)
    if run_dir.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(str(run_dir))
    for sub in ("root", "cstate", "kubelet", "runc", "netns", "cni-ipam", "opt"):
        with contextlib.suppress(OSError):
            shutil.rmtree(state / sub)
    if removed:
        log(f"node teardown: removed {len(removed)} leftovers ({', '.join(removed[:6])}...)")
    return removed


def leftovers(state: Path) -> list[str]:
    """What of the node still exists on the host (for tests: empty after teardown)."""
    digest = hashlib.sha256(str(state).encode()).hexdigest()[:10]
    out = [f"mount {m}" for m in _mounts() if m.startswith(str(state))]
    out += [f"process {p}" for p in _pids_mentioning(str(state), f"/run/kvgate-{digest}")]
    if _link_exists(BRIDGE):
        out.append(f"link {BRIDGE}")
    out += [f"veth {v}" for v in _veths_on(BRIDGE)]
    out += [f"iptables chain {c}" for c in sorted(_kube_chains())]
    out += [f"ipset {n}" for n in _engine_ipsets()]
    out += [f"cgroup {c}" for c in _kubepods_cgroups()]
    if Path(f"/run/kvgate-{digest}").exists():
        out.append(f"/run/kvgate-{digest}")
    return out


def _pids_mentioning(*needles: str) -> list[int]:
    own = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmd for n in needles):
            found.append(int(entry.name))
    return found


def _kubepods_cgroups() -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    return [c / "kubepods" for c in CGROUP_ROOT.iterdir() if (c / "kubepods").is_dir()]


def _cgroup_dirs_bottom_up(top: Path) -> Iterator[Path]:
    for root, dirs, _files in os.walk(top, topdown=False):
        for d in dirs:
            yield Path(root) / d
    yield top


def _kill_cgroup_tree(removed: list[str]) -> None:
    for top in _kubepods_cgroups():
        for d in _cgroup_dirs_bottom_up(top):
            with contextlib.suppress(OSError, ValueError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                        removed.append(f"process {pid}")


def _remove_cgroups(removed: list[str]) -> None:
    for top in _kubepods_cgroups():
        for _ in range(20):
            for d in _cgroup_dirs_bottom_up(top):
                with contextlib.suppress(OSError):
                    d.rmdir()
            if not top.exists():
                removed.append(f"cgroup {top}")
                break
            time.sleep(0.1)


def _mounts() -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            # Field 5 is the mount point, with spaces etc. octal-escaped.
            point = line.split()[4]
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return out


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _veths_on(bridge: str) -> list[str]:
    brif = Path(f"/sys/class/net/{bridge}/brif")
    return sorted(p.name for p in brif.iterdir()) if brif.is_dir() else []


_IPTABLES = ("iptables", "ip6tables")
_TABLES = ("filter", "nat", "mangle")


def _kube_chains() -> set[str]:
    chains: set[str] = set()
    for tool in _IPTABLES:
        if not shutil.which(f"{tool}-save"):
            continue
        for table in _TABLES:
            out = _run(f"{tool}-save", "-t", table, check=False).stdout
            chains |= {
                f"{tool}/{table}/{m}" for m in re.findall(r"^:(KUBE-\S+)", out, re.MULTILINE)
            }
    return chains


def _remove_kube_chains() -> list[str]:
    """Delete every KUBE-* chain and each rule that jumps to one (kubelet's and kube-proxy's)."""
    gone = []
    for tool in _IPTABLES:
        if not shutil.which(f"{tool}-save"):
            continue
        for table in _TABLES:
            out = _run(f"{tool}-save", "-t", table, check=False).stdout
            chains = re.findall(r"^:(KUBE-\S+)", out, re.MULTILINE)
            if not chains:
                continue
            # Rules in the built-in chains that jump to ours, deleted by their own spec.
            for rule in re.findall(r"^-A ((?!KUBE-)\S+ .*-j KUBE-\S+.*)$", out, re.MULTILINE):
                _run(tool, "-t", table, "-D", *shlex.split(rule), check=False)
            for chain in chains:
                _run(tool, "-t", table, "-F", chain, check=False)
            for chain in chains:
                if _run(tool, "-t", table, "-X", chain, check=False).returncode == 0:
                    gone.append(f"{tool}/{table}/{chain}")
    return gone


def _engine_ipsets() -> list[str]:
    """The NetworkPolicy engine's ipsets on this host (none when ipset is not installed)."""
    if not shutil.which("ipset"):
        return []
    names = _run("ipset", "list", "-n", check=False).stdout.split()
    return sorted(n for n in names if _ENGINE_IPSET.match(n))


def _remove_engine_ipsets() -> list[str]:
    gone = []
    for name in _engine_ipsets():
        if _run("ipset", "destroy", name, check=False).returncode == 0:
            gone.append(name)
    return gone


def _sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _set_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", key).write_text(value + "\n")


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


# -- a one-file OCI image (the pod sandbox) ------------------------------------------------------


def write_oci_archive(archive: Path, program: Path, name: str) -> None:
    """An OCI image archive whose only file is `program` at /pause, run as its entrypoint."""
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w") as tar:
        info = tar.gettarinfo(str(program), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with open(program, "rb") as f:
            tar.addfile(info, f)
    diff_id = hashlib.sha256(layer_tar.getvalue()).hexdigest()
    layer = gzip.compress(layer_tar.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
    ).encode()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": blob(config, "application/vnd.oci.image.config.v1+json"),
            "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar+gzip")],
        }
    ).encode()
    top = blob(manifest, "application/vnd.oci.image.manifest.v1+json")
    top["annotations"] = {"org.opencontainers.image.ref.name": name}
    index = json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()
    with tarfile.open(archive, "w") as tar:
        files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
        files |= {f"blobs/sha256/{d}": b for d, b in blobs.items()}
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
