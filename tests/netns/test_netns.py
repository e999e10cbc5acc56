"""Tests of the network-namespace cluster fixture itself (tests/netns.py).

All traffic stays on this machine: between the root namespace and namespaces these
tests create. Every process is started through the cluster, which kills it on exit.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netns import STATE_DIR, VirtualCluster, VirtualHost, cleanup_stale, netns_available

# The `virtual_cluster` fixture comes from netns_fixtures.py, imported by conftest.py.

pytestmark = pytest.mark.netns

# Answers each connection with "<its hostname> <the client's address>", until idle.
SERVER = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 0))
    s.listen()
    print(s.getsockname()[1], flush=True)
    deadline = time.monotonic() + float(sys.argv[2])
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            conn, addr = s.accept()
        except TimeoutError:
            break
        with conn:
            conn.sendall(f"{socket.gethostname()} {addr[0]}\\n".encode())
    """
)

# Connects, prints the server's one-line answer; exit 1 (reason on stderr) on failure.
CLIENT = textwrap.dedent(
    """
    import socket, sys
    timeout = float(sys.argv[3])
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=timeout) as c:
            c.settimeout(timeout)
            print(c.makefile().readline().strip())
    except OSError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    """
)


def read_line(proc: subprocess.Popen[Any], timeout: float) -> str:
    """First stdout line of `proc`, or fail after `timeout` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"no output from {proc.args!r} within {timeout}s")
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"{proc.args!r} exited ({proc.wait(5)}) without output")
    return str(line).strip()


def start_server(
    where: VirtualCluster | VirtualHost, bind_ip: str, lifetime: float = 60.0
) -> tuple[subprocess.Popen[Any], int]:
    """A SERVER on `bind_ip`, in the root namespace (cluster) or on a host."""
    argv = [sys.executable, "-c", SERVER, bind_ip, str(lifetime)]
    proc = where.popen(argv, stdout=subprocess.PIPE, text=True)
    return proc, int(read_line(proc, timeout=15))


def connect(host: VirtualHost, ip: str, port: int, timeout: float = 3.0) -> tuple[bool, str]:
    """Run CLIENT on `host`; (succeeded, answer or error)."""
    res = host.run([sys.executable, "-c", CLIENT, ip, str(port), str(timeout)], timeout=30)
    return res.returncode == 0, (res.stdout if res.returncode == 0 else res.stderr).strip()


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def require_netns() -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def assert_gone(cluster_id: str, netns: list[str]) -> None:
    names = netns_names()
    assert not [n for n in names if n.startswith(f"mg-{cluster_id}-")], names
    links = root_links()
    assert not {f"mggw{cluster_id}", f"mgbr{cluster_id}"} & links, links
    for ns in netns:
        assert not Path("/etc/netns", ns).exists()
    assert not (STATE_DIR / cluster_id).exists()


@pytest.fixture(scope="module")
def hosts(virtual_cluster: VirtualCluster) -> tuple[VirtualHost, VirtualHost]:
    return (
        virtual_cluster.add_host("a", "node-a"),
        virtual_cluster.add_host("b", "node-b.cluster"),
    )


@pytest.fixture
def master_server(
    virtual_cluster: VirtualCluster,
) -> Iterator[int]:
    """Port of a SERVER on the gateway IP in the root namespace (the master's place)."""
    proc, port = start_server(virtual_cluster, virtual_cluster.gateway_ip)
    yield port
    stop(proc)


# ----------------------------------------------------------------------------- tests


def test_each_host_has_its_own_hostname(hosts: tuple[VirtualHost, VirtualHost]) -> None:
    a, b = hosts
    pyname = [sys.executable, "-c", "import socket; print(socket.gethostname())"]
    for host in (a, b):
        assert host.run(["hostname"], check=True).stdout.strip() == host.hostname
        assert host.run(pyname, check=True).stdout.strip() == host.hostname
    assert a.hostname != b.hostname
    assert socket.gethostname() not in (a.hostname, b.hostname)  # root ns untouched


def test_each_host_has_its_assigned_ip(
    virtual_cluster: VirtualCluster,
    hosts: tuple[VirtualHost, VirtualHost],
) -> None:
    a, b = hosts
    assert a.ip != b.ip
    for host in (a, b):
        out = host.run(["ip", "-4", "-o", "addr"], check=True).stdout
        addrs = {line.split()[3] for line in out.splitlines()}
        assert addrs == {"127.0.0.1/8", f"{host.ip}/24"}
        assert host.ip.rsplit(".", 1)[0] == virtual_cluster.gateway_ip.rsplit(".", 1)[0]
        assert host.netns in netns_names()


def test_names_resolve_inside_hosts(
    virtual_cluster: VirtualCluster,
    hosts: tuple[VirtualHost, VirtualHost],
) -> None:
    a, b = hosts
    out = b.run(["getent", "hosts", a.hostname, virtual_cluster.gateway_hostname], check=True)
    resolved = {name: ip for ip, name in (line.split() for line in out.stdout.splitlines())}
    assert resolved == {
        a.hostname: a.ip,
        virtual_cluster.gateway_hostname: virtual_cluster.gateway_ip,
    }


def test_host_reaches_master_on_gateway_ip(
    hosts: tuple[VirtualHost, VirtualHost], master_server: int
) -> None:
    a, _ = hosts
    ok, answer = connect(a, a.cluster.gateway_ip, master_server)
    assert ok, answer
    # The master sees the host's own address (no NAT) and runs under the real hostname.
    assert answer == f"{socket.gethostname()} {a.ip}"


def test_host_reaches_another_host(hosts: tuple[VirtualHost, VirtualHost]) -> None:
    a, b = hosts
    server, port = start_server(a, a.ip)
    try:
        ok, answer = connect(b, a.ip, port)
        assert ok, answer
        assert answer == f"{a.hostname} {b.ip}"
    finally:
        stop(server)


def test_master_reaches_host(hosts: tuple[VirtualHost, VirtualHost]) -> None:
    a, _ = hosts
    server, port = start_server(a, "0.0.0.0")
    try:
        with socket.create_connection((a.ip, port), timeout=3) as conn:
            conn.settimeout(3)
            assert conn.makefile().readline().split()[0] == a.hostname
    finally:
        stop(server)


def test_popen_pid_is_the_real_process(hosts: tuple[VirtualHost, VirtualHost]) -> None:
    a, _ = hosts
    python = sys.executable.encode()
    proc = a.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        # ip netns exec -> unshare -> sh -> python, all exec'd in place: same pid.
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != python:
            assert time.monotonic() < deadline, "the exec chain never reached python"
            time.sleep(0.02)
        assert os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert os.readlink(f"/proc/{proc.pid}/ns/uts") != os.readlink("/proc/self/ns/uts")
        assert os.getpgid(proc.pid) == proc.pid  # its own process group
        assert proc.pid in a.pids()
        proc.terminate()
        assert proc.wait(10) == -15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_cut_link_partitions_and_restore_heals(
    hosts: tuple[VirtualHost, VirtualHost], master_server: int
) -> None:
    a, b = hosts
    gateway = a.cluster.gateway_ip
    assert connect(a, gateway, master_server)[0]
    a.cut_link()
    try:
        started = time.monotonic()
        ok, error = connect(a, gateway, master_server, timeout=2.0)
        assert not ok
        assert time.monotonic() - started < 10, "a cut link must fail within the timeout"
        assert any(w in error.lower() for w in ("timed out", "unreachable", "no route")), error
        # Only a is partitioned: b still reaches the master.
        assert connect(b, gateway, master_server)[0]
    finally:
        a.restore_link()
    deadline = time.monotonic() + 15
    while True:
        ok, answer = connect(a, gateway, master_server, timeout=2.0)
        if ok:
            break
        assert time.monotonic() < deadline, f"link did not heal: {answer}"
        time.sleep(0.2)
    assert answer.endswith(a.ip)


def test_no_route_leaves_the_machine() -> None:
    """Hosts' traffic to other addresses cannot leave: checked with route lookups only."""
    require_netns()
    outside = "203.0.113.7"  # TEST-NET-3; only looked up, never contacted
    with VirtualCluster(default_route=False) as cluster:
        host = cluster.add_host("r", "restricted")
        res = host.run(["ip", "route", "get", outside])
        # An `unreachable` route: the kernel refuses locally, before any packet is sent.
        assert res.returncode != 0 and "no route to host" in res.stderr.lower(), res
        assert "nameserver 127.0.0.1" in host.run(["cat", "/etc/resolv.conf"]).stdout
    with VirtualCluster() as cluster:
        host = cluster.add_host("d", "default")
        via_gateway = host.run(["ip", "route", "get", outside], check=True).stdout
        assert f"via {cluster.gateway_ip}" in via_gateway
        # A default route is only installed when the root namespace drops such packets.
        assert cluster.default_route
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"


def test_exit_removes_everything_even_on_error() -> None:
    require_netns()
    cluster = VirtualCluster()
    with pytest.raises(RuntimeError, match="boom"), cluster:
        a = cluster.add_host("a", "node-a")
        cluster.add_host("b", "node-b")
        tracked = a.popen(["sleep", "300"])
        # Started behind the cluster's back: still inside a's netns, so still killed.
        stray = subprocess.Popen(
            ["ip", "netns", "exec", a.netns, "sleep", "301"], start_new_session=True
        )
        assert cluster.id and f"mggw{cluster.id}" in root_links()
        namespaces = [a.netns, cluster.switch_netns, f"mg-{cluster.id}-b"]
        assert set(namespaces) <= netns_names()
        raise RuntimeError("boom")
    assert tracked.poll() is not None
    assert stray.wait(10) is not None
    assert_gone(cluster.id, namespaces)


def test_cleanup_stale_removes_a_crashed_runs_leftovers() -> None:
    require_netns()
    crash = textwrap.dedent(
        """
        import os, subprocess, sys
        from netns import VirtualCluster
        c = VirtualCluster().__enter__()
        h = c.add_host("x", "crashed")
        h.popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(c.id, h.netns, flush=True)
        os._exit(1)  # no cleanup at all
        """
    )
    tests_dir = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, timeout=60, cwd=tests_dir
    )
    cluster_id, host_ns = out.stdout.split()
    assert host_ns in netns_names() and f"mggw{cluster_id}" in root_links()
    pids_out = subprocess.check_output(["ip", "netns", "pids", host_ns], text=True, timeout=10)
    sleeper = [int(pid) for pid in pids_out.split()]
    assert sleeper
    with VirtualCluster() as live:  # a live cluster must survive cleanup_stale()
        live_id = live.id
        with pytest.warns(UserWarning, match="leftovers"):
            removed = cleanup_stale()
        assert f"netns {host_ns}" in removed
        assert (STATE_DIR / live_id).exists() and f"mggw{live_id}" in root_links()
    assert_gone(cluster_id, [host_ns])
    for pid in sleeper:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
