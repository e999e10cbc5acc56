"""A real Kubernetes 1.20 for tests: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and N kubelets, each kubelet a node of its own.

The binaries come from scripts/k8s/build.sh (Debian 12's `kubernetes` source package, built
once per machine and cached outside the checkout); etcd, containerd, runc and the CNI plugins
from Debian's binary packages.  Layout (docs/KUBERNETES.md has the why of each choice):

- The control plane runs in the root namespace; the API server listens on the gateway
  address of a :class:`netns.VirtualCluster`, reachable from this process and every node.
- Each node is one network namespace (a real, non-loopback node address: the API server
  reaches the kubelet there for pods/log) plus one mount namespace shared by that node's
  containerd and kubelet.  The kubelet hard-codes /var/lib/kubelet/device-plugins and
  /var/log/pods, and removes what it does not know there, so each node bind-mounts private
  directories over those paths in its own mount namespace.  The kubelet's tmpfs volumes stay
  in that namespace too, where its containerd sees them, and vanish with it.
- Each node has its own containerd (a kubelet removes sandboxes it did not make), its own
  cgroup root in every cgroup v1 hierarchy (cgroupfs driver), a CNI bridge with a pod subnet
  of its own, routes to the other nodes' pod subnets (pods reach each other) and a route
  back from the root namespace (pods reach this process).
- GPUs: mgpu-fakegpu, a device plugin advertising fake `nvidia.com/gpu` devices.
- Images: busybox and pause, imported from tarballs (no registry).

Everything is torn down by pid / process group, by cgroup (the pods' processes) and by
namespace (the containerd shims); the cgroups made are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kubecerts import Pki, write_kubeconfig
from netns import VirtualCluster, VirtualHost, netns_available

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "k8s" / "build.sh"
IMAGE_BUSYBOX = "mgpu.test/busybox:1"
IMAGE_PAUSE = "mgpu.test/pause:1"
GPU_RESOURCE = "nvidia.com/gpu"
CGROUP_FS = Path("/sys/fs/cgroup")
# Paths the kubelet hard-codes; each node mounts private directories over them.
KUBELET_FIXED_DIRS = ("/var/lib/kubelet/device-plugins", "/var/log/pods", "/var/log/containers")
START_TIMEOUT = 180.0  # seconds for the whole control plane or a node to come up (loaded CI)


class KubeError(RuntimeError):
    """The test cluster could not start."""


def build() -> tuple[Path | None, str]:
    """(the build cache, "") once scripts/k8s/build.sh has built Kubernetes (minutes the first
    time on a machine, then instant); (None, why) where it cannot be built here."""
    reason = netns_available()
    if reason is not None:
        return None, f"network namespaces unavailable: {reason}"
    if not CGROUP_FS.joinpath("memory").is_dir():
        return None, "needs cgroup v1 hierarchies (the kubelet here runs with cgroupfs, v1)"
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600
        )
    except subprocess.TimeoutExpired:
        return None, "scripts/k8s/build.sh ran over an hour"
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return None, "scripts/k8s/build.sh failed: " + " | ".join(lines[-3:])
    where = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, timeout=60
    )
    if where.returncode != 0:
        return None, "scripts/k8s/build.sh finished but its cache is not ready"
    return Path(where.stdout.strip()), ""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Any, timeout: float, log: Path | None = None) -> Any:
    """Poll `probe()` until it returns something truthy; KubeError naming `what` (and the
    tail of `log`) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (OSError, httpx.HTTPError, subprocess.SubprocessError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- " + str(log) + " ---\n" + "\n".join(log.read_text().splitlines()[-25:])
    raise KubeError(f"{what}: not after {timeout:.0f} s (last: {last!r}){tail}")


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, name=systemd, the hybrid `unified`)."""
    return sorted(
        p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink() and os.path.ismount(p)
    )


def make_cgroup_root(name: str) -> None:
    """/NAME in every hierarchy: the kubelet refuses a cgroup root that does not exist."""
    for hierarchy in _cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset has no CPUs or memory nodes until given
            for f in ("cpuset.cpus", "cpuset.mems"):
                (path / f).write_text((hierarchy / f).read_text())


def remove_cgroup_root(name: str, timeout: float = 20.0) -> None:
    """Kill every process under /NAME (the pods' containers) and remove its cgroups."""
    trees = [h / name for h in _cgroup_hierarchies() if (h / name).is_dir()]
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for tree in trees:  # os.walk, not rglob: containerd may remove a cgroup mid-walk
            for where, _, files in os.walk(tree):
                with contextlib.suppress(OSError):
                    if "cgroup.procs" in files:
                        pids |= {int(p) for p in Path(where, "cgroup.procs").read_text().split()}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        busy = []
        for tree in trees:
            dirs = [Path(where) for where, _, _ in os.walk(tree, topdown=False)]  # deepest first
            for path in dirs:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy.append(path)
        if not busy:
            return
        if time.monotonic() > deadline:
            raise KubeError(f"cgroups still busy: {busy[:3]}")
        time.sleep(0.2)


@dataclass
class KubeNode:
    """One kubelet: its network namespace (`host`), processes and directories."""

    name: str
    host: VirtualHost
    dir: Path
    cgroup_root: str
    pod_cidr: str
    gpus: int
    containerd: subprocess.Popen[Any] | None = None
    kubelet: subprocess.Popen[Any] | None = None
    plugin: subprocess.Popen[Any] | None = None

    @property
    def ip(self) -> str:
        return self.host.ip

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"


class KubeCluster:
    """The cluster; `start()` / `close()` (or a `with` block).  `api` is an httpx client
    with the admin's client certificate; `kubeconfig` (client certificate),
    `token_kubeconfig` (an admin's bearer token) and `nobody_kubeconfig` (a bearer token
    with no rights) are kubeconfig files for it."""

    def __init__(
        self,
        cache: Path,
        *,
        nodes: int = 2,
        gpus_per_node: int = 2,
        controller_args: tuple[str, ...] = (),
    ) -> None:
        self.bin = cache / "bin"
        self.images = cache / "images"
        self.node_count = nodes
        self.gpus_per_node = gpus_per_node
        self.controller_args = controller_args
        self.dir = Path(tempfile.mkdtemp(prefix="mk8s-", dir="/tmp"))  # short: socket paths
        self.logs = self.dir / "logs"
        self.vc = VirtualCluster(gateway_hostname="k8s-api")
        self.nodes: dict[str, KubeNode] = {}
        self._control: list[subprocess.Popen[Any]] = []
        self.server = ""
        self._api: httpx.Client | None = None
        self.timings: dict[str, float] = {}  # seconds from start() to each milestone

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start

    def start(self) -> None:
        began = time.monotonic()
        try:
            self.logs.mkdir()
            self.vc.start()
            self._credentials()
            self._start_control_plane()
            self.timings["control plane"] = time.monotonic() - began
            for i in range(self.node_count):
                self.add_node(f"k8s-node{i + 1}")
            self._route_pod_subnets()
            self.timings["nodes started"] = time.monotonic() - began
            wait_for("every node Ready with its GPUs", self._nodes_ready, START_TIMEOUT)
            self.timings["nodes ready"] = time.monotonic() - began
            # The ServiceAccount admission refuses Pods until `default` has its token.
            wait_for(
                "the default service account's token",
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default").get(
                    "secrets"
                ),
                START_TIMEOUT,
                self.logs / "kube-controller-manager.log",
            )
            self.timings["ready"] = time.monotonic() - began
        except BaseException:
            self.close()
            raise

    def _credentials(self) -> None:
        gw = self.vc.gateway_ip
        self.port = free_port(gw)
        self.server = f"https://{gw}:{self.port}"
        pki = self.pki = Pki(self.dir / "pki")
        names = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost")
        ips = (gw, "10.0.0.1", "127.0.0.1")
        self.serving = pki.issue("apiserver", "kube-apiserver", server_ips=ips, server_names=names)
        self.admin_cert = pki.issue("admin", "mgpu-test-admin", "system:masters")
        tokens = {
            "scheduler": pki.token("system:kube-scheduler"),
            "controller-manager": pki.token("system:kube-controller-manager"),
        }
        for i in range(self.node_count):
            name = f"k8s-node{i + 1}"
            tokens[name] = pki.token(f"system:node:{name}", ("system:nodes",))
        admin_token = pki.token("mgpu-test-token-admin", ("system:masters",))
        nobody_token = pki.token("mgpu-test-nobody")
        kc = self.dir / "kubeconfig"
        kc.mkdir()
        ca = pki.ca_path
        self.kubeconfig = write_kubeconfig(kc / "admin", self.server, ca, cert=self.admin_cert)
        self.token_kubeconfig = write_kubeconfig(kc / "token", self.server, ca, token=admin_token)
        self.nobody_kubeconfig = write_kubeconfig(
            kc / "nobody", self.server, ca, token=nobody_token
        )
        self._component_kubeconfig = {
            who: write_kubeconfig(kc / who, self.server, ca, token=tok)
            for who, tok in tokens.items()
        }

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[Any]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            return self.vc.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def _start_control_plane(self) -> None:
        pki, etcd_port, peer_port = self.pki.dir, free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._control.append(self._spawn("etcd", [
            "etcd", "--name", "k8s", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"k8s={peer_url}", "--log-level", "warn",
        ]))  # fmt: skip
        gw = self.vc.gateway_ip
        self._control.append(self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--etcd-servers", etcd_url,
            "--bind-address", gw, "--advertise-address", gw, "--secure-port", str(self.port),
            "--insecure-port", "0",
            "--tls-cert-file", str(self.serving[0]), "--tls-private-key-file", str(self.serving[1]),
            "--client-ca-file", str(self.pki.ca_path),
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-cluster-ip-range", "10.0.0.0/24",
            "--kubelet-preferred-address-types", "InternalIP",
            # Nodes are watched from etcd itself, compacted every 10 s: a watch from an old
            # resourceVersion then meets a real 410 Gone (tests of mgpu.kube's re-list).
            "--watch-cache-sizes=nodes#0", "--etcd-compaction-interval=10s",
            "--profiling=false", "--v=1",
        ]))  # fmt: skip
        wait_for(
            "the API server ready",
            lambda: self.api.get("/readyz").status_code == 200,
            START_TIMEOUT,
            self.logs / "kube-apiserver.log",
        )
        self._control.append(self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"),
            "--kubeconfig", str(self._component_kubeconfig["scheduler"]),
            "--leader-elect=false", "--port=0", "--secure-port=0", "--v=1",
        ]))  # fmt: skip
        self._control.append(self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"),
            "--kubeconfig", str(self._component_kubeconfig["controller-manager"]),
            "--leader-elect=false", "--port=0", "--secure-port=0",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(self.pki.ca_path),
            # Each controller with its own service account, as kube-controller-manager's own
            # role expects (it cannot itself update nodes' taints, say).
            "--use-service-account-credentials=true",
            "--node-monitor-period=2s", "--node-monitor-grace-period=20s",
            "--v=1", *self.controller_args,
        ]))  # fmt: skip

    # -- nodes

    def add_node(self, name: str) -> KubeNode:
        """Start one more node: its namespaces, containerd, images, kubelet and GPU plugin."""
        index = len(self.nodes)
        host = self.vc.add_host(name, name)
        third = self.vc.subnet.network_address.packed[2]
        node = KubeNode(
            name=name,
            host=host,
            dir=self.dir / name,
            cgroup_root=f"mgpu-k8s-{self.vc.id}-{name}",
            pod_cidr=f"10.232.{third}.{index * 32}/27",
            gpus=self.gpus_per_node,
        )
        self.nodes[name] = node
        for sub in ("device-plugins", "log-pods", "log-containers", "kubelet", "cni", "ipam"):
            (node.dir / sub).mkdir(parents=True)
        for fixed in KUBELET_FIXED_DIRS:  # the mount points (empty directories) must exist
            Path(fixed).mkdir(parents=True, exist_ok=True)
        make_cgroup_root(node.cgroup_root)
        self._write_node_config(node)
        binds = " && ".join(
            f'mount --bind "$0/{sub}" {fixed}'
            for sub, fixed in zip(
                ("device-plugins", "log-pods", "log-containers"), KUBELET_FIXED_DIRS, strict=True
            )
        )
        hostname = 'printf %s "$1" > /proc/sys/kernel/hostname'
        script = f'{hostname} && {binds} && exec containerd --config "$0/containerd.toml"'
        node.containerd = self._spawn(f"{name}-containerd", [
            "nsenter", f"--net=/run/netns/{host.netns}", "--",
            "unshare", "--mount", "--uts", "--propagation", "slave", "--",
            "sh", "-c", script, str(node.dir), name,
        ])  # fmt: skip
        ctr = ["ctr", "--address", str(node.containerd_socket), "--namespace", "k8s.io"]
        wait_for(
            f"{name}'s containerd",
            lambda: (
                subprocess.run([*ctr, "version"], capture_output=True, timeout=30).returncode == 0
            ),
            START_TIMEOUT,
            self.logs / f"{name}-containerd.log",
        )
        for image in ("pause.tar", "busybox.tar"):
            res = subprocess.run(
                [*ctr, "images", "import", str(self.images / image)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if res.returncode != 0:
                raise KubeError(f"{name}: ctr images import {image}: {res.stderr.strip()}")
        self._start_kubelet(node)
        node.plugin = self._spawn(f"{name}-fakegpu", [
            str(self.bin / "mgpu-fakegpu"), "-dir", str(node.dir / "device-plugins") + "/",
            "-count", str(node.gpus), "-prefix", f"GPU-{name}",
        ])  # fmt: skip
        return node

    def _write_node_config(self, node: KubeNode) -> None:
        d = node.dir
        (d / "containerd.toml").write_text(CONTAINERD_TOML.format(dir=d, pause=IMAGE_PAUSE))
        cni = {
            "cniVersion": "0.4.0",
            "name": "mgpu-test",
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(d / "ipam"),
                },
            }],
        }  # fmt: skip
        (d / "cni" / "10-mgpu-test.conflist").write_text(json.dumps(cni))
        (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node.ip,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": "/" + node.cgroup_root,
            "failSwapOn": False,
            "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE, which root lacks here
            "resolvConf": str(d / "resolv.conf"),
            "imageGCHighThresholdPercent": 100,  # never collect the imported images
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            "volumePluginDir": str(d / "kubelet" / "volume-plugins"),
        }
        (d / "kubelet.json").write_text(json.dumps(config))

    def _start_kubelet(self, node: KubeNode) -> None:
        assert node.containerd is not None
        endpoint = f"unix://{node.containerd_socket}"
        node.kubelet = self._spawn(f"{node.name}-kubelet", [
            "nsenter", f"--target={node.containerd.pid}", "--mount", "--net", "--uts", "--",
            str(self.bin / "kubelet"), "--config", str(node.dir / "kubelet.json"),
            "--kubeconfig", str(self._component_kubeconfig[node.name]),
            "--root-dir", str(node.dir / "kubelet"), "--cert-dir", str(node.dir / "kubelet-pki"),
            "--hostname-override", node.name, "--node-ip", node.ip,
            "--container-runtime=remote", "--container-runtime-endpoint", endpoint,
            "--pod-infra-container-image", IMAGE_PAUSE, "--v=1",
        ])  # fmt: skip

    def _route_pod_subnets(self) -> None:
        """Each node routes the others' pod subnets to them; the root namespace routes every
        pod subnet to its node (deleted with the gateway link)."""
        for node in self.nodes.values():
            for other in self.nodes.values():
                if other is not node:
                    argv = ["ip", "-n", node.host.netns, "route", "replace", other.pod_cidr]
                    subprocess.run([*argv, "via", other.ip], check=True, timeout=15)
            via = ["via", node.ip, "dev", self.vc.gateway_link]
            subprocess.run(["ip", "route", "replace", node.pod_cidr, *via], check=True, timeout=15)

    def _nodes_ready(self) -> bool:
        items = self.get("/api/v1/nodes")["items"]
        ready = set()
        for item in items:
            conditions = {c["type"]: c["status"] for c in item["status"].get("conditions", [])}
            gpus = item["status"].get("allocatable", {}).get(GPU_RESOURCE)
            # The controller manager lifts the not-ready taint a moment after Ready: until
            # then the scheduler refuses the node (and backs off the Pods it refused).
            tainted = any(
                t.get("key", "").startswith("node.kubernetes.io/")
                for t in item["spec"].get("taints", [])
            )
            if (
                conditions.get("Ready") == "True"
                and gpus == str(self.gpus_per_node)
                and not tainted
            ):
                ready.add(item["metadata"]["name"])
        return ready >= set(self.nodes)

    def stop_kubelet(self, name: str) -> None:
        """Kill one node's kubelet (its Pods' containers keep running, as on a real node)."""
        node = self.nodes[name]
        if node.kubelet is not None:
            self.vc.stop(node.kubelet, grace=0.5)
            node.kubelet = None

    def start_kubelet(self, name: str) -> None:
        """Start a stopped kubelet again (the device plugin registers with it again)."""
        node = self.nodes[name]
        if node.kubelet is None:
            self._start_kubelet(node)

    # -- the API, for fixtures and smoke tests (mgpu's own client is mgpu.kube)

    @property
    def api(self) -> httpx.Client:
        if self._api is None:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca_path))
            ctx.load_cert_chain(str(self.admin_cert[0]), str(self.admin_cert[1]))
            self._api = httpx.Client(base_url=self.server, verify=ctx, timeout=30.0)
        return self._api

    def get(self, path: str, **params: Any) -> Any:
        resp = self.api.get(path, params=params)
        resp.raise_for_status()
        return resp.json()

    # -- teardown

    def close(self) -> None:
        """Stop everything this cluster started, remove its cgroups, namespaces and files."""
        errors: list[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:  # keep tearing down
                errors.append(f"{what}: {exc}")

        if self._api is not None:
            self._api.close()
        for node in self.nodes.values():
            for proc in (node.plugin, node.kubelet):
                if proc is not None:
                    attempt(f"{node.name} stop", self.vc.stop, proc, 2.0)
        for node in self.nodes.values():  # the pods' processes, then their cgroups
            attempt(f"{node.name} cgroups", remove_cgroup_root, node.cgroup_root)
        for node in self.nodes.values():
            if node.containerd is not None:
                attempt(f"{node.name} containerd", self.vc.stop, node.containerd, 5.0)
        for proc in reversed(self._control):
            attempt("control plane", self.vc.stop, proc, 5.0)
        attempt("namespaces", self.vc.close)  # also kills the shims left in each node's netns
        for node in self.nodes.values():
            attempt(f"{node.name} cgroups", remove_cgroup_root, node.cgroup_root)
        attempt("files", shutil.rmtree, self.dir)
        if errors:
            raise KubeError("test Kubernetes teardown incomplete: " + "; ".join(errors))


# restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE.  runc, not crun: the VMs' hybrid
# cgroups.  netns_mounts_under_state_dir: pod network namespaces are pinned under this
# containerd's own state directory, not the machine's /run/netns.
CONTAINERD_TOML = """\
version = 2
root = "{dir}/containerd/root"
state = "{dir}/containerd/state"
[grpc]
  address = "{dir}/containerd.sock"
[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "{dir}/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{dir}/cni"
"""
