"""A master whose state is in PostgreSQL (`mgpu master --database URL`): it runs jobs as on
SQLite, keeps them across a restart, refuses a database it cannot use in one line, and
shows a database's password nowhere (its log, its command line)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg

from helpers import BIN, LocalCluster, local_cluster, wait_for
from mgpu.client.api import Client
from pgserver import PgServer, free_port
from stores import durable


def test_a_master_on_postgresql_runs_jobs_and_keeps_them(tmp_path: Path, pg_url: str) -> None:
    with local_cluster(tmp_path, agents=1, gpus=1, database=pg_url) as c:
        job = c.client().submit("echo hello from postgres", gpus=0)
        assert c.client().wait(job.id, timeout=60)["state"] == "completed"
        assert c.cli("logs", job.id, check=True).stdout == "hello from postgres\n"
        queue = c.cli("queue", "--all", check=True).stdout
        assert job.id in queue
        assert not (c.state_dir / "mgpu.db").exists()  # nothing in SQLite
        assert c.master is not None
        c.master.terminate()
        c.master.wait(timeout=30)
        # Started again with the database named in the config instead of --database: the
        # same database, so the job and the tokens are there.
        c.config_path = tmp_path / "cluster.yaml"
        c.config_path.write_text(f"database: {pg_url}\n")
        c.database = None
        c.start_master()
        assert c.client().show(job.id)["state"] == "completed"
        second = c.client().submit("true", gpus=0)
        assert int(second.id) == int(job.id) + 1  # the id counter went on
        assert c.client().wait(second.id, timeout=60)["state"] == "completed"


def test_a_master_waits_out_a_restart_of_postgresql(
    tmp_path: Path, pg_url: str, postgres: PgServer
) -> None:
    with local_cluster(tmp_path, agents=1, gpus=1, database=durable(pg_url)) as c:
        before = c.client().submit("echo before", gpus=0)
        assert c.client().wait(before.id, timeout=60)["state"] == "completed"
        postgres.restart()
        after = c.client().submit("echo after", gpus=0)  # the master reconnected
        assert c.client().wait(after.id, timeout=60)["state"] == "completed"
        assert c.client().logs(before.id) == "before\n" and c.client().logs(after.id) == "after\n"
        assert c.master is not None and c.master.poll() is None


SECRET_ENV = {"MGPU_CLUSTER_SECRET": "a test cluster's secret, 40 bytes long"}
PW = "Db-pAssw0rd-of-the-test"


def _master(tmp_path: Path, *database: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "mgpu"), "master", "--port", str(free_port())]
    argv += ["--state-dir", str(tmp_path / "state"), *database]
    env = {**os.environ, **SECRET_ENV}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_database_the_master_cannot_use_is_one_line(tmp_path: Path, postgres: PgServer) -> None:
    res = _master(tmp_path, "--database", "mysql://root:hunter2@127.0.0.1/mgpu")
    assert res.returncode != 0
    assert "is not a PostgreSQL address" in res.stderr and "Traceback" not in res.stderr
    assert "hunter2" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    url = f"postgresql://mgpu:hunter2@127.0.0.1:{free_port()}/nowhere?password=hunter2"
    res = _master(tmp_path, "--database-file", str(_private(tmp_path / "db", url)))
    assert res.returncode != 0
    assert "cannot reach the database postgresql://mgpu@127.0.0.1" in res.stderr
    assert "Traceback" not in res.stderr and "hunter2" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def _first_line(c: LocalCluster) -> str:
    return next(ln for ln in c.log("master").splitlines() if "mgpu master on" in ln)


def test_a_password_in_the_database_file_is_in_no_log_and_no_command_line(
    tmp_path: Path, pg_url: str
) -> None:
    # The password in the URL's user part and again as a query parameter (trust auth: the
    # server never asks for it, so the master runs whatever it is).
    with_pw = pg_url.replace("://mgpu@", f"://mgpu:{PW}@", 1) + f"?password={PW}"
    path = _private(tmp_path / "database", with_pw + "\n")
    c = LocalCluster(tmp_path)
    c.env.update(SECRET_ENV)
    argv = [str(BIN / "mgpu"), "master", "--port", str(c.port), "--state-dir", str(c.state_dir)]
    try:
        c.master = c._spawn([*argv, "--database-file", str(path)], tmp_path / "master.log")
        wait_for(c._load_tokens, timeout=60, what="the master's tokens")
        wait_for(lambda: c.client().nodes() is not None, timeout=60, what="the master")
        job = c.client().submit("echo on postgres", gpus=0)
        with psycopg.connect(pg_url) as db:  # stored in that database
            assert db.execute("SELECT id FROM jobs").fetchall() == [(job.id,)]
        # What `ps` shows every account: the master's argv, read as ps reads it.
        cmdline = Path(f"/proc/{c.master.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--database-file" in cmdline and PW.encode() not in b" ".join(cmdline)
        wait_for(lambda: "mgpu master on" in c.log("master"), what="its first line")
        database = pg_url.removeprefix("postgresql://mgpu@")
        assert _first_line(c).endswith(f"state in postgresql://mgpu@{database}")
        assert PW not in c.log("master")
    finally:
        c.stop()


def test_a_password_in_a_private_config_is_in_no_log(tmp_path: Path, pg_url: str) -> None:
    # libpq's keyword form, a quoted password with spaces and quotes.
    hostport, dbname = pg_url.removeprefix("postgresql://mgpu@").split("/")
    host, port = hostport.split(":")
    keywords = f"host={host} port={port} user=mgpu dbname={dbname} password='{PW} \\'q\\''"
    c = LocalCluster(tmp_path, config=f"database: {json.dumps(keywords)}\n")  # JSON is YAML
    c.env.update(SECRET_ENV)
    assert c.config_path is not None
    c.config_path.chmod(0o600)
    try:
        c.start_master()
        assert c.client().nodes() == []
        assert _first_line(c).endswith(f"state in postgresql://mgpu@{host}:{port}/{dbname}")
        assert PW not in c.log("master")
    finally:
        c.stop()


def test_a_sqlite_cluster_moves_to_postgresql_with_its_jobs_and_tokens(
    tmp_path: Path, pg_url: str
) -> None:
    with local_cluster(tmp_path, agents=1, gpus=1) as c:
        first = c.client().submit("echo before the move", gpus=0)
        second = c.client().submit("true", gpus=0)
        for job in (first, second):
            assert c.client().wait(job.id, timeout=60)["state"] == "completed"
        admin, state_dir = c.admin_token, c.state_dir
    db_import = [str(BIN / "mgpu"), "db", "import", str(state_dir), "--database", pg_url]
    env = {**os.environ, **SECRET_ENV}
    res = subprocess.run(db_import, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert "2 jobs" in res.stdout and "2 tokens" in res.stdout and "1 node secrets" in res.stdout
    assert "1 identity" in res.stdout  # the CA and tokens, sealed with the secret
    again = subprocess.run(db_import, capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode != 0 and "already holds a cluster's state" in again.stderr
    assert "Traceback" not in again.stderr
    # The same machine, now on PostgreSQL: the old jobs, the old admin token, the old node.
    with local_cluster(tmp_path, agents=1, gpus=1, database=pg_url) as c:
        assert c.admin_token == admin
        owner = Client(c.address, token=admin)
        assert owner.whoami()["admin"] is True
        assert owner.show(first.id)["state"] == "completed"
        assert owner.logs(first.id) == "before the move\n"  # output stays on disk for now
        third = owner.submit("true", gpus=0)
        assert int(third.id) == int(second.id) + 1
        assert owner.wait(third.id, timeout=60)["state"] == "completed"
