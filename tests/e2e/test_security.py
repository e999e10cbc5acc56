"""Security: tokens, authorisation, TLS pinning, jobs as their owner, audit, access rules."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, kill_group, local_cluster, wait_for
from impostor import Impostor
from mgpu import Client, MgpuError
from mgpu.protocol import Grant, Launch, Welcome
from mgpu.tlsutil import ensure_ca
from mgpu.tokens import parse_token, remarked

# Real accounts of every Debian system stand in for people: a root agent runs each job
# as its owner, so the owner must exist on the node.
ALICE, BOB = "daemon", "bin"

ACCESS_CONFIG = f"""
security:
  node_groups:
    reserved: [node001]
  access:
    - nodes: [reserved]
      users: [{ALICE}]
"""


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path, agents=2, gpus=2, config=ACCESS_CONFIG) as c:
        yield c


def as_user(cluster: LocalCluster, token: str) -> Client:
    return Client(cluster.address, token=token, connect_timeout=2)


def test_clients_need_a_valid_token(secured: LocalCluster) -> None:
    env = {**secured.env, "MGPU_TOKEN": ""}
    env.pop("MGPU_TOKEN")
    env["HOME"] = str(secured.root)  # no ~/.config/mgpu/token, no default state dir
    res = subprocess.run(
        [str(BIN / "mgpu"), "queue"], capture_output=True, text=True, env=env, timeout=30
    )
    assert res.returncode != 0
    assert res.stderr.startswith("mgpu: error: not authorised: no token given")
    bad = subprocess.run(
        [str(BIN / "mgpu"), "--token", "mgpu_wrong", "submit", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert bad.returncode != 0 and "not authorised: unknown or revoked token" in bad.stderr
    assert secured.client().queue(all=True)["jobs"] == []  # the refused submit stored nothing
    events = secured.client().audit()
    assert any(e["kind"] == "auth_failed" and e["address"] == "127.0.0.1" for e in events)
    # Health, readiness and metrics stay open for probes.
    import urllib.request

    for path in ("/healthz", "/readyz", "/metrics"):
        with urllib.request.urlopen(f"http://{secured.address}{path}", timeout=10) as r:
            assert r.status == 200


def test_agents_need_the_join_token(secured: LocalCluster) -> None:
    for token, why in (
        ("", "this node has no join token: copy it from the file join-token"),
        ("mgpu_nope.abc", "the master refused this node: not authorised: wrong join token"),
    ):
        env = {**secured.env, "MGPU_JOIN_TOKEN": token, "MGPU_STATE_DIR": str(secured.root)}
        res = subprocess.run(
            [
                str(BIN / "mgpu"),
                "node",
                "--node-id",
                "intruder",
                "--fake-gpus",
                "1",
                "--master-port",
                str(secured.port),
                "--state-dir",
                str(secured.root / "intr"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert res.returncode != 0
        assert why in res.stderr
    assert "intruder" not in {n["node_id"] for n in secured.client().nodes()}
    # Counted like refused logins: one row per address (and node id) and minute.
    (refused,) = [e for e in secured.client().audit() if e["kind"] == "agent_refused"]
    assert refused["actor"] == "intruder" and refused["address"] == "127.0.0.1"
    assert refused["detail"].startswith("2 refused hellos: not authorised: ")


def test_users_cancel_only_their_own_jobs(secured: LocalCluster) -> None:
    admin = secured.client()
    alice = as_user(secured, admin.create_token(ALICE)["token"])
    bob = as_user(secured, admin.create_token(BOB)["token"])
    assert alice.whoami() == {"user": ALICE, "admin": False}
    job = alice.submit("sleep 300", gpus=0)
    assert alice.show(job.id)["user"] == ALICE
    with pytest.raises(MgpuError, match=f"not authorised: job {job.id} belongs to {ALICE}"):
        bob.cancel(job.id)
    assert bob.show(job.id)["state"] in ("queued", "running")  # everyone may look
    with pytest.raises(MgpuError, match="drain needs an admin token"):
        bob.drain("node002")
    with pytest.raises(MgpuError, match="needs an admin token"):
        bob.create_token("mallory", admin=True)
    assert admin.cancel(job.id)["cancelled"] == [job.id]
    kinds = [e["kind"] for e in admin.audit()]
    assert kinds.count("denied") == 3 and "cancel" in kinds and "token_create" in kinds
    res = secured.cli("audit")
    assert "denied" in res.stdout and BOB in res.stdout


def test_token_cli_and_revocation(secured: LocalCluster) -> None:
    res = secured.cli("token", "create", "carol", "--json", check=True)
    made = json.loads(res.stdout)
    assert made["user"] == "carol" and made["token"].startswith("mgpu_")
    plain = secured.cli("token", "create", "dave", check=True).stdout
    assert plain.count("\n") == 1 and plain.startswith("mgpu_")
    carol = as_user(secured, made["token"])
    assert carol.whoami()["user"] == "carol"
    listing = json.loads(secured.cli("token", "list", "--json", check=True).stdout)["tokens"]
    (entry,) = [t for t in listing if t["user"] == "carol"]
    secured.cli("token", "revoke", entry["id"], check=True)
    with pytest.raises(MgpuError, match="unknown or revoked token"):
        as_user(secured, made["token"]).whoami()
    # Tokens are stored hashed: the secret is nowhere in the database.
    db = (secured.state_dir / "mgpu.db").read_bytes()
    assert made["token"].split(".")[0].encode() not in db
    for name in ("admin-token", "join-token"):
        assert (secured.state_dir / name).stat().st_mode & 0o777 == 0o600


def test_only_the_owner_revokes_the_owners_and_the_join_token(secured: LocalCluster) -> None:
    """Another admin who could revoke them would lock the owner (and every new node) out."""
    other = as_user(secured, secured.client().create_token("erin", admin=True)["token"])
    tokens = {t["kind"] if not t["owner"] else "owner": t for t in secured.client().tokens()}
    for kind, what in (("owner", "the owner's admin token"), ("join", "the join token")):
        with pytest.raises(
            MgpuError, match=f"not authorised: only the cluster's owner may revoke {what}"
        ):
            other.revoke_token(tokens[kind]["id"])
    assert secured.client().whoami()["admin"]  # still the owner's
    listing = {t["id"]: t for t in secured.client().tokens()}
    assert listing[tokens["owner"]["id"]]["revoked"] is None
    assert listing[tokens["join"]["id"]]["revoked"] is None
    mine = secured.client().create_token("frank")["id"]
    other.revoke_token(mine)  # any other token: any admin, as before


def test_a_client_cannot_name_its_own_address(secured: LocalCluster) -> None:
    """uvicorn trusts X-Forwarded-For from loopback by default: every local account could
    write any address into the audit log, and dodge the bad-token throttle, which counts
    per address.  The master is never behind a proxy of its own: the header is ignored."""
    import urllib.error
    import urllib.request

    spoofed = "203.0.113.9"
    for path in ("/api/jobs", "/api/whoami"):
        request = urllib.request.Request(
            f"http://{secured.address}{path}",
            headers={
                "Authorization": "Bearer mgpu_wrong",
                "X-Forwarded-For": spoofed,
                "X-Real-IP": spoofed,
                "Forwarded": f"for={spoofed}",
                "X-Forwarded-Proto": "https",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 401
    rows = [e for e in secured.client().audit() if e["kind"] == "auth_failed"]
    assert rows and {e["address"] for e in rows} == {"127.0.0.1"}
    assert spoofed not in json.dumps(secured.client().audit())


def test_repeated_bad_tokens_are_slowed_down(secured: LocalCluster) -> None:
    bad = as_user(secured, "mgpu_guess")
    times = []
    for _ in range(7):
        t0 = time.monotonic()
        with pytest.raises(MgpuError, match="not authorised"):
            bad.queue()
        times.append(time.monotonic() - t0)
    # Three free tries, then 0.05 s doubling: the 7th waits 0.4 s (asyncio may run a
    # timer up to its clock's resolution early: a run measured 0.39986 s).
    assert times[-1] >= 0.39
    assert secured.client().queue() is not None  # a good token is not slowed


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other users needs a root agent")
def test_jobs_run_as_their_owner(secured: LocalCluster) -> None:
    admin = secured.client()
    nobody = pwd.getpwnam("nobody")
    job = as_user(secured, admin.create_token("nobody")["token"]).submit(
        "id -u; id -g; echo $HOME", gpus=0
    )
    done = admin.wait(job.id, timeout=30)
    assert done["state"] == "completed", done
    uid, gid, _home = admin.logs(job.id).splitlines()
    assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
    ghost = as_user(secured, admin.create_token("ghostuser")["token"]).submit("true", gpus=0)
    failed = admin.wait(ghost.id, timeout=30)
    assert failed["state"] == "failed"
    assert "user ghostuser does not exist" in failed["reason"]
    assert failed["retries"] == 0
    # The owner's admin token runs as the owner (root here).
    mine = admin.submit("id -u", gpus=0)
    admin.wait(mine.id, timeout=30)
    assert admin.logs(mine.id).strip() == str(os.getuid())


def test_node_access_rules_at_submit_and_placement(secured: LocalCluster) -> None:
    admin = secured.client()
    bob = as_user(secured, admin.create_token(BOB)["token"])
    alice = as_user(secured, admin.create_token(ALICE)["token"])
    with pytest.raises(MgpuError, match=f"user {BOB} may not use"):
        bob.submit("true", nodelist="node001")
    with pytest.raises(MgpuError, match=BOB):
        bob.submit("true", node_gpu_ids="node001:0")
    jobs = [bob.submit("sleep 0.3", gpus=1) for _ in range(4)]
    for j in jobs:
        done = admin.wait(j.id, timeout=60)
        assert done["state"] == "completed"
        assert [a["node_id"] for a in done["allocation"]] == ["node002"]
    ok = alice.submit("true", nodelist="node001")
    assert admin.wait(ok.id, timeout=30)["allocation"][0]["node_id"] == "node001"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a" * 1_000_000, "name"),
        ("bad\x1b[2Jname", "name"),
        ("tab\there", "name"),
    ],
)
def test_hostile_names_are_refused(refusing_cluster: LocalCluster, name: str, message: str) -> None:
    cluster = refusing_cluster
    with pytest.raises(MgpuError, match=message):
        cluster.client().submit("true", name=name)
    assert cluster.client().queue(all=True)["jobs"] == []


def test_hostile_paths_are_harmless(cluster: LocalCluster) -> None:
    c = cluster.client()
    for job_id in ("../../etc/passwd", "..%2F..%2Fmgpu.db", "a" * 5000):
        with pytest.raises(MgpuError, match=r"no such job|Not Found|ids never contain"):
            c.show(job_id)
    job = c.submit("echo ok", name="../../../etc/x")  # a name is only a label
    assert c.wait(job.id, timeout=30)["name"] == "../../../etc/x"
    assert not Path("/etc/x").exists()


def test_tls_with_pinned_ca(tmp_path: Path) -> None:
    # --tls on loopback: what a public address (--host 0.0.0.0) gets by default.
    cluster = LocalCluster(tmp_path)
    argv = [str(BIN / "mgpu"), "master", "--tls", "--port", str(cluster.port)]
    argv += ["--state-dir", str(cluster.state_dir)]
    cluster.master = cluster._spawn(argv, tmp_path / "master-tls.log")
    try:
        wait_for(cluster._load_tokens, what="tokens")
        wait_for(lambda: cluster.client().nodes() is not None, what="TLS master")
        cluster.start_agent("node001", gpus=1)
        c = Client(f"https://{cluster.address}", token=cluster.admin_token)
        job = c.submit("echo secret-output", gpus=1)
        assert c.wait(job.id, timeout=30)["state"] == "completed"
        assert c.logs(job.id) == "secret-output\n"
        # A token that names another CA is refused before any request is sent.
        other = tmp_path / "other-ca"
        other.mkdir()
        fake_fp = ensure_ca(other)
        forged = cluster.admin_token.split(".")[0] + "." + fake_fp
        with pytest.raises(MgpuError, match="does not match the token"):
            Client(f"https://{cluster.address}", token=forged).queue()
        # Plain HTTP to the TLS master gets nothing.
        with pytest.raises(MgpuError):
            Client(f"http://{cluster.address}", token=cluster.admin_token).queue()
    finally:
        cluster.stop()


def _tls_master(cluster: LocalCluster, log: Path) -> None:
    argv = [str(BIN / "mgpu"), "master", "--tls", "--port", str(cluster.port)]
    argv += ["--state-dir", str(cluster.state_dir)]
    cluster.master = cluster._spawn(argv, log)
    wait_for(cluster._load_tokens, what="tokens")
    wait_for(lambda: cluster.client().nodes() is not None, what="TLS master")


def _welcome_and_root_launch(marker: Path) -> list[dict[str, Any]]:
    """What an impostor answers an agent's hello with: a Welcome, then a Launch that would
    touch `marker` as root."""
    launch = Launch(
        job_id="j1",
        epoch=1,
        argv=["/bin/sh", "-c", f"touch {marker}"],
        env={},
        grant=Grant(gpus=[]),
        user="root",
        allow_root=True,
    )
    return [Welcome(heartbeat_interval=5).model_dump(), launch.model_dump()]


def test_an_impostor_on_a_tls_masters_port_gets_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tls` on loopback, the master down, any account's plain listener on its port: the
    CLI, a Python Client (the admin's token) and a restarted agent, all of which met the
    master once, send it no token, no hello and no node secret, and the agent runs none of
    the Launch it offers.  Back on the real master, the agent and its jobs go on in TLS."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the client's pinned CA
    cluster = LocalCluster(tmp_path)
    marker = tmp_path / "ran-as-root"
    frames = _welcome_and_root_launch(marker)
    try:
        _tls_master(cluster, tmp_path / "master-tls.log")
        cluster.start_agent("node001", gpus=1)  # its first TLS link pins the CA
        assert cluster.cli("queue").returncode == 0
        job = cluster.client().submit('echo "$MGPU_MASTER"; mgpu queue >/dev/null && echo ok')
        assert cluster.client().wait(job.id, timeout=30)["state"] == "completed"
        # The job's own commands are told to use TLS, and do.
        assert cluster.client().logs(job.id) == f"https://{cluster.address}\nok\n"
        agent_dir = tmp_path / "agent-node001"
        secret = (agent_dir / "node-node001" / "node-secret").read_text().strip()
        for proc in (cluster.agents["node001"], cluster.master):
            assert proc is not None
            kill_group(proc)

        with Impostor(cluster.port, frames) as impostor:
            res = cluster.cli("queue")  # no scheme given: the pinned CA says TLS
            assert res.returncode != 0
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
            with pytest.raises(MgpuError):
                Client(cluster.address, token=cluster.admin_token, connect_timeout=2).queue()
            seen = impostor.connections()
            cluster.start_agent("node001", gpus=1, wait=False)  # a new process, same dir
            impostor.wait_connections(seen + 2)  # it dialled, and dialled again
            assert impostor.tls_hellos == impostor.connections()
        received = impostor.everything()
        for text in (cluster.admin_token, cluster.join_token, secret):
            assert text.split(".")[0].encode() not in received
        assert b"Authorization" not in received and b"hello" not in received
        assert not marker.exists()

        _tls_master(cluster, tmp_path / "master-tls-again.log")
        cluster.wait_node("node001", "online", timeout=30)  # back, in TLS
    finally:
        cluster.stop()


def _restart_master(cluster: LocalCluster, log: Path, tls: bool) -> None:
    """The master again, with or without --tls; the tokens taken once it marked them."""
    argv = [str(BIN / "mgpu"), "master", "--port", str(cluster.port)]
    argv += ["--state-dir", str(cluster.state_dir), *(["--tls"] if tls else [])]
    cluster.master = cluster._spawn(argv, log)

    def marked_for_it() -> bool:
        texts = [(cluster.state_dir / n).read_text() for n in ("admin-token", "join-token")]
        return all(parse_token(t).tls is tls for t in texts)

    wait_for(marked_for_it, what="the token files marked for the master's mode")
    wait_for(cluster._load_tokens, what="tokens")
    wait_for(lambda: cluster.client().nodes() is not None, what="the master")


def test_a_tls_masters_tokens_keep_fresh_clients_and_agents_in_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `--tls` master's tokens (its files, `mgpu token create`'s, a job's $MGPU_TOKEN) end
    with `.tls`: a client with an empty cache and a new agent that have never reached the
    cluster send an impostor on its port nothing but TLS handshakes, and the agent runs
    none of its Launch.  Restarted plain, the master unmarks its files; the secrets stay."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cluster = LocalCluster(tmp_path)
    marker = tmp_path / "ran-as-root"
    frames = _welcome_and_root_launch(marker)
    try:
        cluster.start_master()  # plain on loopback, as by default: unmarked tokens
        plain = [cluster.admin_token, cluster.join_token]
        assert not any(parse_token(t).tls for t in plain)
        assert cluster.master is not None
        kill_group(cluster.master)
        _restart_master(cluster, tmp_path / "master-tls.log", tls=True)
        assert [cluster.admin_token, cluster.join_token] == [remarked(t, True) for t in plain]
        made = cluster.cli("token", "create", "bob", check=True).stdout.strip()
        assert parse_token(made).tls
        cluster.start_agent("node001", gpus=1)
        job = cluster.client().submit('echo "${MGPU_TOKEN##*.}"')  # the credential's mark
        assert cluster.client().wait(job.id, timeout=30)["state"] == "completed"
        assert cluster.client().logs(job.id) == "tls\n"
        for proc in (cluster.agents["node001"], cluster.master):
            kill_group(proc)

        fresh = tmp_path / "fresh"  # a home and a cache that never met the cluster
        for name, value in (("HOME", fresh), ("XDG_CACHE_HOME", fresh / "cache")):
            monkeypatch.setenv(name, str(value))
            cluster.env[name] = str(value)
        with Impostor(cluster.port, frames) as impostor:
            res = cluster.cli("queue")  # no scheme, nothing pinned: the token says TLS
            assert res.returncode != 0
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
            with pytest.raises(MgpuError):
                Client(cluster.address, token=made, connect_timeout=2).queue()
            seen = impostor.connections()
            cluster.start_agent("node002", gpus=1, wait=False)  # a new state dir
            impostor.wait_connections(seen + 2)  # it dialled, and dialled again
            assert impostor.tls_hellos == impostor.connections()
        received = impostor.everything()
        for token in (cluster.admin_token, cluster.join_token, made):
            assert parse_token(token).secret.encode() not in received
        assert b"Authorization" not in received and b"hello" not in received
        assert not marker.exists()
        assert not list(fresh.rglob("ca-*.pem")) and not list(
            (tmp_path / "agent-node002").rglob("ca-*.pem")
        )  # nothing pinned: the tokens alone said TLS

        kill_group(cluster.agents["node002"])
        _restart_master(cluster, tmp_path / "master-plain.log", tls=False)
        assert [cluster.admin_token, cluster.join_token] == plain
        assert cluster.cli("queue").returncode == 0
    finally:
        cluster.stop()


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")),
    reason="needs root, setpriv and unshare",
)
def test_non_root_agent_runs_jobs_as_itself(cluster: LocalCluster) -> None:
    # The agent runs as `nobody` with no capability at all, but this clone (and the Python
    # it was made with) may live where nobody cannot walk: a `mktemp -d` under /root.  So it
    # runs in a mount namespace of its own where the interpreter, the venv and the source
    # tree are bind-mounted into a world-traversable temp dir: the same files, by a path
    # nobody may walk.  (Not CAP_DAC_READ_SEARCH for the agent: its jobs would inherit the
    # capability and no longer be a plain `nobody`.)
    import sysconfig

    import mgpu

    top = Path(tempfile.mkdtemp(prefix="mgpu-nobody-", dir="/tmp"))
    try:
        top.chmod(0o755)
        state, base, venv, src = (top / d for d in ("state", "base", "venv", "src"))
        for d in (state, base, venv, src):
            d.mkdir()
        shutil.chown(state, "nobody", "nogroup")
        mounts = [sys.base_prefix, str(base), sys.prefix, str(venv)]
        mounts += [str(Path(mgpu.__file__).parent.parent), str(src)]
        site = venv / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
        python = base / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        script = (
            'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; '
            'shift; cd / && exec setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"'
        )
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        # LD_LIBRARY_PATH: a shared-library build (pyenv's) finds its libpython by the old path.
        # HOME: nobody's own (/nonexistent) is not there; root's is closed to it.
        env = ["env", f"PYTHONPATH={src}:{site}", f"LD_LIBRARY_PATH={base / 'lib'}"]
        env.append(f"HOME={state}")
        argv += [*mounts, "--", *env, str(python), "-m", "mgpu"]
        argv += ["node", "--node-id", "node009", "--fake-gpus", "1"]
        argv += ["--master-port", str(cluster.port), "--state-dir", str(state)]
        cluster.agents["node009"] = cluster._spawn(argv, cluster.root / "node009.log")
        node = cluster.wait_node("node009", "online", timeout=60)
        assert node["run_as_user"] == "nobody"
        job = cluster.client().submit(
            "id -un; grep CapEff /proc/self/status", nodelist="node009", gpus=0
        )
        done = cluster.client().wait(job.id, timeout=30)
        assert done["state"] == "completed", (done, cluster.log("node009"))
        user, caps = cluster.client().logs(job.id).splitlines()
        assert user == "nobody"
        assert caps.split() == ["CapEff:", "0000000000000000"]  # a plain account, no privilege
        assert "nobody" in cluster.cli("nodes").stdout
        kill_group(cluster.agents.pop("node009"))
    finally:
        shutil.rmtree(top, ignore_errors=True)
