"""Site integration: prolog/epilog, admission control, containers, deployment."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from helpers import BIN, LocalCluster, dist_dir, free_port, kill_group, wait_for
from mgpu import Client, MgpuError
from mgpu.agent import bindmount, containers, privileged
from mgpu.agent.containers import Runtime
from mgpu.agent.launcher import Launcher, LaunchError
from mgpu.agent.site import SiteHooks, run_script, script_env
from mgpu.config import Admission as AdmissionConfig
from mgpu.master.control.admission import Admission, AdmissionContext
from mgpu.master.control.jobbuild import SubmitDefaults, build_jobs
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.security.access import unix_groups
from mgpu.model import Job
from mgpu.protocol import Exited, Grant, Launch
from mgpu.scheduler.types import JobRequest

ME = getpass.getuser()
ROOT = Path(__file__).resolve().parents[2]


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[list[LocalCluster]]:
    made: list[LocalCluster] = []
    yield made
    for c in made:
        c.stop()


def start(made: list[LocalCluster], root: Path, config: str) -> LocalCluster:
    c = LocalCluster(root, config=config)
    made.append(c)
    c.start_master()
    return c


# ---- container command lines (pure) ----------------------------------------------------

PODMAN = Runtime("podman", "/usr/bin/podman")
PODMAN_ROOTLESS = Runtime("podman", "/usr/bin/podman", rootless=True)
DOCKER = Runtime("docker", "/usr/bin/docker")
APPTAINER = Runtime("apptainer", "/usr/bin/apptainer")


def build(rt: Runtime, gpu_ids: list[int], cwd: str | None = "/home/al/exp") -> list[str]:
    return containers.build_argv(
        rt,
        "pytorch:24.01",
        ["python", "train.py"],
        grant=Grant(gpus=gpu_ids),
        cwd=cwd,
        uid_gid=(1001, 100),
        env_file="/var/lib/mgpu/spool/ab12cd34.1.env",
        name="mgpu-ab12cd34-1",
    )


def test_podman_command_line() -> None:
    assert build(PODMAN, [2, 3]) == [
        "/usr/bin/podman", "run", "--rm", "--name", "mgpu-ab12cd34-1",
        "--network=host", "--ipc=host", "--security-opt=no-new-privileges",
        "--security-opt=label=disable",
        "--user", "1001:100",
        "--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3",
        "-v", "/home/al/exp:/home/al/exp", "-w", "/home/al/exp",
        "--env-file", "/var/lib/mgpu/spool/ab12cd34.1.env", "-e", "CUDA_VISIBLE_DEVICES=0,1",
        "pytorch:24.01", "python", "train.py",
    ]  # fmt: skip
    rootless = build(PODMAN_ROOTLESS, [0])
    assert "--userns=keep-id" in rootless and "--user" not in rootless
    assert rootless[rootless.index("--device") + 1] == "nvidia.com/gpu=0"


def test_docker_command_line() -> None:
    assert build(DOCKER, [1, 3]) == [
        "/usr/bin/docker", "run", "--rm", "--name", "mgpu-ab12cd34-1",
        "--network=host", "--ipc=host", "--security-opt=no-new-privileges",
        "--user", "1001:100",
        "--gpus", '"device=1,3"',
        "-v", "/home/al/exp:/home/al/exp", "-w", "/home/al/exp",
        "--env-file", "/var/lib/mgpu/spool/ab12cd34.1.env", "-e", "CUDA_VISIBLE_DEVICES=0,1",
        "pytorch:24.01", "python", "train.py",
    ]  # fmt: skip


def test_apptainer_command_line() -> None:
    assert build(APPTAINER, [1, 3]) == [
        "/usr/bin/apptainer", "exec", "--nv",
        "--bind", "/home/al/exp", "--pwd", "/home/al/exp",
        "--env", "CUDA_VISIBLE_DEVICES=1,3",
        "pytorch:24.01", "python", "train.py",
    ]  # fmt: skip


def test_cpu_container_job_sees_no_gpu_and_no_cwd_is_not_mounted() -> None:
    for rt in (PODMAN, DOCKER):
        argv = build(rt, [], cwd=None)
        assert "CUDA_VISIBLE_DEVICES=" in argv
        assert not {"--device", "--gpus", "-v", "-w"} & set(argv)
    argv = build(APPTAINER, [], cwd=None)
    assert "--nv" not in argv and "CUDA_VISIBLE_DEVICES=" in argv and "--bind" not in argv


def test_image_checks_and_environment_filter() -> None:
    podman_check = ["/usr/bin/podman", "image", "exists", "x:1"]
    assert containers.image_check_argv(PODMAN, "x:1") == podman_check
    assert containers.image_check_argv(DOCKER, "x:1")[:3] == ["/usr/bin/docker", "image", "inspect"]
    assert containers.image_check_argv(APPTAINER, "/img/x.sif") is None
    name = containers.container_name("7f3a_12", 3)
    assert re.fullmatch(r"mgpu-7f3a_12-3-[0-9a-f]{8}", name), name
    assert containers.container_name("7f3a_12", 3) != name  # another run, another name
    env = {"PATH": "/x", "HOME": "/h", "LD_PRELOAD": "e.so", "XDG_RUNTIME_DIR": "/run/u"}
    env |= {"MGPU_JOB_ID": "a", "WANDB_KEY": "k", "CUDA_VISIBLE_DEVICES": "3", "bad-name": "1"}
    assert containers.passed_env(env) == ["MGPU_JOB_ID", "WANDB_KEY"]
    assert containers.features(None) == []
    assert containers.features(PODMAN) == ["container", "podman"]
    assert containers.probe("none") is None


# ---- site scripts (unit) ---------------------------------------------------------------


def test_run_script_reports_first_line_timeout_and_unrunnable(tmp_path: Path) -> None:
    bad = script(tmp_path / "bad.sh", "#!/bin/sh\necho\necho '  disk full  '\necho more\nexit 3\n")
    res = asyncio.run(run_script(str(bad), {"PATH": "/usr/bin:/bin"}, 5))
    assert (res.ok, res.error) == (False, "disk full")
    quiet = script(tmp_path / "quiet.sh", "#!/bin/sh\nexit 4\n")
    assert asyncio.run(run_script(str(quiet), {}, 5)).error == "exit code 4"
    slow = script(tmp_path / "slow.sh", "#!/bin/sh\nsleep 30\n")
    res = asyncio.run(run_script(str(slow), {"PATH": "/usr/bin:/bin"}, 0.3))
    assert res.error == "timed out after 0.3 s"
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    assert asyncio.run(run_script(str(plain), {}, 5)).error.startswith("cannot run ")  # type: ignore[union-attr]
    env = script_env({"MGPU_JOB_ID": "j1", "LD_PRELOAD": "evil.so", "MGPU_RUN_TAG": "t"}, "al", "x")
    assert env["MGPU_JOB_ID"] == "j1" and env["MGPU_JOB_USER"] == "al"
    assert env["MGPU_SCRIPT_CONTEXT"] == "x" and "MGPU_RUN_TAG" not in env
    assert env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD")  # the user's is not passed


# ---- prolog and epilog (end to end) ---------------------------------------------------


def test_prolog_failure_requeues_without_spending_retries_and_drains(
    tmp_path: Path, make_cluster: list[LocalCluster]
) -> None:
    prolog = script(
        tmp_path / "prolog.sh",
        "#!/bin/sh\n"
        "env | grep -E '^(MGPU_JOB_ID|MGPU_JOB_USER|MGPU_SCRIPT_CONTEXT|CUDA_VISIBLE_DEVICES"
        f"|SECRET)=' | sort > {tmp_path}/prolog-$MGPU_NODE_ID.env\n"
        f"if [ -e {tmp_path}/slow ]; then echo $$ > {tmp_path}/slow.pid; exec sleep 60; fi\n"
        'if [ "$MGPU_NODE_ID" = node001 ]; then\n'
        "  echo 'scratch disk full'; echo detail; exit 1\n"
        "fi\n",
    )
    config = (
        "scheduling: {node_failure_threshold: 2, max_retries: 0}\n"
        f"site: {{prolog: {prolog}, prolog_timeout: 10}}\n"
    )
    c = start(make_cluster, tmp_path, config)
    c.start_agent("node001", gpus=2)
    client = c.client()
    job = client.submit('echo "ran on $MGPU_NODE_ID"', gpus=1, env={"SECRET": "user-value"})
    node = c.wait_node("node001", "drained", timeout=60)
    assert "prolog failed: scratch disk full" in node["reason"], node
    shown = client.show(job.id)
    # Two failed starts, both free: with max_retries 0 a counted requeue would fail the job.
    assert shown["state"] == "queued" and shown["retries"] == 0, shown
    assert len(shown["attempts"]) == 2
    assert all("prolog failed" in (a["end_reason"] or "") for a in shown["attempts"])
    c.start_agent("node002", gpus=2)
    done = client.wait(job.id, timeout=30)
    assert done["state"] == "completed" and done["retries"] == 0, done
    assert client.logs(job.id) == "ran on node002\n"
    env = (tmp_path / "prolog-node002.env").read_text().splitlines()
    assert env == [
        "CUDA_VISIBLE_DEVICES=0",
        f"MGPU_JOB_ID={job.id}",
        f"MGPU_JOB_USER={ME}",
        "MGPU_SCRIPT_CONTEXT=prolog",
    ]  # and not the user's SECRET: the prolog runs as root

    # Cancelled while its prolog runs: the prolog is killed, the job never starts.
    (tmp_path / "slow").touch()
    slow = client.submit("echo never")
    pid = int(wait_for(lambda: (tmp_path / "slow.pid").read_text().strip(), what="prolog"))
    assert client.show(slow.id)["state"] == "running"
    client.cancel(slow.id)
    assert client.wait(slow.id, timeout=15)["state"] == "cancelled"
    wait_for(lambda: not psutil.pid_exists(pid), timeout=30, what="the prolog killed")
    assert client.logs(slow.id) == ""


def test_epilog_output_is_kept_and_its_failure_drains(
    tmp_path: Path, make_cluster: list[LocalCluster]
) -> None:
    flag = tmp_path / "fail-epilog"
    epilog = script(
        tmp_path / "epilog.sh",
        "#!/bin/sh\n"
        f'if [ -e {flag} ]; then echo "gpu reset failed"; echo detail; exit 2; fi\n'
        'echo "cleaned $MGPU_JOB_ID exit=$MGPU_JOB_EXIT_CODE ctx=$MGPU_SCRIPT_CONTEXT"\n',
    )
    c = start(make_cluster, tmp_path, f"site: {{epilog: {epilog}, epilog_timeout: 10}}\n")
    c.start_agent("node001", gpus=1)
    client = c.client()
    first = client.submit("echo out; exit 3")
    job = client.wait(first.id, timeout=30)
    assert (job["state"], job["exit_code"]) == ("failed", 3)
    logs = client.logs(first.id)
    assert logs.startswith("out\n")
    assert f"[epilog] cleaned {first.id} exit=3 ctx=epilog\n" in logs
    assert c.wait_node("node001", "online")["reason"] is None

    flag.touch()
    second = client.submit("echo fine")
    job = client.wait(second.id, timeout=30)
    assert (job["state"], job["exit_code"]) == ("completed", 0)  # its own result stands
    node = c.wait_node("node001", "drained")
    assert node["reason"] == "epilog failed: gpu reset failed"
    assert client.logs(second.id) == "fine\n[epilog] gpu reset failed\n[epilog] detail\n"


# ---- admission control ------------------------------------------------------------------


def _admit(adm: Admission, **fields: Any) -> Job:
    """Build the job `fields` describe and run the admission rules on it (no node known)."""
    spec = JobSpec(command="true", **fields)
    jobs = build_jobs(spec, ME, SubmitDefaults(), 0.0, lambda _block: "a1b2c3d4")
    ctx = AdmissionContext(
        nodes=[], request_for=_no_request, job_exists=lambda _: False, groups=unix_groups
    )
    asyncio.run(adm.admit(jobs, spec, ctx))
    return jobs[0]


def _no_request(job: Job) -> JobRequest:
    raise AssertionError("no node is known: nothing to judge the job against")


def test_admission_rules_unit(tmp_path: Path) -> None:
    adm = Admission(AdmissionConfig(max_time_per_job="1-00:00:00"))
    assert _admit(adm).time_limit == 86400  # the maximum is also the default
    with pytest.raises(SubmitError, match="asks for no time limit"):
        _admit(adm, time="UNLIMITED")
    slow = Admission(AdmissionConfig(validator="sleep 5", validator_timeout=0.3))
    with pytest.raises(SubmitError, match=r"validator did not answer within 0\.3 s"):
        _admit(slow)
    missing = Admission(AdmissionConfig(validator=str(tmp_path / "nope.sh")))
    with pytest.raises(SubmitError, match="validator cannot run"):
        _admit(missing)
    groups = Admission(AdmissionConfig(allowed_groups=["no-such-group-xyz"]))
    with pytest.raises(SubmitError, match=f"user {ME} may not submit"):
        _admit(groups)
    with pytest.raises(ValidationError, match="not a valid image"):
        JobSpec(command="true", image="--privileged")


def test_admission_refuses_with_one_sentence_audits_and_queues_nothing(
    tmp_path: Path, make_cluster: list[LocalCluster]
) -> None:
    validator = script(
        tmp_path / "job_validator.sh",
        f"#!/bin/sh\ncat > {tmp_path}/spec.json\n"
        f"if grep -q forbidden {tmp_path}/spec.json; then\n"
        "  echo 'commands may not say forbidden'; echo 'second line'; exit 1\nfi\n",
    )
    config = (
        "site:\n  admission:\n    max_gpus_per_job: 2\n    max_nodes_per_job: 1\n"
        f'    max_time_per_job: "1:00:00"\n    allowed_users: [{ME}]\n'
        f"    validator: {validator}\n"
    )
    c = start(make_cluster, tmp_path, config)
    c.start_agent("node001", gpus=4, extra=["--container-runtime", "none"])
    refusals = {
        ("--gpus", "3"): "the job asks for 3 GPUs but this cluster allows at most 2 per job",
        ("--nodes", "2", "--gpus-per-node", "1"): (
            "the job asks for 2 nodes but this cluster allows at most 1 per job"
        ),
        ("--time", "2:00:00"): (
            "the job's time limit 02:00:00 is more than this cluster allows per job (01:00:00)"
        ),
        ("--image", "busybox"): (
            "no node has a container runtime (podman, docker or apptainer) to run --image busybox"
        ),
        ("--name", "forbidden"): (
            "refused by the site's job validator: commands may not say forbidden"
        ),
    }
    for opts, message in refusals.items():
        res = c.cli("submit", *opts, "true")
        assert res.returncode != 0 and res.stderr == f"mgpu: error: {message}\n", (opts, res)
    with pytest.raises(MgpuError, match="user mallory may not submit jobs to this cluster"):
        c.client().submit("true", user="mallory")
    ok = c.cli("submit", "--gpus", "2", "true", check=True).stdout.strip()
    job = c.client().wait(ok, timeout=30)
    assert job["state"] == "completed" and job["time_limit"] == 3600
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert (spec["user"], spec["gpus"], spec["time_limit"]) == (ME, 2, 3600)
    assert spec["command"] == "true"
    assert [j["id"] for j in c.client().queue(all=True)["jobs"]] == [ok]  # nothing else queued
    events = [e for e in c.client().audit() if e["kind"] == "submit_refused"]
    assert len(events) == len(refusals) + 1
    assert any("commands may not say forbidden" in (e["detail"] or "") for e in events)
    assert c.client().nodes()[0]["features"] == []


# ---- containers (end to end) ----------------------------------------------------------

FAKE_PODMAN = r"""#!{python}
# A stand-in for podman: knows one image, records `run` command lines (with its own
# environment and its env file's mode), runs the command with only the environment passed
# by -e and --env-file (as a container would).
import json, os, stat, sys

