"""What another account on the machine, another token holder, or a shared Client can reach.

Secrets stay the master's (a private state dir whatever the umask, job credentials stored
only as hashes, no token in any log); uid 0 only for the owner's token or an explicit
grant; a job's output only for its owner; one Client shared by threads; one line, never a
traceback, for a TLS master that is down or silent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from argparse import Namespace
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster, free_port, local_cluster, wait_for
from mgpu import Client, MgpuError
from mgpu.deploy import master_unit, node_unit

# Real accounts of every Debian system stand in for people (a root agent runs each job as
# its owner, so the owner must exist on the node).
ALICE, BOB = "daemon", "bin"
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-traversable dir, as /var/lib is (pytest's own tmp dirs are private to root,
    which would hide an open state dir from the other account)."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-perm-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30)


def assert_private(state: Path) -> None:
    """Another account can neither list the state dir nor read a file in it, and every dir
    in it is 0700 and every file 0600 (so a later chmod of the top alone exposes nothing)."""
    assert state.stat().st_mode & 0o777 == 0o700
    assert as_nobody("ls", str(state)).returncode != 0
    entries = [p for p in state.rglob("*") if not p.is_symlink()]
    assert len(entries) > 5, entries
    for path in entries:
        try:
            mode = path.lstat().st_mode & 0o777
        except FileNotFoundError:
            continue  # a spool file the agent removed meanwhile
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {mode:o}"
        if path.is_file():
            assert as_nobody("cat", str(path)).returncode != 0, path


def secret_of(token: str) -> str:
    return token.strip().split(".")[0]


def with_umask(umask: str, argv: list[str]) -> list[str]:
    return ["sh", "-c", f'umask {umask} && exec "$@"', "sh", *argv]


# ---- the state dir ------------------------------------------------------------------------


@needs_root
def test_master_state_dir_is_private_whatever_the_umask(shared_dir: Path) -> None:
    cluster = LocalCluster(shared_dir)
    state = cluster.state_dir
    # What an older version left behind: an open state dir with an open file in it.
    (state / "output").mkdir(parents=True)
    state.chmod(0o755)
    (state / "output").chmod(0o755)
    (state / "output" / "old.jsonl").write_text("{}\n")
    (state / "output" / "old.jsonl").chmod(0o644)
    argv = [str(BIN / "mgpu"), "master", "--port", str(cluster.port)]
    argv += ["--state-dir", str(state)]
    log = shared_dir / "master.log"
    cluster.master = cluster._spawn(with_umask("000", argv), log)
    try:
        wait_for(cluster._load_tokens, what="the master's tokens")
        wait_for(lambda: cluster.client().nodes() is not None, what="the master")
        cluster.start_agent("node001", gpus=1)
        admin = cluster.client()
        alice = Client(cluster.address, token=admin.create_token(ALICE)["token"])
        job = alice.submit('echo "$MGPU_TOKEN"; exec sleep 300', gpus=0, env={"X": "y"})
        credential = wait_for(lambda: admin.logs(job.id).strip(), what="the job's credential")
        assert credential.startswith("mgpujob_")
        assert Client(cluster.address, token=credential).whoami()["user"] == ALICE  # live
        # The credential is stored only as a hash: not in the database, nor its WAL.
        for name in ("mgpu.db", "mgpu.db-wal"):
            if (state / name).exists():
                assert secret_of(credential).encode() not in (state / name).read_bytes()
        assert_private(state)
        # No token reaches the log; it names the file the join token is in instead.
        text = log.read_text()
        assert str(state / "join-token") in text
        for token in (cluster.admin_token, cluster.join_token, credential):
            assert secret_of(token) not in text
        admin.cancel(job.id)
    finally:
        cluster.stop()


@needs_root
def test_mgpu_up_keeps_its_state_and_logs_private(shared_dir: Path) -> None:
    port = free_port()
    state = shared_dir / "state"
    env = {**os.environ, "MGPU_MASTER": f"127.0.0.1:{port}", "MGPU_STATE_DIR": str(state)}
    env.pop("MGPU_TOKEN", None)

    def mgpu(*args: str, umask: str = "022") -> subprocess.CompletedProcess[str]:
        argv = with_umask(umask, [str(BIN / "mgpu"), *args])
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90)

    try:
        up = mgpu(
            "up", "--port", str(port), "--fake-gpus", "1", "--state-dir", str(state), umask="000"
        )
        assert up.returncode == 0, up.stderr
        assert mgpu("srun", "--", "echo", "from-up").stdout == "from-up\n"
        assert_private(state)
        for name in ("master.log", "node001.log"):
            text = (state / name).read_text()
            for token_file in ("admin-token", "join-token"):
                assert secret_of((state / token_file).read_text()) not in text
    finally:
        down = mgpu("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr


@needs_root
def test_agent_files_are_private_whatever_the_umask_and_jobs_get_022(shared_dir: Path) -> None:
    """The agent's spool holds jobs' output and, in side files, an epilog's environment:
    0600 even when its caller's umask is 000.  Its jobs and site scripts do not inherit
    that 0077: they get 0022, as at a login."""
    epilog = shared_dir / "epilog.sh"
    epilog.write_text(f"#!/bin/sh\ntouch {shared_dir}/from-epilog\n")
    epilog.chmod(0o755)
    cluster = LocalCluster(shared_dir, config=f"site: {{epilog: {epilog}}}\n")
    try:
        cluster.start_master()
        argv = [str(BIN / "mgpu"), "node", "--node-id", "node001", "--fake-gpus", "1"]
        argv += ["--master-port", str(cluster.port), "--state-dir", str(shared_dir / "agent")]
        agent = cluster._spawn(with_umask("000", argv), shared_dir / "node001.log")
        cluster.agents["node001"] = agent
        cluster.wait_node("node001", "online")
        go = shared_dir / "go"
        job = cluster.client().submit(
            f"umask; touch {shared_dir}/from-job; while [ ! -e {go} ]; do sleep 0.05; done",
            gpus=1,
        )
        spool = shared_dir / "agent" / "node-node001" / "spool"
        wait_for(lambda: list(spool.glob(f"{job.id}.*.site.json")), what="the epilog's side file")
        wait_for(lambda: (shared_dir / "from-job").exists(), what="the job's file")
        assert_private(shared_dir / "agent")
        go.touch()
        assert cluster.client().wait(job.id, timeout=30)["state"] == "completed"
        assert cluster.client().logs(job.id) == "0022\n"
        assert (shared_dir / "from-job").stat().st_mode & 0o777 == 0o644
        assert (shared_dir / "from-epilog").stat().st_mode & 0o777 == 0o644
    finally:
        cluster.stop()


def test_systemd_units_keep_state_private() -> None:
    args = Namespace(
        host="0.0.0.0",
        port=8080,
        config=None,
        tls=False,
        insecure=False,
        verbose=False,
        node_id="gpu01",
        master_host="10.0.0.5",
        master_port=8080,
        advertise_ip=None,
        fake_gpus=None,
        join_token=None,
    )
    master = master_unit(args, Path("/var/lib/mgpu"))
    for line in ("UMask=0077", "StateDirectory=mgpu", "StateDirectoryMode=0700"):
        assert f"\n{line}\n" in master
    node = node_unit(args, Path("/var/lib/mgpu-node"))
    for line in ("UMask=0077", "StateDirectory=mgpu-node", "StateDirectoryMode=0700"):
        assert f"\n{line}\n" in node
    # The jobs' cgroups under the agent's are the agent's to manage, not systemd's.
    assert "\nDelegate=yes\n" in node and "\nKillMode=process\n" in node
    assert "--gpu-device-dir" not in node
    args.gpu_device_dir = "/run/gpus"
    assert " --gpu-device-dir /run/gpus " in node_unit(args, Path("/var/lib/mgpu-node"))
    # Not under /var/lib: systemd cannot manage the dir (mgpu makes it 0700 itself).
    elsewhere = master_unit(args, Path("/srv/mgpu"))
    assert "\nUMask=0077\n" in elsewhere and "\nStateDirectory=" not in elsewhere


def test_job_credentials_survive_a_master_restart_as_hashes(cluster: LocalCluster) -> None:
    """Only hashes are stored, so after a restart the master cannot hand the job's first
    credential to a new step: the step gets a fresh one, and both stay valid."""
    admin = cluster.client()
    job = admin.submit('echo "$MGPU_TOKEN"; exec sleep 300', gpus=0)
    first = wait_for(lambda: admin.logs(job.id).strip(), what="the job's credential")
    node = admin.show(job.id)["allocation"][0]["node_id"]
    assert cluster.master is not None
    cluster.master.send_signal(signal.SIGKILL)
    cluster.master.wait(timeout=10)
    cluster.start_master()
    cluster.wait_node(node, "online", timeout=30)
    step = admin.start_step(job.id, node, ['echo "$MGPU_TOKEN"'])
    second = "".join(r.get("d", "") for r in admin.step_stream(step)).strip()
    assert second.startswith(f"mgpujob_{job.id}_") and second != first
    for token in (first, second):
        assert Client(cluster.address, token=token).whoami()["user"] == admin.whoami()["user"]
        for name in ("mgpu.db", "mgpu.db-wal"):
            path = cluster.state_dir / name
            assert not path.exists() or secret_of(token).encode() not in path.read_bytes()
    admin.cancel(job.id)
    admin.wait(job.id, timeout=30)
    with pytest.raises(MgpuError, match="unknown or revoked token"):
        Client(cluster.address, token=second).whoami()  # the run's credentials die with it


# ---- root ---------------------------------------------------------------------------------


def uid_of(client: Client, job_id: str) -> str:
    done = client.wait(job_id, timeout=30)
    assert done["state"] == "completed", (done, client.logs(job_id))
    return client.logs(job_id).strip()


def refused(call: Callable[[], object], match: str) -> str:
    with pytest.raises(MgpuError, match=match) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message.startswith("not authorised: ")
    return message


@needs_root
def test_only_the_owner_runs_root_jobs(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=1, gpus=1) as cluster:
        owner = cluster.client()
        assert uid_of(owner, owner.submit("id -u", gpus=0).id) == "0"
        # A job's own credential carries its job's grant: the owner's job submits as root...
        inner = owner.submit(f"{BIN / 'mgpu'} submit --json --gpus 0 'id -u'", gpus=0)
        assert uid_of(owner, json.loads(uid_of(owner, inner.id))["job_id"]) == "0"

        # ...a token named after the master's account is not handed out, by CLI or API...
        res = cluster.cli("token", "create", "root")
        assert res.returncode != 0 and res.stderr.count("\n") == 1
        why = "not authorised: root is the master's own account: a token for it needs"
        assert res.stderr.startswith(f"mgpu: error: {why} --allow-root (owner only)")
        refused(lambda: owner.create_token("root", admin=True), why)
        # ...another admin may not submit as it...
        other = Client(cluster.address, token=owner.create_token(ALICE, admin=True)["token"])
        refused(lambda: other.submit("id -u", user="root", gpus=0), "only the owner's")
        # ...nor grant root; and the owner's grants are off while the config says so.
        refused(lambda: other.create_token(BOB, allow_root=True), "only the owner's")
        with pytest.raises(MgpuError, match=r"security\.allow_root_jobs: true"):
            owner.create_token(BOB, allow_root=True)
        # A token named root from an older version (before the rule) runs nothing.
        from mgpu.master.security.auth import TokenStore
        from mgpu.master.store.sqlite import SqliteStore

        db = SqliteStore(cluster.state_dir / "mgpu.db")

        fingerprint = cluster.admin_token.split(".")[1]
        _, legacy = TokenStore(db, cluster.state_dir, fingerprint).create("root", admin=False)
        db.close()
        old = Client(cluster.address, token=legacy)
        assert old.whoami() == {"user": "root", "admin": False}
        refused(lambda: old.submit("id -u", gpus=0), "root is the master's own account: only")
        # A user's job credential acts as that user: no root.
        alice = Client(cluster.address, token=owner.create_token(ALICE)["token"])
        job = alice.submit('echo "$MGPU_TOKEN"; exec sleep 300', gpus=0)
        credential = wait_for(lambda: owner.logs(job.id).strip(), what="the job's credential")
        from_job = Client(cluster.address, token=credential)
        assert from_job.whoami() == {"user": ALICE, "admin": False}
        refused(lambda: from_job.submit("id -u", user="root", gpus=0), "may not submit as root")
        owner.cancel(job.id)
        owner.wait(job.id, timeout=30)
        denied = [e for e in owner.audit() if e["kind"] == "denied"]
        assert len(denied) == 6  # every refusal above but the 400 (grants off)
        assert owner.queue()["jobs"] == []  # nothing of the refused attempts was queued


@needs_root
def test_explicit_root_grant_is_owner_only_and_audited(tmp_path: Path) -> None:
    with local_cluster(
        tmp_path, agents=1, gpus=1, config="security: {allow_root_jobs: true}\n"
    ) as cluster:
        owner = cluster.client()
        other = Client(cluster.address, token=owner.create_token(ALICE, admin=True)["token"])
        refused(lambda: other.create_token("root", allow_root=True), "only the owner's")
        made = json.loads(
            cluster.cli("token", "create", "root", "--allow-root", "--json", check=True).stdout
        )
        granted = Client(cluster.address, token=made["token"])
        assert uid_of(owner, granted.submit("id -u", gpus=0).id) == "0"
        event = next(e for e in owner.audit() if e["kind"] == "token_create")  # newest first
        assert event["target"] == "root" and "allow-root" in event["detail"]
        listed = {(t["owner"], t["allow_root"]) for t in owner.tokens() if t["user"] == "root"}
        assert listed == {(True, True), (False, True)}  # the admin-token, the grant
        # The grant does not make a plain token an admin, nor let it act for others.
        refused(lambda: granted.submit("id -u", user=BOB, gpus=0), "may not submit as")


# ---- output -------------------------------------------------------------------------------


def test_output_and_steps_are_their_owners(cluster: LocalCluster) -> None:
    admin = cluster.client()
    alice = Client(cluster.address, token=admin.create_token(ALICE)["token"])
    bob_token = admin.create_token(BOB)["token"]
    bob = Client(cluster.address, token=bob_token)
    job = alice.submit("echo alice-secret; exec sleep 300", gpus=0, env={"KEY": "hidden-v"})
    wait_for(lambda: "alice-secret" in alice.logs(job.id), what="alice's output")
    assert admin.logs(job.id) == alice.logs(job.id) == "alice-secret\n"
    why = f"not authorised: job {job.id} belongs to {ALICE}"
    assert refused(lambda: bob.logs(job.id), why) == why
    refused(lambda: next(bob.stream(job.id, follow=True)), why)
    res = cluster.cli("--token", bob_token, "logs", job.id)
    assert res.returncode != 0 and res.stderr == f"mgpu: error: {why}\n"

    node = admin.show(job.id)["allocation"][0]["node_id"]
    step = alice.start_step(job.id, node, ["echo", "step-out"])
    records = list(alice.step_stream(step))
    assert "step-out\n" in "".join(r.get("d", "") for r in records) and records[-1]["end"]
    refused(lambda: next(bob.step_stream(step)), why)
    refused(lambda: bob.start_step(job.id, node, ["true"]), why)

    # Everyone sees the job, as squeue shows everyone's; nobody else sees its environment.
    seen = json.dumps([bob.show(job.id), bob.queue()])
    assert job.id in seen and "hidden-v" not in seen and "mgpujob_" not in seen
    denied = [e for e in admin.audit() if e["kind"] == "denied" and e["actor"] == BOB]
    assert len(denied) >= 4 and any("output" in e["target"] for e in denied)
    admin.cancel(job.id)


# ---- the client ---------------------------------------------------------------------------


def test_one_client_shared_by_threads(cluster: LocalCluster) -> None:
    client = cluster.client()
    job = client.submit("true", gpus=0)
    client.wait(job.id, timeout=30)  # ended and stored: `queue --all` counts it once from now on
    errors: list[BaseException] = []
    answers: list[tuple[str, str]] = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        try:
            start.wait(timeout=30)
            for i in range(60):
                if i % 3 == 0:
                    answers.append(("show", client.show(job.id)["id"]))
                elif i % 3 == 1:
                    answers.append(("whoami", client.whoami()["user"]))
                else:
                    answers.append(("queue", str(len(client.queue(all=True)["jobs"]))))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(answers) == 8 * 60
    assert answers.count(("show", job.id)) == 8 * 20 and answers.count(("queue", "1")) == 8 * 20
    client.close()
    assert client.whoami()["admin"] is True  # usable after close: it reconnects


class _Server:
    """A TCP port that misbehaves: closed, silent (accepts, never answers), reset (accepts
    and resets), garbage (answers something that is neither TLS nor HTTP)."""

    def __init__(self, how: str) -> None:
        self.sock: socket.socket | None = None
        self.port = free_port()
        self.how = how
        self.conns: list[socket.socket] = []
        if how == "closed":
            return
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.how == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                conn.close()
            elif self.how == "garbage":
                conn.sendall(b"hello, this is not a master\r\n\r\n")

    def close(self) -> None:
        for s in [*self.conns, *([self.sock] if self.sock else [])]:
            s.close()


@pytest.mark.parametrize("how", ["closed", "silent", "reset", "garbage"])
def test_tls_master_down_or_silent_is_one_sentence(how: str, tmp_path: Path) -> None:
    server = _Server(how)
    token = "mgpu_x." + "ab" * 32  # names a CA nobody has cached: the client must fetch it
    env = {**os.environ, "MGPU_TOKEN": token, "XDG_CACHE_HOME": str(tmp_path)}
    try:
        client = Client(f"https://127.0.0.1:{server.port}", token=token, connect_timeout=1)
        t0 = time.monotonic()
        with pytest.raises(MgpuError) as info:
            client.queue()
        assert time.monotonic() - t0 < 10
        message = str(info.value)
        assert "\n" not in message and f"127.0.0.1:{server.port}" in message, message
        argv = [str(BIN / "mgpu"), "--host", f"https://127.0.0.1:{server.port}", "submit"]
        res = subprocess.run(
            [*argv, "--connection-timeout", "1", "true"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert res.returncode != 0
        assert res.stderr.startswith("mgpu: error: ") and res.stderr.count("\n") == 1, res.stderr
    finally:
        server.close()
