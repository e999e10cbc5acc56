"""A Slurm batch job's -o/-e file in a directory every account may write (a lab's project
or scratch dir: 0777, no sticky bit), where job numbers are known ahead: what another
account planted under the file's name (a 0666 file of theirs, a symbolic link to the job
owner's own private file) fails the job with a sentence naming the path, and gets none of
its output; the owner's own file is truncated or appended to as before, and `-o /dev/null`
works.  A root agent runs the jobs as a second account (mgpu.agent.outputfiles)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, local_cluster
from mgpu import Client

OWNER = "daemon"  # the jobs' user: an account every Debian system has
PLANTER = "nobody"  # the other account, whose entries are planted in the shared dir
SCRIPT = "#!/bin/sh\necho secret output of $(id -un)\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root agent runs jobs as others")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("planted"), agents=1, gpus=1) as c:
        yield c


@pytest.fixture(scope="module")
def owner(cluster: LocalCluster) -> Client:
    """The API as OWNER."""
    return Client(cluster.address, token=cluster.client().create_token(OWNER)["token"])


@pytest.fixture
def top() -> Iterator[Path]:
    """/tmp/mgpu-planted-X (0755): `shared` (0777, not sticky), and OWNER's 0700 `home`
    with a private file in it."""
    path = Path(tempfile.mkdtemp(prefix="mgpu-planted-", dir="/tmp"))
    try:
        path.chmod(0o755)
        (path / "shared").mkdir()
        (path / "shared").chmod(0o777)
        home = path / "home"
        home.mkdir(mode=0o700)
        (home / "private").write_text("owner's private text\n")
        (home / "private").chmod(0o600)
        chown(home, OWNER)
        chown(home / "private", OWNER)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def chown(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.lchown(path, pw.pw_uid, pw.pw_gid)


def held(client: Client, workdir: Path, **slurm: Any) -> str:
    """A batch job of OWNER's in `workdir`, held: its number is known before it runs."""
    block = {"batch": True, "job_name_default": "job.sh", "submit_dir": str(workdir), **slurm}
    return client.submit_script(SCRIPT, name="job.sh", cwd=str(workdir), slurm=block, hold=True).id


def run(client: Client, job_id: str) -> dict[str, Any]:
    client.release(job_id)
    return client.wait(job_id, timeout=60)


def test_a_planted_file_of_another_account_fails_the_job(owner: Client, top: Path) -> None:
    shared = top / "shared"
    job_id = held(owner, shared)
    planted = shared / f"slurm-{job_id}.out"
    planted.write_text("")
    planted.chmod(0o666)  # the planter could read all the job writes into it
    chown(planted, PLANTER)
    job = run(owner, job_id)
    assert job["state"] == "failed", job
    assert f"Could not open stdout file {planted}: not owned by {OWNER}" in job["reason"]
    assert planted.read_text() == ""


def test_a_planted_link_to_the_owners_file_fails_the_job(owner: Client, top: Path) -> None:
    shared, private = top / "shared", top / "home" / "private"
    job_id = held(owner, shared)
    out = shared / f"slurm-{job_id}.out"
    out.symlink_to(private)
    chown(out, PLANTER)
    job = run(owner, job_id)
    assert job["state"] == "failed", job
    assert f"Could not open stdout file {out}: is a symbolic link" in job["reason"]
    assert private.read_text() == "owner's private text\n"
    # The same for the -e file, and a link to a name not there yet creates nothing.
    job_id = held(owner, shared, output="/dev/null", error="err-%j.txt")
    err = shared / f"err-{job_id}.txt"
    err.symlink_to(top / "home" / "new")
    chown(err, PLANTER)
    job = run(owner, job_id)
    assert job["state"] == "failed", job
    assert f"Could not open stderr file {err}: is a symbolic link" in job["reason"]
    assert sorted(p.name for p in (top / "home").iterdir()) == ["private"]
    assert private.read_text() == "owner's private text\n"


def test_the_owners_own_file_is_truncated_or_appended_to(owner: Client, top: Path) -> None:
    shared = top / "shared"
    mine = shared / "mine.out"
    mine.write_text("from before\n")
    chown(mine, OWNER)
    job = run(owner, held(owner, shared, output="mine.out", open_mode="append"))
    assert job["state"] == "completed", job
    assert mine.read_text() == f"from before\nsecret output of {OWNER}\n"
    job = run(owner, held(owner, shared, output=str(mine)))  # truncate, the default
    assert job["state"] == "completed", job
    assert mine.read_text() == f"secret output of {OWNER}\n"
    job_id = held(owner, shared)  # a new file: created by the job's user, as before
    assert run(owner, job_id)["state"] == "completed"
    new = shared / f"slurm-{job_id}.out"
    assert new.read_text() == f"secret output of {OWNER}\n"
    assert new.stat().st_uid == pwd.getpwnam(OWNER).pw_uid
    assert stat.S_ISREG(new.lstat().st_mode)


def test_output_to_dev_null_works(owner: Client, top: Path) -> None:
    job = run(owner, held(owner, top / "shared", output="/dev/null"))
    assert job["state"] == "completed", job
    assert list((top / "shared").iterdir()) == []
