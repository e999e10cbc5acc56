"""pyxis's container options (`srun --container-image=... --container-mounts=...`, `#SBATCH
--container-image`) on a real master and agent: with a stand-in runtime (its command
lines) and with the machine's real rootful podman and a busybox image (what runs inside),
refused where a node has no runtime or its runtime cannot, and never mounting for a user
what they cannot reach."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_site
from test_site import BUSYBOX_IMAGE, needs_root, script, start

from helpers import BIN, LocalCluster
from mgpu import Client

# test_site's fixtures, used by name.
make_cluster = test_site.make_cluster
podman_conf = test_site.podman_conf
shared_dir = test_site.shared_dir
user_tree = test_site.user_tree

STAND_IN = r"""#!{python}
# A stand-in for rootful podman: has the image localhost/present:1, records each `run`'s
# command line, and runs its command with the variables of its env file, in the host
# directory its -w names through its -v mounts (as the container would see it).
import json, os, sys

args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("podman version 0.0-stand-in")
    sys.exit(0)
if args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] == "localhost/present:1" else 1)
if args[:1] != ["run"]:
    sys.exit(0)
env, mounts, workdir, i = {{"PATH": "/usr/bin:/bin"}}, {{}}, "/", 1
while args[i].startswith("-"):
    if args[i] in ("--name", "--user", "--device", "-v", "-w", "-e", "--env-file", "--tmpfs"):
        opt, val = args[i], args[i + 1]
        i += 2
        if opt == "--env-file":
            for item in open(val, encoding="utf-8").read().splitlines():
                key, eq, value = item.partition("=")
                env[key] = value if eq else os.environ.get(key, "")
        elif opt == "-v":
            source, target = val.split(":")[:2]
            mounts[target] = source
        elif opt == "-w":
            workdir = val
    else:
        i += 1
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\n")
os.chdir(mounts.get(workdir, workdir))
os.execvpe(args[i + 1], args[i + 1 :], env)
"""


@pytest.fixture(params=["stand-in", "podman"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The runtime the agent runs: the stand-in, or the machine's real rootful podman
    (skipped where it cannot run); the environment it needs, and an image in pyxis's
    `REGISTRY#IMAGE` form."""
    if request.param == "podman":
        if os.geteuid() != 0:
            pytest.skip("needs root (rootful podman)")
        conf: Path = request.getfixturevalue("podman_conf")
        registry, _, image = BUSYBOX_IMAGE.partition("/")
        return {"env": {"CONTAINERS_CONF": str(conf)}, "image": f"{registry}#{image}",
                "real": True, "log": None}  # fmt: skip
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    log = tmp_path / "runs.jsonl"
    script(fakebin / "podman", STAND_IN.format(python=sys.executable, log=str(log)))
    env = {"PATH": f"{fakebin}:{os.environ['PATH']}"}
    return {"env": env, "image": "localhost#present:1", "real": False, "log": log}


@pytest.fixture
def cluster(
    tmp_path: Path, make_cluster: list[LocalCluster], runtime: dict[str, Any]
) -> Iterator[LocalCluster]:
    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env.update(runtime["env"])
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    yield c


SLURM = [sys.executable, "-m", "mgpu.slurm"]
"""Slurm's commands, as the bin dir's `srun` runs them."""