args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("podman version 0.0-fake")
    sys.exit(0)
if args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] == "localhost/present:1" else 1)
if args[:1] == ["rm"]:
    sys.exit(0)
if args[:1] != ["run"]:
    sys.exit(125)
env, cwd, i, mode = {{"PATH": "/usr/bin:/bin"}}, None, 1, None
while args[i].startswith("-"):
    if args[i] in ("--name", "--user", "--device", "-v", "-w", "-e", "--env-file"):
        opt, val = args[i], args[i + 1]
        i += 2
        if opt in ("-e", "--env-file"):
            if opt == "--env-file":
                mode = stat.S_IMODE(os.stat(val).st_mode)
                with open(val, encoding="utf-8") as f:
                    items = f.read().splitlines()
            else:
                items = [val]
            for item in items:
                key, eq, value = item.partition("=")
                if eq:
                    env[key] = value
                elif key in os.environ:
                    env[key] = os.environ[key]
        elif opt == "-w":
            cwd = val
    else:
        i += 1
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "own_env": sorted(os.environ), "mode": mode}}) + "\n")
if cwd:
    os.chdir(cwd)
os.execvpe(args[i + 1], args[i + 1:], env)
"""


def test_container_jobs_with_a_runtime(tmp_path: Path, make_cluster: list[LocalCluster]) -> None:
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    runs = tmp_path / "podman-runs.jsonl"
    script(fakebin / "podman", FAKE_PODMAN.format(python=sys.executable, log=str(runs)))
    c = start(make_cluster, tmp_path, "")
    c.env["PATH"] = f"{fakebin}:{c.env['PATH']}"
    c.start_agent("node001", gpus=4, extra=["--container-runtime", "podman"])
    client = c.client()
    assert client.nodes()[0]["features"] == ["container", "podman"]
    assert "container,podman" in c.cli("nodes").stdout

    workdir = tmp_path / "work"
    workdir.mkdir()
    job = client.submit(
        'echo "$CUDA_VISIBLE_DEVICES|$MGPU_JOB_ID|$(pwd)|${HOME:-nohome}|$SECRET|$MGPU_RUN_TAG"'
        '"|$SPACED|$MULTI"',
        gpus=2,
        image="localhost/present:1",
        cwd=str(workdir),
        env={"SECRET": "s3", "SPACED": " a = b $HOME # ", "MULTI": "line1\nline2"},
    )
    done = client.wait(job.id, timeout=30)
    assert done["state"] == "completed", done
    assert done["image"] == "localhost/present:1"
    # Inside, the two allocated GPUs are 0 and 1; the host's HOME does not leak in; the
    # run's tag is there (the agent kills escaped processes by it); a value a line-based
    # env file cannot hold is left out, and the job's stderr says so.
    # The note goes to stderr and the echo to stdout: the log merges the two streams in
    # whatever order the agent read them, so neither line's position is asserted.
    out = client.logs(job.id).splitlines()
    (echoed,) = [line for line in out if line.startswith("0,1|")]
    assert echoed.startswith(f"0,1|{job.id}|{workdir}|nohome|s3|{job.id}.1.")
    assert echoed.endswith("| a = b $HOME # |"), out
    note = "mgpu: not passed into the container (a value a line-based env file cannot hold): "
    assert sorted(out) == sorted([echoed, note + "MULTI"]), out
    (record,) = [json.loads(line) for line in runs.read_text().splitlines()]
    argv = record["argv"]
    # The runtime ran as root with the agent's environment, not the job's: the job's
    # variables reached the container through a 0600 file, removed once the run ended.
    assert "SECRET" not in record["own_env"] and "MGPU_JOB_ID" not in record["own_env"]
    assert record["mode"] == 0o600
    env_file = argv[argv.index("--env-file") + 1]
    assert not os.path.exists(env_file)
    gpus = done["allocation"][0]["gpu_ids"]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == [f"nvidia.com/gpu={g}" for g in gpus]
    # A root agent gives the runtime the directory as its user entered it, pinned as a
    # mount point in its spool, unmounted at the run's end (mgpu.agent.bindmount).
    spool = tmp_path / "agent-node001" / "node-node001" / "spool"
    point = spool / f"{job.id}.1{bindmount.SUFFIX}" if os.geteuid() == 0 else workdir
    assert argv[argv.index("-v") + 1] == f"{point}:{workdir}"
    assert point == workdir or not point.exists()
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"

    missing = client.submit("true", image="localhost/absent:2")
    failed = client.wait(missing.id, timeout=30)
    assert failed["state"] == "failed", failed
    assert failed["reason"] == "node001: image localhost/absent:2 not found on node001 (podman)"
    assert failed["start_time"] is None and failed["retries"] == 0  # no GPU time spent
    assert len(runs.read_text().splitlines()) == 1
    assert c.wait_node("node001", "online")["reason"] is None  # not the node's fault


BUSYBOX_IMAGE = "localhost/mgpu-test-busybox:1"


def _podman_ready(conf: Path) -> str | None:
    """None if rootful podman can run the busybox image here, else why not."""
    if shutil.which("podman") is None or shutil.which("busybox") is None:
        return "podman or busybox-static is not installed"
    if os.geteuid() != 0:
        return "needs root (rootful podman)"
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def podman(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=env, capture_output=True, text=True, timeout=60, **kw
        )  # type: ignore[call-overload, no-any-return]

    if podman("image", "exists", BUSYBOX_IMAGE).returncode != 0:
        rootfs = conf.parent / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy(shutil.which("busybox") or "", rootfs / "bin" / "busybox")
        for name in ("sh", "true", "echo", "id", "pwd", "sleep", "cat", "env"):
            (rootfs / "bin" / name).symlink_to("busybox")
        tar = conf.parent / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        res = podman("import", str(tar), BUSYBOX_IMAGE)
        if res.returncode != 0:
            return f"podman import failed: {res.stderr.strip()}"
    res = podman("run", "--rm", "--network=host", BUSYBOX_IMAGE, "true")
    if res.returncode != 0:
        return f"podman cannot run containers here: {res.stderr.strip()[:200]}"
    return None


@pytest.fixture
def podman_conf(tmp_path: Path) -> Path:
    """A containers.conf for rootful podman on this VM, with the busybox image imported."""
    conf = tmp_path / "containers.conf"
    # This VM lacks CAP_SYS_RESOURCE and has hybrid cgroups: runc, and limits it may set.
    nofile = int(subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True).stdout)
    conf.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc=1000:1000"]\n'
        '[engine]\nruntime = "runc"\nevents_logger = "file"\n'
    )
    why = _podman_ready(conf)
    if why is not None:
        pytest.skip(why)
    return conf


def test_real_podman_job(
    tmp_path: Path, make_cluster: list[LocalCluster], podman_conf: Path
) -> None:
    """A real container: a busybox image imported from a tarball (no registry needed)."""
    conf = podman_conf
    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env["CONTAINERS_CONF"] = str(conf)
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    client = c.client()
    workdir = tmp_path / "w"
    workdir.mkdir()
    job = client.submit(
        'echo "$(id -u)|$(pwd)|[$CUDA_VISIBLE_DEVICES]|$MGPU_JOB_ID"; '
        "grep NoNewPrivs /proc/self/status; cat /etc/os-release",
        gpus=0,
        image=BUSYBOX_IMAGE,
        cwd=str(workdir),
    )
    done = client.wait(job.id, timeout=60)
    out = client.logs(job.id)
    assert done["state"] == "failed" and done["exit_code"] == 1, (done, out)  # no os-release
    assert out.startswith(f"{os.getuid()}|{workdir}|[]|{job.id}\n"), out
    # --security-opt=no-new-privileges: a setuid binary in the image cannot raise the job.
    assert "NoNewPrivs:\t1\n" in out, out

    # Cancelling kills the container (its shell ignores SIGTERM as PID 1; then SIGKILL).
    long = client.submit("sleep 300", gpus=0, image=BUSYBOX_IMAGE, cwd=str(workdir))
    wait_for(lambda: client.show(long.id)["start_time"], timeout=30, what="container started")
    client.cancel(long.id)
    assert client.wait(long.id, timeout=30)["state"] == "cancelled"
    name = f"mgpu-{long.id}-1-[0-9a-f]{{8}}"  # containers.container_name's form

    def gone() -> bool:  # no longer running (its removal is podman's --rm, see the note)
        res = subprocess.run(
            ["podman", "ps", "-q", "--filter", f"name=^{name}$"],
            env={**os.environ, "CONTAINERS_CONF": str(conf)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return res.returncode == 0 and not res.stdout.strip()

    wait_for(gone, timeout=30, interval=0.5, what=f"container {name} stopped")


# ---- deployment ---------------------------------------------------------------------------


def test_systemd_units(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MGPU_")}
    node = subprocess.run(
        [
            *(str(BIN / "mgpu"), "node", "--node-id", "gpu07", "--master-host", "10.0.0.5"),
            *("--master-port", "9000", "--state-dir", "st", "--token", "sekrit"),
            *("--container-runtime", "podman", "--print-systemd-unit"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=30,
    )
    assert node.returncode == 0, node.stderr
    unit = node.stdout
    exec_start = f"ExecStart={BIN / 'mgpu'} node --node-id gpu07 --master-host 10.0.0.5 "
    exec_start += f"--master-port 9000 --container-runtime podman --state-dir {tmp_path / 'st'}\n"
    assert exec_start in unit
    for line in ("Restart=on-failure", "RestartSec=5", "KillMode=process"):
        assert f"\n{line}\n" in unit
    assert "After=network-online.target\nWants=network-online.target\n" in unit
    assert "sekrit" not in unit and "EnvironmentFile=-/etc/mgpu/node.env" in unit
    assert unit.index("[Unit]") < unit.index("[Service]") < unit.index("[Install]")

    (tmp_path / "cluster.yaml").write_text("cluster: {name: t}\n")
    master = subprocess.run(
        [
            *(str(BIN / "mgpu_master"), "--host", "0.0.0.0", "--port", "8181"),
            *("--config", "cluster.yaml", "--state-dir", "ms", "--print-systemd-unit"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=30,
    )
    assert master.returncode == 0, master.stderr
    assert (
        f"\nExecStart={BIN / 'mgpu_master'} --host 0.0.0.0 --port 8181 "
        f"--config {tmp_path / 'cluster.yaml'} --state-dir {tmp_path / 'ms'}\n"
    ) in master.stdout
    assert "\nRestart=on-failure\n" in master.stdout and "KillMode=process" not in master.stdout
    assert "After=network-online.target" in master.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)  # a rebuild (sources changed) takes a minute or two; cached: seconds
def test_dist_executables_run_a_cluster(tmp_path: Path) -> None:
    dist = dist_dir()
    bindir = tmp_path / "opt-mgpu"  # outside the venv, with no Python environment around
    bindir.mkdir()
    for name in ("mgpu_master", "mgpu_node", "mgpu_client"):
        shutil.copy2(dist / name, bindir / name)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    version = subprocess.run(
        [str(bindir / "mgpu_client"), "--version"], capture_output=True, text=True, env=env
    )
    assert (version.returncode, version.stdout) == (0, "mgpu 0.1.0\n"), version.stderr
    port = free_port()
    state = tmp_path / "state"
    procs = []
    try:
        with open(tmp_path / "master.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(bindir / "mgpu_master"), "--port", str(port), "--state-dir", str(state)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=tmp_path,
                )
            )
        token = wait_for(
            lambda: (state / "admin-token").exists() and (state / "admin-token").read_text(),
            timeout=60,
            what="the master's admin token",
        ).strip()
        with open(tmp_path / "node.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        *(str(bindir / "mgpu_node"), "--node-id", "node001", "--fake-gpus", "1"),
                        *("--master-port", str(port), "--state-dir", str(state)),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=tmp_path,
                )
            )
        api = Client(f"127.0.0.1:{port}", token=token)
        wait_for(
            lambda: [n for n in api.nodes() if n["state"] == "online"],
            timeout=60,
            what="the node online",
        )
        client_env = {**env, "MGPU_TOKEN": token}
        run = subprocess.run(
            [
                *(str(bindir / "mgpu_client"), "--port", str(port), "submit", "--interactive"),
                "echo hello from $MGPU_NODE_ID",
            ],
            capture_output=True,
            text=True,
            env=client_env,
            timeout=90,
        )
        logs = (tmp_path / "master.log").read_text() + (tmp_path / "node.log").read_text()
        assert run.returncode == 0, (run.stderr, logs[-3000:])
        assert run.stdout == "hello from node001\n"
    finally:
        for p in procs:
            kill_group(p)


# A library that leaves a mark, named after the uid, in every process that loads it.
MARKER_LIB = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/loaded-by-uid-%d", MARK_DIR, (int)geteuid());
    close(open(path, O_CREAT | O_WRONLY, 0644));
}
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every account can use (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="mgpu-test-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_real_podman_runtime_never_gets_the_users_environment(
    tmp_path: Path, make_cluster: list[LocalCluster], podman_conf: Path, shared_dir: Path
) -> None:
    """The runtime runs as root: a user's LD_PRELOAD in its environment would run the
    user's code as root.  The job's variables reach the container through an env file."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the marker library")
    source = shared_dir / "mark.c"
    source.write_text(MARKER_LIB)
    lib = shared_dir / "mark.so"
    define = f'-DMARK_DIR="{shared_dir}"'
    subprocess.run([cc, "-shared", "-fPIC", define, "-o", str(lib), str(source)], check=True)
    subprocess.run(["true"], env={"LD_PRELOAD": str(lib)}, check=True)
    root_mark = shared_dir / "loaded-by-uid-0"
    assert root_mark.exists()  # the library works: loaded by root, it says so
    root_mark.unlink()

    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env["CONTAINERS_CONF"] = str(podman_conf)
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    admin = c.client()
    user = Client(c.address, token=admin.create_token("nobody")["token"], connect_timeout=2)
    env = {"LD_PRELOAD": str(lib), "MARK_ME": "seen-inside", "PATH": "/usr/bin:/bin"}
    job = user.submit('echo "[$MARK_ME|$MGPU_RUN_TAG]"; exec sleep 300', gpus=0,
                      image=BUSYBOX_IMAGE, cwd=str(shared_dir), env=env)  # fmt: skip
    wait_for(lambda: "[seen-inside|" in admin.logs(job.id), timeout=60, what="the job's output")
    # Inside: the job's variable, and the run's tag (taken by name from the runtime's own
    # environment: the agent finds escaped container processes by it).
    assert admin.logs(job.id).startswith(f"[seen-inside|{job.id}.1."), admin.logs(job.id)

    spool = tmp_path / "agent-node001" / "node-node001" / "spool"
    shim = psutil.Process(json.loads(next(spool.glob(f"{job.id}.*.run")).read_text())["pid"])
    root_side = [shim, *shim.children(recursive=True)]
    assert "podman" in {p.name() for p in root_side}, root_side
    for proc in root_side:
        assert proc.uids().effective == 0
        environ = proc.environ()
        assert "MARK_ME" not in environ and "LD_PRELOAD" not in environ, (proc, environ)
        assert environ["PATH"] == privileged.SAFE_PATH
    admin.cancel(job.id)
    assert admin.wait(job.id, timeout=30)["state"] == "cancelled"
    assert not root_mark.exists(), "a root process loaded the user's LD_PRELOAD"


