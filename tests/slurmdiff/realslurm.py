"""A real Slurm 22.05 (Debian's slurm-wlm) beside mgpu, for the differential tier.

Everything runs from one temp dir with its own configuration: munged (its own key and
socket), MariaDB + slurmdbd (so that `sacct` has an accounting store; without them the
cluster still runs and only the sacct comparisons skip), slurmctld and one slurmd per
node.  The nodes are `node001`, `node002`, ... like mgpu's test agents, each a slurmd of
its own on this host (`-N NAME`, a port each), with fake GPUs: gres.conf `File=` entries
naming character devices this harness makes.  Every daemon runs in the foreground in a
session of its own and is stopped by its process group; a job's processes are found by
the `SLURM_CONF` of this cluster in their environment (never by name).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from helpers import free_port, kill_group

CLUSTER = "mgpu"
"""mgpu's SLURM_CLUSTER_NAME, so that the two clusters' names compare equal."""
PARTITION = "main"
"""mgpu's partition when the config names none."""

CPUS = 8
MEMORY_MB = 4000
"""Each node's CPUs and memory (mgpu's agents are given the same: --fake-cpus, --fake-mem);
the tier's machine may have fewer: nothing binds tasks to CPUs (TaskPlugin=task/none)."""

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sacct")


def unavailable() -> str | None:
    """Why no Slurm can be started here (None: it can)."""
    if os.geteuid() != 0:
        return "the Slurm daemons run as root (the tier's agents do too)"
    missing = [
        d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()
    ]
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}; "
            "scripts/install-system-deps.sh installs slurm-wlm)"
        )
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _accounting_available() -> bool:
    return all(
        shutil.which(n) or Path(f"/usr/sbin/{n}").exists()
        for n in ("slurmdbd", "mariadbd", "mariadb-install-db")
    )


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class RealSlurm:
    """A started Slurm cluster; `run(...)` runs its client commands."""

    def __init__(self, root: Path, nodes: int = 2, gpus: int = 4) -> None:
        self.root = root
        self.nodes = [f"node{i:03d}" for i in range(1, nodes + 1)]
        self.gpus = gpus
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for key in list(self.env):  # the suite's own environment must not steer Slurm
            if (
                key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SQUEUE_", "SACCT_", "SINFO_"))
                and key != "SLURM_CONF"
            ):
                del self.env[key]
        self.accounting = _accounting_available()
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    # -- configuration ------------------------------------------------------------------

    def _write_config(self) -> None:
        r = self.root
        r.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "dev", "log", "db"):
            (r / sub).mkdir(exist_ok=True)
        for node in self.nodes:
            (r / "spool" / node).mkdir(parents=True, exist_ok=True)
            for i in range(self.gpus):
                dev = r / "dev" / node / f"nvidia{i}"
                dev.parent.mkdir(exist_ok=True)
                if not dev.exists():
                    try:  # the NVIDIA major number: slurmd reads the device's numbers
                        os.mknod(dev, 0o600 | 0o020000, os.makedev(195, i))
                    except OSError:
                        dev.touch()
        self.ctld_port, self.dbd_port, self.db_port = free_port(), free_port(), free_port()
        self.munge_socket = r / "munge.sock"
        node_lines = [
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
            f"CPUs={CPUS} RealMemory={MEMORY_MB} Gres=gpu:{self.gpus} State=UNKNOWN"
            for n in self.nodes
        ]
        accounting = (
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.dbd_port}",
                f"AccountingStoragePass={self.munge_socket}",
                "AccountingStorageTRES=gres/gpu",
            ]
            if self.accounting
            else ["AccountingStorageType=accounting_storage/none"]
        )
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={CLUSTER}",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "CredType=cred/munge",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool/%n",
                    f"SlurmctldPidFile={r}/slurmctld.pid",
                    f"SlurmdPidFile={r}/spool/%n/slurmd.pid",
                    f"SlurmctldLogFile={r}/log/slurmctld.log",
                    f"SlurmdLogFile={r}/log/slurmd-%n.log",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    # CPUs and memory scheduled, as mgpu's; no DefMemPer*: Slurm's
                    # defaults (a job that asks no memory holds the node's).
                    "SelectTypeParameters=CR_Core_Memory",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "JobAcctGatherType=jobacct_gather/none",
                    "SchedulerType=sched/builtin",
                    # A pending job's reason is set by the next scheduling pass: soon.
                    "SchedulerParameters=sched_interval=2",
                    # A job's end reaches the accounting store within a second.
                    "MinJobAge=300",
                    "MailProg=/bin/true",
                    *accounting,
                    *node_lines,
                    f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )
        (r / "gres.conf").write_text(
            "".join(
                f"NodeName={n} Name=gpu File={r}/dev/{n}/nvidia[0-{self.gpus - 1}]\n"
                for n in self.nodes
            )
        )
        dbd = r / "slurmdbd.conf"
        dbd.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.dbd_port}",
                    "SlurmUser=root",
                    f"PidFile={r}/slurmdbd.pid",
                    f"LogFile={r}/log/slurmdbd.log",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.db_port}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )
        dbd.chmod(0o600)  # slurmdbd refuses a readable config

    # -- processes ----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
                cwd=self.root,
            )
        self._procs.append((name, proc))
        return proc

    def _alive(self, name: str) -> None:
        for n, proc in self._procs:
            if n == name and proc.poll() is not None:
                log = (self.root / "log" / f"{name}.out").read_text(errors="replace")
                raise RuntimeError(f"{name} exited ({proc.returncode}): {log[-600:]}")

    def start(self) -> RealSlurm:
        self._write_config()
        r = self.root
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                _which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={key}", f"--pid-file={r}/munged.pid",
                f"--log-file={r}/log/munged.log", f"--seed-file={r}/munged.seed",
            ],
        )  # fmt: skip
        wait_until(self.munge_socket.exists, 30, "munged's socket")
        if self.accounting:
            self._start_accounting()
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._spawn(
                f"slurmd-{node}", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", node]
            )

        def idle() -> bool:
            for name, _ in self._procs:
                self._alive(name)
            res = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in self.nodes)

        wait_until(idle, 90, "Slurm's nodes idle", interval=0.3)
        return self

    def _start_accounting(self) -> None:
        r = self.root
        init = subprocess.run(
            [
                _which("mariadb-install-db"), "--no-defaults", f"--datadir={r}/db", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db",
            ],
            capture_output=True, text=True, timeout=120, cwd=r,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {init.stderr[-600:]}")
        self._spawn(
            "mariadbd",
            [
                _which("mariadbd"), "--no-defaults", f"--datadir={r}/db",
                f"--socket={r}/mysql.sock",
                f"--port={self.db_port}", "--bind-address=127.0.0.1", "--user=root",
                f"--pid-file={r}/mysql.pid", f"--log-error={r}/log/mysql.err", "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
            ],
        )  # fmt: skip
        wait_until(lambda: (r / "mysql.sock").exists() or self._alive("mariadbd"), 60, "MariaDB")
        self._spawn("slurmdbd", [_which("slurmdbd"), "-D"])

        def started() -> bool:
            self._alive("slurmdbd")
            log = r / "log" / "slurmdbd.log"
            return log.exists() and "started" in log.read_text(errors="replace")

        wait_until(started, 60, "slurmdbd", interval=0.2)

    def run(
        self,
        *argv: str,
        cwd: Path | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=120, cwd=cwd or self.root,
            env={**self.env, **(env or {})}, input=input,
        )  # fmt: skip
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr}")
        return res

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "-u", "root", check=False)
            wait_until(
                lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 20, "no job left"
            )
        for _, proc in reversed(self._procs):
            kill_group(proc)
        self._kill_jobs()

    def _kill_jobs(self) -> None:
        """A job's processes that outlived the cluster: found by this cluster's SLURM_CONF
        in their environment (slurmstepd inherits slurmd's, a task its submitter's)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if mark in environ.split(b"\0"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)


@contextlib.contextmanager
def real_slurm(root: Path, nodes: int = 2, gpus: int = 4) -> Iterator[RealSlurm]:
    cluster = RealSlurm(root, nodes, gpus)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