def sbatch(c: LocalCluster, cwd: Path, text: str) -> tuple[dict[str, Any], str]:
    """Submit `text` as job.sh with mgpu's sbatch from `cwd`: the job's end and its -o file."""
    (cwd / "job.sh").write_text(text)
    res = subprocess.run(
        [str(BIN / "mgpu"), "sbatch", "--parsable", "job.sh"],
        cwd=cwd, env=c.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    end = c.client().wait(job_id, timeout=90)
    return end, (cwd / f"slurm-{job_id}.out").read_text()


def runs(runtime: dict[str, Any]) -> list[list[str]]:
    return [json.loads(line) for line in runtime["log"].read_text().splitlines()]


def test_srun_runs_its_command_in_the_image_with_the_mount_and_workdir(
    cluster: LocalCluster, runtime: dict[str, Any], shared_dir: Path
) -> None:
    """Megatron's and NeMo's way: `srun --container-image=REGISTRY#IMAGE
    --container-mounts=SRC:DST --container-workdir=DST cmd` in a batch script."""
    data = shared_dir / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello\n")
    work = shared_dir / "work"
    work.mkdir()
    image = runtime["image"]
    end, out = sbatch(
        cluster,
        work,
        "#!/bin/sh\n"
        'echo "script in $(pwd)"\n'
        f"srun --container-image={image} --container-mounts={data}:/data:ro "
        "--container-workdir=/data sh -c 'echo \"task in $(pwd): $(cat hello.txt) "
        "$SLURM_PROCID $(id -u)\"; touch new 2>/dev/null && echo wrote || echo read-only'\n"
        'echo "rc=$?"\n',
    )
    assert end["state"] == "completed", (end, out)
    inside, written = "/data", "read-only"
    if not runtime["real"]:  # the stand-in mounts nothing: it runs in the mount's source
        (argv,) = runs(runtime)
        inside, written = (
            [argv[i + 1] for i, a in enumerate(argv) if a == "-v"][1].split(":")[0],
            "wrote",
        )
    assert out.splitlines() == [
        f"script in {work}",
        f"task in {inside}: hello 0 {os.getuid()}",
        written,
        "rc=0",
    ], out
    if runtime["real"]:
        assert not (data / "new").exists()
        return
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert argv[argv.index("-w") + 1] == "/data" and "--entrypoint=" in argv
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    source = mounts[1].split(":")[0] if os.geteuid() == 0 else str(data)
    assert mounts[1] == f"{source}:/data:ro", mounts  # pinned as the user reached it
    assert argv[argv.index("localhost/present:1") + 1 :][:2] == ["sh", "-c"]


def test_srun_outside_a_job_runs_a_new_job_in_the_image(
    cluster: LocalCluster, runtime: dict[str, Any], shared_dir: Path
) -> None:
    """Outside any job srun is a new job (`mgpu srun`): in the image, with its options."""
    data = shared_dir / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello\n")
    res = subprocess.run(
        [*SLURM, "srun", f"--container-image={runtime['image']}",
         f"--container-mounts={data}:/data:ro", "--container-workdir=/data",
         "sh", "-c", "cat hello.txt; echo x > y 2>/dev/null || echo read-only"],
        cwd=shared_dir, env={**cluster.env, "MGPU_JOB_ID": ""}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (job,) = cluster.client().queue(all=True)["jobs"]
    assert job["image"] == runtime["image"].replace("#", "/")
    if runtime["real"]:
        assert res.stdout.splitlines()[-2:] == ["hello", "read-only"], res.stdout
        return
    (argv,) = runs(runtime)
    assert argv[argv.index("-w") + 1] == "/data" and "--entrypoint=" in argv
    assert any(m.endswith(":/data:ro") for m in argv), argv
    assert "hello" in res.stdout.splitlines()


def test_sbatch_container_image_runs_the_batch_script_in_the_image(
    cluster: LocalCluster, runtime: dict[str, Any], shared_dir: Path
) -> None:
    """`#SBATCH --container-image`: the script itself runs inside (pyxis's sbatch); its
    output reaches its -o file, its exit code is the job's."""
    work = shared_dir / "work"
    work.mkdir()
    end, out = sbatch(
        cluster,
        work,
        # Quoted: an unquoted `#` starts a comment in an #SBATCH line, as in Slurm's.
        f'#!/bin/sh\n#SBATCH --container-image="{runtime["image"]}"\n'
        f"#SBATCH --container-mounts={work}:/w\n#SBATCH --container-workdir=/w\n"
        'echo "in $(pwd) job $SLURM_JOB_ID args $#"\n'
        "if [ -e /etc/os-release ]; then echo host-fs; else echo image-fs; fi\n"
        "exit 3\n",
    )
    assert end["state"] == "failed" and end["exit_code"] == 3, (end, out)
    where, fs = "/w", "image-fs"  # busybox has no /etc/os-release; this machine has
    if not runtime["real"]:  # the stand-in runs it in the mount's source, on the host
        (argv,) = runs(runtime)
        mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
        where, fs = next(m for m in mounts if m.endswith(":/w")).split(":")[0], "host-fs"
    assert out.splitlines() == [
        f"in {where} job {end['id']} args 0",
        fs,
        f"srun: error: {os.uname().nodename}: task 0: Exited with exit code 3",
    ], out
    if runtime["real"]:
        return
    image_at = argv.index("localhost/present:1")
    command = argv[image_at + 1]
    assert command.startswith("/tmp/mgpu-batch.") and command.endswith("/job.sh"), argv
    folder = os.path.dirname(command)
    assert any(m.endswith(f":{folder}:ro") for m in mounts), mounts  # read-only inside
    assert not os.path.exists(folder)  # removed when the script ended


def test_squashfs_file_is_refused_where_the_runtime_cannot_run_one(
    tmp_path: Path, make_cluster: list[LocalCluster], shared_dir: Path
) -> None:
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    log = tmp_path / "runs.jsonl"
    script(fakebin / "podman", STAND_IN.format(python=sys.executable, log=str(log)))
    c = start(make_cluster, tmp_path, "")
    c.env["PATH"] = f"{fakebin}:{c.env['PATH']}"
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    work = shared_dir / "work"
    work.mkdir()
    (work / "pt.sqsh").write_bytes(b"hsqs")
    end, out = sbatch(c, work, "#!/bin/sh\nsrun --container-image=./pt.sqsh true\necho rc=$?\n")
    assert end["state"] == "completed", end
    assert out.splitlines() == [
        f"srun: error: {os.uname().nodename}: task 0: node001's container runtime (podman) "
        f"cannot run the image file {work}/pt.sqsh: only apptainer runs SIF or squashfs "
        "files; give an image name",
        "rc=1",
    ], out
    assert not log.exists()  # nothing was run


def test_a_node_without_a_runtime_says_so(
    tmp_path: Path, make_cluster: list[LocalCluster], shared_dir: Path
) -> None:
    """A step on a node without a runtime is refused with srun's sentence; outside any
    job, srun's new job is refused at submit when no node has a runtime."""
    c = start(make_cluster, tmp_path, "")
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "none"])
    work = shared_dir / "work"
    work.mkdir()
    end, out = sbatch(
        c, work, "#!/bin/sh\nsrun --container-image=nvcr.io#nvidia/pytorch:24.01-py3 true\n"
        "echo rc=$?\n"
    )  # fmt: skip
    job = end["id"]
    assert out.splitlines() == [
        f"srun: error: Unable to create step for job {job}: node001 has no container runtime "
        "(podman, docker or apptainer) to run --container-image nvcr.io/nvidia/pytorch:24.01-py3",
        "rc=1",
    ], out
    res = subprocess.run(
        [*SLURM, "srun", "--container-image=ubuntu", "--container-workdir=/x", "true"],
        cwd=work, env=c.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res
    assert "no node has a container runtime (podman, docker or apptainer) to run" in res.stderr
    assert [j["id"] for j in c.client().queue(all=True)["jobs"]] == [job]


def test_srun_options_mgpu_cannot_honour_are_refused(
    tmp_path: Path, make_cluster: list[LocalCluster]
) -> None:
    c = start(make_cluster, tmp_path, "")
    for option, said in [
        ("--container-remap-root", "a container runs as the job's user, never as root"),
        ("--container-name=build", "a container is not kept between steps"),
        ("--container-save=/tmp/x.sqsh", "it saves no container"),
    ]:
        res = subprocess.run(
            [*SLURM, "srun", "--container-image=ubuntu", option, "true"],
            env=c.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 1, res
        assert res.stderr.startswith("srun: error: pyxis: ") and said in res.stderr, res.stderr
    assert c.client().queue(all=True)["jobs"] == []


@needs_root
def test_a_mount_never_reaches_what_its_user_cannot(
    tmp_path: Path,
    make_cluster: list[LocalCluster],
    runtime: dict[str, Any],
    user_tree: Path,
) -> None:
    """The root runtime mounts what the job's user reached, never a path by its name: a
    0700 directory of root's, and a link in the user's own directory to a file in it, are
    refused with one sentence and nothing of theirs shows."""
    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env.update(runtime["env"])
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    admin = c.client()
    user = Client(c.address, token=admin.create_token("nobody")["token"], connect_timeout=2)
    work, root_only = user_tree / "work", user_tree / "root-only"
    (root_only / "secret").write_text("root's secret\n")
    os.symlink(root_only / "secret", work / "link")
    image = runtime["image"].replace("#", "/")
    for source, why in [
        (root_only, f"--container-mounts: {root_only} cannot be entered by the user"),
        (root_only / "secret", f"--container-mounts: {root_only}/secret is not there for the"),
        (work / "link", f"--container-mounts: {work}/link is a symbolic link"),
    ]:
        job = user.submit(
            "cat /data/secret /data; echo ran", gpus=0, image=image, cwd=str(work),
            container={"mounts": [{"source": str(source), "target": "/data"}]},
        )  # fmt: skip
        end = admin.wait(job.id, timeout=60)
        assert end["state"] == "failed" and why in (end["reason"] or ""), end
        assert "secret" not in admin.logs(job.id)
    spool = tmp_path / "agent-node001" / "node-node001" / "spool"
    assert not list(spool.glob("*.cwd"))  # nothing left mounted