def test_real_podman_job_of_another_user_gets_its_pinned_directory(
    tmp_path: Path, make_cluster: list[LocalCluster], podman_conf: Path, shared_dir: Path
) -> None:
    """A root runtime mounts the directory the job's user entered, from a mount point in
    the agent's spool (mgpu.agent.bindmount); the job reads and writes it there, and the
    mount goes when the run ends, by itself or cancelled."""
    exp = shared_dir / "exp"
    exp.mkdir()
    (exp / "mine.txt").write_text("mine\n")
    os.chown(exp, 65534, 65534)
    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env["CONTAINERS_CONF"] = str(podman_conf)
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    admin = c.client()
    user = Client(c.address, token=admin.create_token("nobody")["token"], connect_timeout=2)
    spool = tmp_path / "agent-node001" / "node-node001" / "spool"

    job = user.submit('echo "$(id -u)|$(pwd)|$(cat mine.txt)"; echo made > made.txt',
                      gpus=0, image=BUSYBOX_IMAGE, cwd=str(exp))  # fmt: skip
    done = admin.wait(job.id, timeout=60)
    assert done["state"] == "completed", (done, admin.logs(job.id))
    assert admin.logs(job.id) == f"65534|{exp}|mine\n"
    made = exp / "made.txt"
    assert made.read_text() == "made\n" and made.stat().st_uid == 65534
    point = spool / f"{job.id}.1{bindmount.SUFFIX}"
    assert not point.exists() and not bindmount.mounted(str(point))

    long = user.submit("echo ready; exec sleep 300", gpus=0, image=BUSYBOX_IMAGE, cwd=str(exp))
    wait_for(lambda: "ready" in admin.logs(long.id), timeout=60, what="the container running")
    point = spool / f"{long.id}.1{bindmount.SUFFIX}"
    assert bindmount.mounted(str(point)) and (point / "made.txt").exists()
    admin.cancel(long.id)
    assert admin.wait(long.id, timeout=30)["state"] == "cancelled"
    assert not point.exists() and not bindmount.mounted(str(point))
    assert sorted(os.listdir(exp)) == ["made.txt", "mine.txt"]  # unmounting removed nothing


