"""Virtual multi-host clusters made of Linux network namespaces, for tests.

Each :class:`VirtualHost` is a network namespace with its own IPv4 address, and every
process started through :meth:`VirtualHost.command` / :meth:`VirtualHost.popen` also gets
a private UTS namespace whose hostname is the virtual host's hostname. The test process
(e.g. the mgpu master) stays in the root namespace and is reachable from every host at
:attr:`VirtualCluster.gateway_ip`.

Topology (one cluster)::

    root ns:   mggw<id>  10.231.k.1/24  (the gateway the master binds to)
                  |  veth
    mg-<id>-sw:   gw --- bridge mgbr<id> --- h2 --- h3 ...     (a private "switch")
                                              | veth  | veth
    mg-<id>-a:                              eth0 10.231.k.2/24
    mg-<id>-b:                                      eth0 10.231.k.3/24

The bridge lives in a namespace of its own rather than in the root namespace: with
``br_netfilter`` loaded and ``bridge-nf-call-iptables=1`` (the case on many machines),
frames bridged in the root namespace go through the root firewall's FORWARD chain,
which Docker and others set to DROP. The switch namespace has an empty firewall and
its own (per-namespace) bridge-nf sysctls, which we set to 0, so host-to-host traffic
never depends on, nor changes, the machine's firewall. Host-to-master traffic is
ordinary local delivery in the root namespace (no forwarding).

Nothing routes out of the cluster: the default route in each host points at the
gateway only when the root namespace does not forward IPv4 (so packets to any other
address die there); otherwise each host gets routes to the root namespace's own
addresses and an ``unreachable`` default. Each host also gets its own ``/etc/hosts``
(every cluster hostname) and a ``resolv.conf`` pointing at its own loopback, so name
lookups never leave the namespace.

Every name we create is derived from a 4-hex-digit cluster id, and the owning process
is recorded in ``/run/mgpu-netns/<id>``, so :func:`cleanup_stale` can remove what a
crashed run left behind without touching a cluster that is still in use by another
live test run.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "NetnsError",
    "VirtualCluster",
    "VirtualHost",
    "cleanup_stale",
    "netns_available",
]

SUBNET_POOL = ipaddress.IPv4Network("10.231.0.0/16")
CMD_TIMEOUT = 15.0  # seconds, for each ip/unshare helper command
STATE_DIR = Path("/run/mgpu-netns")
ETC_NETNS = Path("/etc/netns")
SWITCH_SUFFIX = "sw"
# No spanning tree, no forwarding delay: a port forwards as soon as it is up.
_BRIDGE_OPTS = ("stp_state", "0", "forward_delay", "0")

# sh snippet run inside the new UTS namespace: set the hostname, then exec the target
# (so the target keeps the pid that subprocess.Popen reports).
_SET_HOSTNAME_AND_EXEC = 'printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"'
# Prefix of an argv that runs the rest in a new UTS namespace; next come hostname, argv.
_IN_NEW_UTS = ("unshare", "--uts", "--", "sh", "-c", _SET_HOSTNAME_AND_EXEC)

_ID_RE = re.compile(r"^[0-9a-f]{4}$")
_NETNS_RE = re.compile(r"^mg-([0-9a-f]{4})-[A-Za-z0-9_.-]+$")
_LINK_RE = re.compile(r"^mg(?:gw|br)([0-9a-f]{4})$")
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,64}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


class NetnsError(RuntimeError):
    """A namespace/link operation failed."""


# --------------------------------------------------------------------------- helpers


def _run(
    argv: Sequence[str], *, timeout: float = CMD_TIMEOUT, check: bool = True
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(argv)!r} timed out after {timeout:.0f}s") from exc
    except OSError as exc:
        raise NetnsError(f"{' '.join(argv)!r} could not run: {exc}") from exc
    if check and proc.returncode != 0:
        raise NetnsError(
            f"{' '.join(argv)!r} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
        )
    return proc


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run `ip [-n netns] ARGS...` and return its stdout."""
    ns_opt = ["-n", netns] if netns else []
    return _run(["ip", *ns_opt, *args], check=check).stdout


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state)."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None or ")" not in raw:
        return None
    return raw.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _is_live(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _session_members(sid: int) -> list[int]:
    """Live pids whose session id is `sid` (our popen'd processes are session leaders)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _proc_stat(int(entry))
        if fields and len(fields) > 3 and fields[3] == str(sid) and fields[0] not in "ZX":
            members.append(int(entry))
    return members


def _signal_pids(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    if proc.returncode != 0:
        return []
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit() and int(tok) != os.getpid()]


def _kill_netns_processes(netns: str, grace: float) -> None:
    """SIGTERM every process inside `netns`, SIGKILL whatever is left after `grace` s."""
    pids = _netns_pids(netns)
    if not pids:
        return
    _signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_is_live(p) for p in _netns_pids(netns)):
        time.sleep(0.05)
    _signal_pids(_netns_pids(netns), signal.SIGKILL)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(_is_live(p) for p in _netns_pids(netns)):
        time.sleep(0.05)


def _list_netns() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    # Lines look like "mg-ab12-a (id: 3)" or just "mg-ab12-a".
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _list_root_links() -> list[str]:
    proc = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in proc.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return _run(argv, check=False).returncode == 0


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serialise subnet choice and stale cleanup between concurrent test runs."""
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _claim_id() -> str:
    """A fresh cluster id, recorded as owned by this process. Call with the lock held."""
    in_use = {p.name for p in STATE_DIR.iterdir()} if STATE_DIR.is_dir() else set()
    in_use |= {m.group(1) for n in _list_netns() if (m := _NETNS_RE.match(n))}
    in_use |= {m.group(1) for n in _list_root_links() if (m := _LINK_RE.match(n))}
    for _ in range(1000):
        cid = secrets.token_hex(2)
        if cid not in in_use:
            pid = os.getpid()
            (STATE_DIR / cid).write_text(f"{pid} {_start_time(pid)}\n")
            return cid
    raise NetnsError("no free cluster id")


def _owner_alive(cid: str) -> bool:
    raw = _read(STATE_DIR / cid)
    if not raw:
        return False
    try:
        pid_s, start = raw.split()
        pid = int(pid_s)
    except ValueError:
        return False
    return _is_live(pid) and _start_time(pid) == start


def _routed_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the root namespace routes or has an address in (default excluded)."""
    nets: list[ipaddress.IPv4Network] = []
    for argv in (["ip", "-4", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        for line in _run(argv).stdout.splitlines():
            for tok in line.split():
                if tok[:1].isdigit() and ("." in tok):
                    with contextlib.suppress(ValueError):
                        nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    """A free /24 from SUBNET_POOL (random start, skipping anything already routed)."""
    taken = _routed_networks()
    candidates = list(SUBNET_POOL.subnets(new_prefix=24))
    start = secrets.randbelow(len(candidates))
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if net.network_address.packed[2] == 0:
            continue  # skip 10.231.0.0/24, the most likely to be used by hand
        if not any(net.overlaps(other) for other in taken):
            return net
    raise NetnsError(f"no free /24 in {SUBNET_POOL}")


def _root_forwards_ipv4() -> bool:
    return _read("/proc/sys/net/ipv4/ip_forward") != "0"


def _root_local_ipv4() -> list[str]:
    """Non-loopback IPv4 addresses of the root namespace."""
    out = []
    for line in _run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not ipaddress.IPv4Address(addr).is_loopback:
                out.append(addr)
    return out


# ------------------------------------------------------------------- availability


@functools.cache
def netns_available() -> str | None:
    """None when this machine can build virtual clusters, else why not (for pytest.skip)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, pkg in (("ip", "iproute2"), ("unshare", "util-linux"), ("sh", "dash")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install {pkg}; see scripts/install-system-deps.sh)"
    netns = None
    try:
        with _state_lock():
            cid = _claim_id()
        netns = f"mg-{cid}-probe"
        _ip("netns", "add", netns)
        _ip("link", "add", "br0", "type", "bridge", netns=netns)
        _ip("link", "add", "v0", "type", "veth", "peer", "name", "v1", netns=netns)
        _ip("link", "set", "v0", "master", "br0", netns=netns)
        read_hostname = ["cat", "/proc/sys/kernel/hostname"]
        out = _ip("netns", "exec", netns, *_IN_NEW_UTS, "mgprobe", *read_hostname).strip()
        if out != "mgprobe":
            return f"could not set a hostname in a UTS namespace (got {out!r})"
    except (NetnsError, OSError) as exc:
        return f"cannot build network namespaces here: {exc}"
    finally:
        if netns is not None:
            _run(["ip", "netns", "delete", netns], check=False)
            (STATE_DIR / netns.split("-")[1]).unlink(missing_ok=True)
    return None


# --------------------------------------------------------------------------- hosts


class VirtualHost:
    """One virtual machine: a network namespace with its own IP and hostname."""

    def __init__(
        self, cluster: VirtualCluster, name: str, hostname: str, ip: str, index: int
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.hostname = hostname
        self.ip = ip
        self.netns = f"mg-{cluster.id}-{name}"
        self.switch_port = f"h{index}"  # our veth end, inside the switch namespace

    def __repr__(self) -> str:
        return f"VirtualHost(name={self.name!r}, hostname={self.hostname!r}, ip={self.ip!r})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """An argv that runs `argv` inside this host (its netns, plus a UTS namespace with
        the virtual hostname). The final process is exec'd, so its pid is the one the
        caller's Popen sees and can be signalled directly."""
        if not argv:
            raise ValueError("empty argv")
        return ["ip", "netns", "exec", self.netns, *_IN_NEW_UTS, self.hostname, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` on this host in a new session/process group, tracked for cleanup."""
        return self.cluster._popen(self.command(argv), **kwargs)

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to completion, capturing text output."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cluster._terminate(proc, grace=1.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)  # reap; pipes may be held by escaped children
            raise
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def cut_link(self) -> None:
        """Unplug this host's cable: no traffic to/from the master or other hosts."""
        _ip("link", "set", self.switch_port, "down", netns=self.cluster.switch_netns)

    def restore_link(self) -> None:
        """Plug the cable back in (the bridge port forwards again at once: STP is off)."""
        _ip("link", "set", self.switch_port, "up", netns=self.cluster.switch_netns)

    def pids(self) -> list[int]:
        """Pids of every process currently inside this host's network namespace."""
        return _netns_pids(self.netns)


# ------------------------------------------------------------------------- cluster


class VirtualCluster:
    """A set of virtual hosts on one private /24, plus the root namespace as gateway.

    Use as a context manager; everything it created (processes included) is removed
    on exit, and on any failure while being set up.
    """

    def __init__(
        self,
        *,
        gateway_hostname: str = "mgpu-master",
        default_route: bool | None = None,
        term_grace: float = 5.0,
    ) -> None:
        if not _HOSTNAME_RE.match(gateway_hostname):
            raise ValueError(f"bad gateway hostname {gateway_hostname!r}")
        self.gateway_hostname = gateway_hostname
        self.term_grace = term_grace
        self.id = ""
        self.subnet = ipaddress.IPv4Network("0.0.0.0/32")
        self.gateway_ip = ""
        self.bridge = ""
        self.gateway_link = ""
        self.switch_netns = ""
        self.hosts: dict[str, VirtualHost] = {}
        self.default_route = default_route
        self._procs: list[subprocess.Popen[Any]] = []
        self._netns_made: list[str] = []
        self._started = False
        self._closed = False

    # -- lifecycle

    def __enter__(self) -> VirtualCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create the switch namespace, bridge and gateway link."""
        if self._started:
            return
        self._started = True
        try:
            with _state_lock():
                self.id = _claim_id()
                self.subnet = _pick_subnet()
                self.bridge = f"mgbr{self.id}"
                self.gateway_link = f"mggw{self.id}"
                self.switch_netns = f"mg-{self.id}-{SWITCH_SUFFIX}"
                self.gateway_ip = str(self.subnet.network_address + 1)
                sw = self.switch_netns
                self._add_netns(sw)
                # Bridged frames in this namespace must not be handed to (its empty)
                # iptables; these sysctls are per network namespace since Linux 5.3.
                no_br_nf = 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do echo 0 > "$f"; done'
                _ip("netns", "exec", sw, "sh", "-c", no_br_nf + " 2>/dev/null; true")
                _ip("link", "add", self.bridge, "type", "bridge", *_BRIDGE_OPTS, netns=sw)
                _ip("link", "set", self.bridge, "up", netns=sw)
                peer = ("peer", "name", "gw", "netns", sw)
                _ip("link", "add", self.gateway_link, "type", "veth", *peer)
                _ip("link", "set", "gw", "master", self.bridge, "up", netns=sw)
                gw_cidr = f"{self.gateway_ip}/{self.subnet.prefixlen}"
                _ip("addr", "add", gw_cidr, "dev", self.gateway_link)
                _ip("link", "set", self.gateway_link, "up")
            if self.default_route is None:
                self.default_route = not _root_forwards_ipv4()
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str, hostname: str) -> VirtualHost:
        """Create a host: netns mg-<id>-<name>, next free IP, given hostname."""
        if not self._started or self._closed:
            raise NetnsError("cluster is not running (use it as a context manager)")
        if not _HOST_NAME_RE.match(name) or name in (SWITCH_SUFFIX, "probe"):
            raise ValueError(f"bad host name {name!r} (letters, digits, _ and -; max 32)")
        if not _HOSTNAME_RE.match(hostname):
            raise ValueError(f"bad hostname {hostname!r}")
        if name in self.hosts:
            raise ValueError(f"host {name!r} already exists")
        if hostname in {h.hostname for h in self.hosts.values()} | {self.gateway_hostname}:
            raise ValueError(f"hostname {hostname!r} already used in this cluster")
        index = len(self.hosts) + 2
        if index >= self.subnet.num_addresses - 1:
            raise NetnsError("subnet full")
        ip = str(self.subnet.network_address + index)
        host = VirtualHost(self, name, hostname, ip, index)
        ns, sw, prefix = host.netns, self.switch_netns, self.subnet.prefixlen
        try:
            self._add_netns(ns)
            port = host.switch_port
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns, netns=sw)
            _ip("link", "set", port, "master", self.bridge, "up", netns=sw)
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("addr", "add", f"{ip}/{prefix}", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            if self.default_route:
                _ip("route", "add", "default", "via", self.gateway_ip, netns=ns)
            else:
                # Route only to the root namespace's own addresses, so that nothing from
                # a host can be forwarded off this machine.
                for addr in _root_local_ipv4():
                    if ipaddress.IPv4Address(addr) not in self.subnet:
                        _ip("route", "add", f"{addr}/32", "via", self.gateway_ip, netns=ns)
                _ip("route", "add", "unreachable", "default", netns=ns)
            self.hosts[name] = host
            self._write_etc_files()
        except BaseException:
            self.hosts.pop(name, None)
            self._remove_netns(ns)
            raise
        return host

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` in the root namespace (e.g. the master), tracked for cleanup."""
        return self._popen(list(argv), **kwargs)

    def stop(self, proc: subprocess.Popen[Any], grace: float | None = None) -> None:
        """Stop one tracked process and its whole session now (SIGTERM, then SIGKILL after
        `grace` s; default: the cluster's term_grace), before the cluster itself closes."""
        self._terminate(proc, grace=self.term_grace if grace is None else grace)

    def close(self) -> None:
        """Kill tracked processes, then delete namespaces, links and files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for proc in self._procs:
            try:
                self._terminate(proc, grace=self.term_grace)
            except Exception as exc:  # keep cleaning up
                errors.append(f"pid {proc.pid}: {exc}")
        for ns in reversed(self._netns_made):
            try:
                self._remove_netns(ns)
            except Exception as exc:
                errors.append(f"{ns}: {exc}")
        if self.gateway_link and _link_exists(self.gateway_link):
            res = _run(["ip", "link", "delete", self.gateway_link], check=False)
            if res.returncode != 0 and _link_exists(self.gateway_link):
                errors.append(f"{self.gateway_link}: {res.stderr.strip()}")
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only succeeds when empty (nobody else uses it)
        if self.id:
            (STATE_DIR / self.id).unlink(missing_ok=True)
        if errors:
            raise NetnsError("cleanup incomplete: " + "; ".join(errors))

    # -- internals

    def _popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        if self._closed or not self._started:
            raise NetnsError("cluster is not running")
        if kwargs.pop("start_new_session", True) is not True:
            raise ValueError("processes always get their own session (for group cleanup)")
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def _terminate(self, proc: subprocess.Popen[Any], grace: float) -> None:
        """SIGTERM the process group of `proc`, wait up to `grace` s, then SIGKILL.

        The leader was started with start_new_session, so its pid is both its process
        group id and session id. While the leader is unreaped its group cannot vanish,
        so killpg is safe; after that we signal only live members of that session."""
        sid = proc.pid

        def signal_all(sig: signal.Signals) -> None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(sid, sig)
            _signal_pids(_session_members(sid), sig)

        def wait_gone(timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None and not _session_members(sid):
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)

        if proc.poll() is not None and not _session_members(sid):
            return
        signal_all(signal.SIGTERM)
        if wait_gone(grace):
            return
        signal_all(signal.SIGKILL)
        if not wait_gone(5.0):
            raise NetnsError(f"process group {sid} survived SIGKILL")

    def _add_netns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._netns_made.append(ns)

    def _remove_netns(self, ns: str) -> None:
        if ns in _list_netns():
            _kill_netns_processes(ns, grace=self.term_grace)
            _ip("netns", "delete", ns)
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        with contextlib.suppress(ValueError):
            self._netns_made.remove(ns)

    def _write_etc_files(self) -> None:
        """Per-host /etc/hosts and /etc/resolv.conf (`ip netns exec` bind-mounts them).

        Files are rewritten in place (same inode), so processes already running on a
        host see hosts added later."""
        lines = [
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{self.gateway_ip}\t{self.gateway_hostname}",
            *(f"{h.ip}\t{h.hostname}" for h in self.hosts.values()),
        ]
        hosts_text = "\n".join(lines) + "\n"
        # No name server reachable: lookups of unknown names fail fast, locally.
        resolv_text = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        for host in self.hosts.values():
            etc = ETC_NETNS / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            for fname, text in (("hosts", hosts_text), ("resolv.conf", resolv_text)):
                with open(etc / fname, "w") as fh:
                    fh.write(text)


# ------------------------------------------------------------------- stale cleanup


def cleanup_stale() -> list[str]:
    """Remove namespaces, links and files left by crashed runs; returns what was removed.

    Only names of our own scheme are considered (netns ``mg-<id>-*``, links
    ``mggw<id>``/``mgbr<id>``, ``/etc/netns/mg-<id>-*``), and only for ids
    whose owner process (``/run/mgpu-netns/<id>``) is gone, so clusters of other live
    test runs on this machine are left alone."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return []
    removed: list[str] = []
    with _state_lock():
        namespaces = [n for n in _list_netns() if _NETNS_RE.match(n)]
        links = [n for n in _list_root_links() if _LINK_RE.match(n)]
        etc_dirs = [p.name for p in ETC_NETNS.glob("mg-*")] if ETC_NETNS.is_dir() else []
        state_ids = [p.name for p in STATE_DIR.iterdir() if _ID_RE.match(p.name)]
        ids = {m.group(1) for n in namespaces + etc_dirs if (m := _NETNS_RE.match(n))}
        ids |= {m.group(1) for n in links if (m := _LINK_RE.match(n))}
        ids |= set(state_ids)
        for cid in sorted(ids):
            if _owner_alive(cid):
                continue
            for ns in namespaces:
                if ns.startswith(f"mg-{cid}-"):
                    _kill_netns_processes(ns, grace=2.0)
                    if _run(["ip", "netns", "delete", ns], check=False).returncode == 0:
                        removed.append(f"netns {ns}")
            for link in links:
                if (
                    link[4:] == cid
                    and _run(["ip", "link", "delete", link], check=False).returncode == 0
                ):
                    removed.append(f"link {link}")
            for d in etc_dirs:
                if d.startswith(f"mg-{cid}-"):
                    shutil.rmtree(ETC_NETNS / d, ignore_errors=True)
                    removed.append(f"dir {ETC_NETNS / d}")
            (STATE_DIR / cid).unlink(missing_ok=True)
    if removed:
        warnings.warn(f"removed leftovers of crashed netns test runs: {removed}", stacklevel=2)
    return removed
