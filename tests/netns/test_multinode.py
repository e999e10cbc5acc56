"""Multi-host behaviour on real network namespaces: one master, three "machines".

The master runs in the root namespace, bound to the virtual cluster's gateway address;
each node agent runs inside its own network + UTS namespace (its own IP and hostname),
so placement, hostnames/IPs, gang launches, torchrun rendezvous, mpirun through
`mgpu rsh` and network partitions are exercised across real (virtual) hosts.

The namespaces share the root filesystem and pid namespace, so scripts, gate files
and pids are visible from the test process. All traffic stays between the root
namespace and the namespaces the fixture creates.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import BIN, kill_group, wait_for
from mgpu import Client
from netns import VirtualCluster, VirtualHost

pytestmark = pytest.mark.netns

HEARTBEAT_INTERVAL = 0.3
HEARTBEAT_TIMEOUT = 3.0
NODES = {"node001": ("gpu001", "r1"), "node002": ("gpu002", "r1"), "node003": ("gpu003", "r2")}
GPUS_PER_NODE = 4


@dataclass
class MultiNode:
    vc: VirtualCluster
    hosts: dict[str, VirtualHost]
    address: str
    root: Path
    env: dict[str, str]
    token: str
    _client: Client | None = None

    def client(self) -> Client:
        """One client (one kept-alive TLS connection) for the whole module."""
        if self._client is None:
            self._client = Client(self.address, connect_timeout=5.0, token=self.token)
        return self._client

    def cli(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "mgpu"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )

    def cli_json(self, *args: str) -> Any:
        res = self.cli(*args, "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["node_id"]: n for n in self.cli_json("nodes")["nodes"]}

    def wait_job(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        job = self.client().wait(job_id, timeout=timeout)
        assert job["state"] not in ("queued", "running"), f"still {job['state']}: {job}"
        return job

    def node_ready(self, node_id: str) -> bool:
        n = self.nodes().get(node_id)
        return bool(n and n["state"] == "online" and n["connected"])

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _config(vc: VirtualCluster, hosts: dict[str, VirtualHost], port: int) -> str:
    lines = [
        "cluster:",
        '  name: "netns-test"',
        "  master:",
        f'    host: "{vc.gateway_ip}"',
        f"    port: {port}",
        "nodes:",
    ]
    for node_id, host in hosts.items():
        lines += [
            f'  - node_id: "{node_id}"',
            # A different name from the host's own: `mgpu nodes` must show what the
            # agent reports (its real hostname), not the config's.
            f'    hostname: "{host.hostname}.example.test"',
            f'    ip: "{host.ip}"',
            f"    gpu_count: {GPUS_PER_NODE}",
            '    gpu_type: "A100"',
            f'    rack: "{NODES[node_id][1]}"',
        ]
    lines += [
        "networking:",
        f"  heartbeat_interval: {HEARTBEAT_INTERVAL}",
        f"  timeout: {HEARTBEAT_TIMEOUT}",
        "scheduling:",
        '  default_policy: "fill_first"',
        "  retry_backoff_base: 0.2",
        "  kill_grace: 3",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def mn(
    virtual_cluster: VirtualCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MultiNode]:
    vc = virtual_cluster
    root = tmp_path_factory.mktemp("multinode")
    hosts = {node_id: vc.add_host(node_id, hostname) for node_id, (hostname, _) in NODES.items()}
    port = _free_port(vc.gateway_ip)
    config = root / "cluster_config.yaml"
    config.write_text(_config(vc, hosts, port))
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "OMPI_", "PMIX_"))
    }
    state = root / "master"
    procs: list[subprocess.Popen[bytes]] = []

    def logs() -> str:
        return "\n".join(
            f"--- {name}.log:\n{(root / f'{name}.log').read_text(errors='replace')[-3000:]}"
            for name in ["master", *NODES]
            if (root / f"{name}.log").exists()
        )

    def wait_up(condition: Callable[[], Any], what: str) -> Any:
        """Wait for `condition` (30 s at most), failing at once if the master exits."""
        value = wait_for(
            lambda: procs[0].poll() is not None or condition(), timeout=30, interval=0.05, what=what
        )
        if procs[0].poll() is not None:
            raise AssertionError(f"the master exited ({procs[0].returncode}):\n{logs()}")
        return value

    try:
        with open(root / "master.log", "wb") as log:
            argv = [str(BIN / "mgpu"), "master", "--host", vc.gateway_ip, "--port", str(port)]
            argv += ["--state-dir", str(state), "--config", str(config)]
            procs.append(vc.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=base_env))
        # The master serves TLS on a non-loopback address; agents join with the join
        # token, clients use the admin token (both name the CA they should trust).
        names = ("join-token", "admin-token")
        wait_up(lambda: all((state / f).exists() for f in names), "the master's tokens")
        join_token, admin_token = ((state / f).read_text().strip() for f in names)
        for node_id, host in hosts.items():
            with open(root / f"{node_id}.log", "wb") as log:
                argv = [str(BIN / "mgpu"), "node", "--node-id", node_id, "--token", join_token]
                argv += ["--master-host", vc.gateway_ip, "--master-port", str(port)]
                argv += ["--fake-gpus", str(GPUS_PER_NODE), "--state-dir", str(root / node_id)]
                procs.append(host.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=base_env))
        address = f"{vc.gateway_ip}:{port}"
        env = {**base_env, "MGPU_MASTER": address, "MGPU_TOKEN": admin_token}
        m = MultiNode(vc, hosts, address, root, env, admin_token)
        try:
            wait_up(lambda: all(m.node_ready(n) for n in NODES), "three nodes online")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{logs()}") from None
        yield m
        m.client().close()
    finally:
        for proc in reversed(procs):
            kill_group(proc)


# --------------------------------------------------------------------------- helpers


def submit(mn: MultiNode, *args: str) -> str:
    res = mn.cli("submit", *args)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def wait_running(mn: MultiNode, job_id: str, timeout: float = 20) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = mn.client().show(job_id)
        if job["state"] not in ("queued", "running"):
            raise AssertionError(f"job ended early: {job}")
        started = job["state"] == "running" and all(a["pid"] for a in job["allocation"])
        return job if started else None

    return wait_for(check, timeout=timeout, interval=0.05, what=f"job {job_id} running")


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --------------------------------------------------------------------------- tests


def test_nodes_report_their_own_hostname_and_ip(mn: MultiNode) -> None:
    nodes = mn.nodes()
    assert sorted(nodes) == sorted(NODES)
    for node_id, host in mn.hosts.items():
        node = nodes[node_id]
        assert node["state"] == "online"
        assert node["hostname"] == host.hostname, node
        assert node["ip"] == host.ip, node
        assert node["ip"] != mn.vc.gateway_ip
        assert len(node["gpus"]) == GPUS_PER_NODE
    assert len({n["ip"] for n in nodes.values()}) == 3


def test_pinned_placement_runs_on_that_host(mn: MultiNode) -> None:
    script = "hostname; hostname -I; echo $CUDA_VISIBLE_DEVICES"
    res = mn.cli(
        "srun", "--name", "pinned", "--node-gpu-ids", "node002:1,3", "--", "sh", "-c", script
    )
    assert res.returncode == 0, res.stderr
    host2 = mn.hosts["node002"]
    lines = res.stdout.splitlines()
    assert lines[0] == host2.hostname
    assert lines[1].split() == [host2.ip]
    assert lines[2] == "1,3"
    jobs = [j for j in mn.client().queue(all=True)["jobs"] if j["name"] == "pinned"]
    assert len(jobs) == 1
    job = mn.cli_json("show", jobs[0]["id"])
    assert job["state"] == "completed"
    (slot,) = job["allocation"]
    assert slot["node_id"] == "node002"
    assert slot["gpu_ids"] == [1, 3]
    assert slot["hostname"] == host2.hostname
    assert slot["ip"] == host2.ip
    assert isinstance(slot["pid"], int) and slot["pid"] > 0

    for opts in (["--nodelist", "node003"], ["--exclude", "node001,node002"]):
        res = mn.cli("srun", *opts, "--", "hostname")
        assert res.returncode == 0, res.stderr
        assert res.stdout == f"{mn.hosts['node003'].hostname}\n", opts


# Each rank announces itself in a shared directory, then waits (bounded) until every rank
# of the gang has: it can only succeed if all ranks really run at the same time.
GANG_RANK = textwrap.dedent(
    """
    d="$1"; n="$2"; started=$(date +%s.%N)
    touch "$d/rank-$NODE_RANK"
    i=0
    while [ "$(ls "$d" | grep -c '^rank-')" -lt "$n" ]; do
        i=$((i + 1)); [ "$i" -gt 600 ] && { echo "rank $NODE_RANK alone" >&2; exit 1; }
        sleep 0.05
    done
    echo "rank=$NODE_RANK host=$(hostname) nnodes=$NNODES t=$started"
    """
)


def test_gang_starts_on_all_nodes_together(mn: MultiNode, tmp_path: Path) -> None:
    argv = ["srun", "--name", "gang3", "--nodes", "3", "--gpus-per-node", "2"]
    res = mn.cli(*argv, "--", "sh", "-c", GANG_RANK, "gang", str(tmp_path), "3")
    assert res.returncode == 0, (res.stdout, res.stderr)
    line_re = re.compile(r"^\[(node00\d)\] rank=(\d) host=(\S+) nnodes=3 t=([\d.]+)$")
    matches = [line_re.match(line) for line in res.stdout.splitlines()]
    assert all(matches) and len(matches) == 3, res.stdout
    ranks = {(m[1], int(m[2]), m[3]) for m in matches if m}
    starts = [float(m[4]) for m in matches if m]
    assert max(starts) - min(starts) < 10, starts  # launched together, not one by one
    assert {r for _, r, _ in ranks} == {0, 1, 2}
    assert {n for n, _, _ in ranks} == set(NODES)
    # The prefix names the node the line really came from.
    assert all(h == mn.hosts[n].hostname for n, _, h in ranks)

    (job,) = [j for j in mn.client().queue(all=True)["jobs"] if j["name"] == "gang3"]
    assert job["state"] == "completed"
    alloc = job["allocation"]
    assert sorted(a["node_id"] for a in alloc) == sorted(NODES)
    assert all(len(a["gpu_ids"]) == 2 for a in alloc)
    assert [a["hostname"] for a in alloc] == [mn.hosts[a["node_id"]].hostname for a in alloc]
    # `mgpu logs` prefixes the same way.
    logs = mn.cli("logs", job["id"])
    assert sorted(logs.stdout.splitlines()) == sorted(res.stdout.splitlines())


def test_gang_that_cannot_fit_waits_without_holding_nodes(mn: MultiNode, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    blocker = submit(
        mn, "--node-gpu-ids", "node001:0,1", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    wait_running(mn, blocker)
    gangs = [
        submit(mn, "--name", f"big{i}", "--nodes", "3", "--gpus-per-node", "3", "sleep 0.5")
        for i in range(2)
    ]
    c = mn.client()

    def both_waiting() -> bool:
        jobs = [c.show(j) for j in gangs]
        assert all(j["state"] == "queued" for j in jobs), jobs
        return all(j["reason"] and j["reason"] != "waiting to be scheduled" for j in jobs)

    wait_for(both_waiting, timeout=30, what="gang jobs considered and waiting")
    # Scheduling passes come at least once a second: for longer than that, nothing
    # changes; in particular neither gang job holds part of its allocation.
    window_end = time.monotonic() + 1.5
    while time.monotonic() < window_end:
        busy = {
            (nid, g["index"]): g["busy_job"]
            for nid, n in mn.nodes().items()
            for g in n["gpus"]
            if g["busy_job"]
        }
        assert busy == {("node001", 0): blocker, ("node001", 1): blocker}
        jobs = [c.show(j) for j in gangs]
        assert [j["state"] for j in jobs] == ["queued", "queued"]
        assert all(j["allocation"] == [] for j in jobs), jobs
        assert "3 nodes" in jobs[0]["reason"], jobs[0]
    gate.touch()
    assert mn.wait_job(blocker)["state"] == "completed"
    first, second = (mn.wait_job(j, timeout=60) for j in gangs)
    assert first["state"] == second["state"] == "completed", (first, second)
    for job in (first, second):
        assert sorted(a["node_id"] for a in job["allocation"]) == sorted(NODES)
        assert all(len(a["gpu_ids"]) == 3 for a in job["allocation"])
    # 3x3 twice does not fit in 3x4: they ran one after the other, in submit order.
    assert first["end_time"] <= second["start_time"]


def test_bad_exit_of_one_rank_kills_the_others(mn: MultiNode, tmp_path: Path) -> None:
    # Rank 0 records its pids and sleeps; rank 1 waits for that record, then exits 3.
    pids = tmp_path / "rank0.pids"
    script = textwrap.dedent(
        f"""
        if [ "$NODE_RANK" = 0 ]; then
            sleep 300 & echo "$$ $!" > {pids}.tmp && mv {pids}.tmp {pids}
            wait
        else
            i=0
            while [ ! -e {pids} ]; do
                i=$((i + 1)); [ "$i" -gt 600 ] && exit 99
                sleep 0.05
            done
            exit 3
        fi
        """
    )
    job_id = submit(mn, "--nodes", "2", "--gpus-per-node", "1", "--distributed", script)
    t0 = time.monotonic()
    job = mn.wait_job(job_id, timeout=30)
    elapsed = time.monotonic() - t0
    assert job["state"] == "failed", job
    assert job["exit_code"] == 3, job
    rank1_node = job["allocation"][1]["node_id"]
    assert job["reason"] == f"exit code 3 on {rank1_node}", job
    # Promptly: rank 0 was killed, not waited for (its sleep is 300 s; kill grace 3 s).
    assert elapsed < 20, elapsed
    shell_pid, sleep_pid = map(int, pids.read_text().split())
    wait_for(
        lambda: not pid_alive(shell_pid) and not pid_alive(sleep_pid),
        timeout=10,
        what="rank 0's processes gone",
    )


TRAIN = textwrap.dedent(
    """
    import os, socket
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 4) * (rank + 1)).pow(2).mean()
    loss.backward()
    opt.step()
    # DDP averaged the gradients: every rank holds the same parameters after the step.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    assert all(torch.equal(c, flat) for c in copies), "replicas diverged"
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    # One write() per line: ranks share the job's stdout, and print() may split a line.
    line = f"RESULT rank={rank} sum={t.item():g} world={world} host={socket.gethostname()}\\n"
    os.write(1, line.encode())
    # Every rank done with the group before any tears it down: a rank whose peer already
    # destroyed it can fail on the way out (CI once saw the job fail after all four
    # RESULT lines, node002's torchrun killed as a failed job's other rank).
    dist.barrier()
    dist.destroy_process_group()
    # Out without the interpreter's teardown: torch's C++ threads have aborted a rank there
    # once after all of the above ("terminate called without an active exception", exit
    # -6), a torch race at exit, not a failed rendezvous or collective.
    os._exit(0)
    """
)


def test_torchrun_ddp_across_two_nodes(mn: MultiNode, tmp_path: Path) -> None:
    """A bare `torchrun train.py` (no flags) joins the right rendezvous from the PET_*
    variables mgpu sets: torchrun's default rendezvous is `static`, on
    PET_MASTER_ADDR:PET_MASTER_PORT (rank 0's namespace, the port its agent reserved),
    with PET_NNODES/PET_NODE_RANK/PET_NPROC_PER_NODE. No GLOO_SOCKET_IFNAME is needed
    here because each host's name resolves (/etc/hosts) to its eth0 address; on machines
    whose hostname maps to 127.0.1.1 (Debian's default) gloo would need it."""
    torchrun = BIN / "torchrun"
    if importlib.util.find_spec("torch") is None or not torchrun.exists():
        pytest.skip("torch (with torchrun) is not installed next to this Python")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    res = mn.cli(
        "srun",
        "--name",
        "ddp",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--distributed",
        "--",
        str(torchrun),
        str(script),
        timeout=240,
        OMP_NUM_THREADS="1",
    )
    if res.returncode != 0:  # the whole output (an assertion's repr of it is cut short)
        pytest.fail(f"srun exited {res.returncode}\n{res.stdout}\n--- stderr:\n{res.stderr}")
    results = re.findall(r"RESULT rank=(\d) sum=(\S+) world=(\d) host=(\S+)", res.stdout)
    assert sorted(int(r) for r, _, _, _ in results) == [0, 1, 2, 3], res.stdout
    assert {(s, w) for _, s, w, _ in results} == {("10", "4")}
    hosts = {h for _, _, _, h in results}
    assert len(hosts) == 2 and hosts <= {h.hostname for h in mn.hosts.values()}


MPI_PROGRAM = (
    "from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
    "print('RANK', c.Get_rank(), socket.gethostname(), c.allreduce(c.Get_rank() + 1), flush=True)"
)


def run_mpirun(mn: MultiNode) -> None:
    """`mgpu srun --mpi -- [PREFIX...] mpirun -np 2 python -c MPI_PROGRAM` on two nodes.

    No MCA parameters are needed with Open MPI 4.1 here: mpirun reads the hostfile
    mgpu writes (`gpu00X slots=1`, names every namespace resolves via /etc/hosts),
    starts the remote orted through OMPI_MCA_plm_rsh_agent=`python -m mgpu rsh`, and
    both oob/tcp and btl/tcp pick eth0 by themselves (loopback is excluded by default;
    it is each namespace's only other interface). Only root needs the two
    OMPI_ALLOW_RUN_AS_ROOT* variables, which srun passes on from its environment."""
    mpirun = shutil.which("mpirun")
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpirun (Open MPI) and mpi4py are needed")
    argv = ["srun", "--name", "mpi", "--nodes", "2", "--gpus-per-node", "1", "--mpi", "--"]
    argv += [mpirun, "-np", "2", sys.executable, "-c", MPI_PROGRAM]
    root_ok = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    res = mn.cli(*argv, timeout=120, **root_ok)
    assert res.returncode == 0, (res.stdout, res.stderr)
    # mpirun on rank 0's node relays every rank's output, so all lines carry its prefix.
    ranks = re.findall(r"^(?:\[node00\d\] )?RANK (\d) (\S+) (\d+)$", res.stdout, re.M)
    assert sorted(int(r) for r, _, _ in ranks) == [0, 1], res.stdout
    assert {total for _, _, total in ranks} == {"3"}, res.stdout
    hosts = [h for _, h, _ in ranks]
    assert len(set(hosts)) == 2, res.stdout
    assert set(hosts) <= {h.hostname for h in mn.hosts.values()}, res.stdout


def test_mpirun_across_two_nodes(mn: MultiNode) -> None:
    """A bare mpirun: the job's own credential ($MGPU_TOKEN, set by the master for this
    run) lets `mgpu rsh` start the remote daemons through the master."""
    run_mpirun(mn)


def test_partition_requeues_and_kills_the_stale_copy(mn: MultiNode, tmp_path: Path) -> None:
    """Issue 4.5: a node cut off from the master.

    Shorter than the heartbeat timeout: nothing happens. Longer: the node is declared
    lost and its job requeued elsewhere; when the network heals the node rejoins and
    the copy it still ran is killed, so the job completes once, from its second attempt.
    (While the partition lasts the master cannot stop that copy: agents do not fence
    themselves, so both copies run then; the master's attempts never overlap.)"""
    c = mn.client()
    host3 = mn.hosts["node003"]
    holder_gate, gate, log = tmp_path / "holder-gate", tmp_path / "gate", tmp_path / "attempts"
    # Fill node002 so that the job lands on node003 first.
    holder = submit(
        mn,
        "--node-gpu-ids",
        "node002:0,1,2,3",
        f"while [ ! -e {holder_gate} ]; do sleep 0.05; done",
    )
    wait_running(mn, holder)
    script = (
        f'echo "start $MGPU_NODE_ID $$" >> {log}; '
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        f'echo "done $MGPU_NODE_ID $$" >> {log}'
    )
    job_id = submit(
        mn, "--name", "partition", "--retries", "1", "--nodelist", "node002,node003", script
    )
    first = wait_running(mn, job_id)
    assert [a["node_id"] for a in first["allocation"]] == ["node003"]
    holder_gate.touch()
    assert mn.wait_job(holder)["state"] == "completed"
    # The copy on node003: the agent's shim and the job's shell under it.
    shim_pid = first["allocation"][0]["pid"]
    line = wait_for(lambda: log.exists() and log.read_text().strip(), what="first start")
    assert line.split()[:2] == ["start", "node003"], line
    stale_pids = [shim_pid, int(line.split()[2])]

    # 1. A cut shorter than the heartbeat timeout changes nothing.
    host3.cut_link()
    try:
        window_end = time.monotonic() + HEARTBEAT_TIMEOUT / 3
        while time.monotonic() < window_end:
            node = mn.nodes()["node003"]
            assert node["state"] == "online", node
    finally:
        host3.restore_link()
    restored = time.time()
    # Heard from again (TCP retransmits what queued during the cut) and still online.
    wait_for(
        lambda: mn.nodes()["node003"]["last_seen"] > restored + HEARTBEAT_INTERVAL,
        timeout=10,
        what="node003 heard from again",
    )
    assert mn.nodes()["node003"]["state"] == "online"
    job = c.show(job_id)
    assert job["state"] == "running" and job["retries"] == 0 and len(job["attempts"]) == 1, job
    assert all(pid_alive(p) for p in stale_pids)

    # 2. A cut longer than the timeout: node003 is lost, the job runs again on node002.
    host3.cut_link()
    try:
        wait_for(
            lambda: mn.nodes()["node003"]["state"] == "offline",
            timeout=HEARTBEAT_TIMEOUT + 10,
            what="node003 offline",
        )
        second = wait_running(mn, job_id)
        assert [a["node_id"] for a in second["allocation"]] == ["node002"]
        assert second["retries"] == 1
        assert "node003" in second["attempts"][0]["end_reason"], second
    finally:
        host3.restore_link()

    # 3. The network heals: node003 rejoins and the copy it kept running is killed.
    try:
        wait_for(lambda: mn.node_ready("node003"), timeout=20, what="node003 back online")
        wait_for(
            lambda: not any(pid_alive(p) for p in stale_pids), timeout=15, what="stale copy gone"
        )
    except AssertionError as e:
        raise AssertionError(
            f"{e}\n{mn.log('master')[-2000:]}\n{mn.log('node003')[-2000:]}"
        ) from None
    assert not any(g["busy_job"] for g in mn.nodes()["node003"]["gpus"])
    job = c.show(job_id)
    assert job["state"] == "running", (job["reason"], job["attempts"], log.read_text())
    gate.touch()
    job = mn.wait_job(job_id, timeout=30)
    assert job["state"] == "completed", job
    assert job["retries"] == 1
    a1, a2 = job["attempts"]
    assert a1["nodes"] == ["node003"] and a2["nodes"] == ["node002"]
    assert a1["start_time"] < a1["end_time"] <= a2["start_time"] < a2["end_time"]
    runs = [line.split()[:2] for line in log.read_text().splitlines()]
    assert runs == [["start", "node003"], ["start", "node002"], ["done", "node002"]], runs


FIRST_HOST = (
    "first=$(python3 -c 'import sys; from mgpu.hostlist import expand; "
    'print(expand(sys.argv[1])[0])\' "$SLURM_JOB_NODELIST"); '
    'echo "$SLURM_NODEID $SLURMD_NODENAME $first $(getent hosts "$first" | cut -d" " -f1)"'
)


def test_slurm_nodelist_names_hosts_every_node_resolves(mn: MultiNode) -> None:
    """`MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)`: the first
    name of the list reaches the first node from every node (its hostname, in /etc/hosts)."""
    python = str(Path(sys.executable).parent)
    job = mn.client().submit(
        FIRST_HOST,
        nodes=2,
        gpus_per_node=1,
        env={"PATH": f"{python}:/usr/bin:/bin"},
        slurm={"job_name_default": "resolve"},
    )
    done = mn.wait_job(job.id)
    assert done["state"] == "completed", done
    first = done["allocation"][0]
    lines = sorted(mn.client().logs(job.id).splitlines())
    by_rank = [line.split() for line in lines]
    assert [r[0] for r in by_rank] == ["0", "1"]
    hostnames = [a["hostname"] for a in done["allocation"]]
    assert [r[1] for r in by_rank] == hostnames  # SLURMD_NODENAME: each its own
    assert all(r[2] == first["hostname"] and r[3] == first["ip"] for r in by_rank), lines