# ---- a root runtime never opens or runs what the user names ---------------------------
# docker and rootful podman run as the agent (root), keeping the job's uid inside with
# `--user`.  What a job's user names outside the container (a batch job's -o/-e files, a
# job script, the submit directory) must never be opened or run with the runtime's ids.

STAND_IN = """#!/bin/sh
# A stand-in for rootful podman where no runtime runs: every image is present; each call
# but --version records its command, uid and directory, and runs nothing.
case $1 in
  --version) echo "podman version 0.0-stand-in" ;;
  *) echo "$1 $(id -u) $(pwd)" >> {log} ;;
esac
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a root agent runs the runtime")


@pytest.fixture(params=["stand-in", "podman"])
def rootful(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str], str]:
    """(runtime executable, what the agent's environment adds, an image it has): the
    stand-in runtime, and the machine's real rootful podman (skipped where it cannot run)."""
    if request.param == "podman":
        conf: Path = request.getfixturevalue("podman_conf")
        return shutil.which("podman") or "podman", {"CONTAINERS_CONF": str(conf)}, BUSYBOX_IMAGE
    return _stand_in(tmp_path), {}, "localhost/any:1"


def _stand_in(tmp_path: Path) -> str:
    """The stand-in runtime, logging to `stand-in-runs` (its directory is for PATH)."""
    fakebin = tmp_path / "stand-in"
    fakebin.mkdir()
    return str(script(fakebin / "podman", STAND_IN.format(log=tmp_path / "stand-in-runs")))


@pytest.fixture
def user_tree() -> Iterator[Path]:
    """/tmp/X (0755): `work`, the job user's (nobody's) submit dir, and `root-only` (0700),
    where nobody may create a file but root may."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-test-"))
    top.chmod(0o755)
    (top / "work").mkdir()
    os.chown(top / "work", 65534, 65534)
    (top / "root-only").mkdir(mode=0o700)
    yield top
    shutil.rmtree(top, ignore_errors=True)


BATCH_IN_IMAGE = (
    "a Slurm batch job cannot run in --image yet: its -o/-e files are written on the node, "
    "outside the container; submit it without the slurm block's batch, or without --image"
)


@needs_root
def test_a_batch_job_in_an_image_is_refused_at_submit(
    tmp_path: Path,
    make_cluster: list[LocalCluster],
    rootful: tuple[str, dict[str, str], str],
    user_tree: Path,
) -> None:
    """Through the API, as the CLI's batch script + --image is: a root runtime's wrapper
    would have opened `-o /etc/NAME` (appended to it, with --open-mode append) as root."""
    exe, env, image = rootful
    c = start(make_cluster, tmp_path, "scheduling: {kill_grace: 1}\n")
    c.env.update(env)
    c.env["PATH"] = f"{os.path.dirname(exe)}:{c.env['PATH']}"
    c.start_agent("node001", gpus=1, extra=["--container-runtime", "podman"])
    admin = c.client()
    user = Client(c.address, token=admin.create_token("nobody")["token"], connect_timeout=2)
    work, target = user_tree / "work", user_tree / "root-only" / "cron"
    block = {"batch": True, "submit_dir": str(work), "output": str(target), "open_mode": "append"}
    try:
        job = user.submit("echo '* * * * * root pwned'", gpus=0, image=image, cwd=str(work),
                          slurm=block)  # fmt: skip
    except MgpuError as e:
        refused: str | None = str(e)
    else:  # as before: it ran, and its wrapper opened the file as root
        admin.wait(job.id, timeout=60)
        refused = None
    assert not target.exists(), f"made by uid {target.stat().st_uid}: {target.read_text()!r}"
    assert refused is not None and BATCH_IN_IMAGE in refused, refused
    assert admin.queue(all=True)["jobs"] == []
    # The CLI's own way in (a script with #SBATCH lines) is refused as before.
    (work / "job.sh").write_text(f"#!/bin/sh\n#SBATCH -o {target}\necho hi\n")
    res = c.cli("submit", "--gpus", "0", "--image", image, str(work / "job.sh"))
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res
    assert "a job script cannot run in --image yet" in res.stderr


NOBODY = (65534, 65534, [65534])


def _launch_of_nobody(image: str, work: Path, **fields: Any) -> Launch:
    fields.setdefault("argv", ["sh", "-c", "echo '* * * * * root pwned'"])
    return Launch(job_id="7", epoch=1, env={}, grant=Grant(gpus=[]), image=image, cwd=str(work),
                  user="nobody", **fields)  # fmt: skip


async def _start_as_the_agent_does(spool: Path, exe: str, msg: Launch) -> str | None:
    """`msg` started for nobody as Agent.launch starts it (SiteHooks.request, then the
    launcher); why the launch was refused, or None once the run has ended."""
    launcher = Launcher(spool, lambda *a: None)
    hooks = SiteHooks(SimpleNamespace(), launcher, "node001")
    hooks.runtime = Runtime("podman", exe)
    try:
        run = launcher.launch(hooks.request(msg, {}, NOBODY, []))
    except LaunchError as e:
        hooks.discard(msg.job_id, msg.epoch)  # as Agent.launch does
        return str(e)
    await asyncio.wait_for(run.exited.wait(), 60)
    await launcher.kill_leftovers(run)
    await hooks.after(run)  # the mount of its working directory goes
    return None


@needs_root
def test_a_root_runtime_never_opens_a_batch_jobs_files_or_runs_its_script(
    tmp_path: Path,
    rootful: tuple[str, dict[str, str], str],
    user_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What an older master (or a forged launch) still sends: the agent itself refuses to
    open a batch job's -o/-e files, or to run a job script, with a root runtime's ids."""
    exe, env, image = rootful
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the agent's own runtime settings
    work, root_only = user_tree / "work", user_tree / "root-only"
    spool = tmp_path / "spool"
    cron = root_only / "cron"
    batch = _launch_of_nobody(image, work, output_file=str(cron), open_append=True)
    refused = asyncio.run(_start_as_the_agent_does(spool, exe, batch))
    assert not cron.exists(), f"made by uid {cron.stat().st_uid}: {cron.read_text()!r}"
    assert refused == (
        "a Slurm batch job cannot run in --image here: its -o/-e files are opened only as "
        "its user, and this node's container runtime runs as the agent"
    )
    mark = root_only / "mark"
    script_job = _launch_of_nobody(image, work, script=f"#!/bin/sh\nid -u > {mark}\n")
    refused = asyncio.run(_start_as_the_agent_does(spool, exe, script_job))
    assert not mark.exists(), f"the script ran as uid {mark.read_text()!r}"
    assert refused == (
        "a job script cannot run in --image: it would run outside the container, as the "
        "agent's user, not as its own"
    )
    assert sorted(os.listdir(spool)) == []  # nothing left of either launch
    assert not bindmount.mounted(str(spool / f"7.1{bindmount.SUFFIX}"))


@needs_root
def test_a_root_runtime_starts_outside_the_users_directory(tmp_path: Path, user_tree: Path) -> None:
    """The shim in front of a root runtime runs as root: it must not enter the directory
    the user named (their path, resolved by root); the container gets it pinned, as `-w`
    (with real podman: test_real_podman_job_of_another_user_gets_its_pinned_directory)."""
    exe, job = _stand_in(tmp_path), _launch_of_nobody("localhost/any:1", user_tree / "work")
    assert asyncio.run(_start_as_the_agent_does(tmp_path / "spool", exe, job)) is None
    assert (tmp_path / "stand-in-runs").read_text() == "run 0 /\n"


@needs_root
def test_an_image_a_root_runtime_would_read_as_its_option_is_refused(
    tmp_path: Path, user_tree: Path
) -> None:
    """The master refuses such a name at submit; the agent does not rely on it: `podman
    run ... --user=0:0 busybox sh` would run the job as root inside."""
    exe, log = _stand_in(tmp_path), tmp_path / "stand-in-runs"
    msg = _launch_of_nobody("--user=0:0", user_tree / "work", argv=["busybox", "sh"])
    why = "--image '--user=0:0' is not a valid image name or .sif path"
    assert asyncio.run(_start_as_the_agent_does(tmp_path / "spool", exe, msg)) == why
    exits: list[Exited] = []
    hooks = SiteHooks(SimpleNamespace(report_exit=exits.append), Any, "node001")
    hooks.runtime = Runtime("podman", exe)
    assert asyncio.run(hooks._check_image(msg)) is False  # before its `image exists`
    assert [(e.launch_error, e.fatal) for e in exits] == [(why, True)]
    assert not log.exists()  # the runtime was never run
