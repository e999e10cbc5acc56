"""`srun` steps inside a job on a Kubernetes partition (a real Kubernetes 1.20,
tests/kubecluster.py): each Pod of the job runs mgpu's pod agent (`kubernetes.steps`),
which dials the master from the Pod network with the job's credential, over TLS pinned
to the cluster's CA, and runs the job's steps sent to its Pod's node.

A batch script on two Pods runs `srun` across both (four tasks, their SLURM_PROCID,
LOCALID and NODEID, in the Pod of their node, with the GPU the container sees), its
output in the job's, srun's exit codes, and the steps' sacct rows; a 1-node job runs a
step in its own Pod.  The Pods' image is a static busybox: the test's own Python (the venv
and this checkout's source) reaches them as hostPath volumes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster
from kubecluster import IMAGE_BUSYBOX, KubeCluster, free_port, wait_for
from kubemaster import host_volumes, job_pods
from mgpu import Client
from mgpu.errors import MgpuError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {"PATH": "/bin:/usr/bin", "HOME": "/tmp"}
SLURM = {"batch": True, "partition": "k8s", "job_name_default": "job.sh", "submit_dir": "/"}
SHIM = '#!/bin/sh\nPYTHONPATH={src} exec {python} -m {command} "$@"\n'


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a site puts in its image: `mgpu` and Slurm's `srun`, here shims of the
    test's Python and this checkout's source."""
    where = tmp_path_factory.mktemp("podbin")
    where.chmod(0o755)
    for name, command in (("mgpu", "mgpu"), ("srun", "mgpu.slurm srun")):
        shim = where / name
        shim.write_text(SHIM.format(src=SRC, python=sys.executable, command=command))
        shim.chmod(0o755)
    return where


def _config(kube: KubeCluster, bin_dir: Path, port: int) -> str:
    volumes, volume_mounts = host_volumes([SRC, bin_dir])
    return f"""
cluster: {{name: lab}}
networking: {{timeout: 20}}
scheduling: {{kill_grace: 2}}
partitions:
  - name: k8s
    default: true
    kubernetes:
      kubeconfig: {kube.kubeconfig}
      namespace: default
      image: {IMAGE_BUSYBOX}
      unschedulable_timeout: 30
      requeue_backoff: 1
      steps: {{master: "{kube.vc.gateway_ip}:{port}", bin: {bin_dir}, agent_wait: 60}}
      pod_template:
        spec:
          volumes: [{volumes}]
          containers:
            - name: main
              workingDir: /tmp
              volumeMounts: [{volume_mounts}]
"""


class _PodNetworkMaster(LocalCluster):
    """A master the Pods reach: bound to every address (the test cluster's gateway
    too), so it serves TLS, as a master on a real network does."""

    def start_master(self, wait: bool = True) -> subprocess.Popen[bytes]:
        argv = [str(BIN / "mgpu"), "master", "--host", "0.0.0.0", "--port", str(self.port)]
        argv += ["--state-dir", str(self.state_dir)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        self.master = self._spawn(argv, self.root / "master.log")
        wait_for("the master's tokens", self._load_tokens, 60)
        return self.master


@contextlib.contextmanager
def pod_network_master(kube: KubeCluster, bin_dir: Path, root: Path) -> Iterator[LocalCluster]:
    """A master of the partition whose Pods run `bin_dir`'s mgpu, once both Nodes are its."""
    port = free_port()
    cluster = _PodNetworkMaster(root, _config(kube, bin_dir, port))
    cluster.port = port
    cluster.address = f"127.0.0.1:{port}"
    cluster.env["MGPU_MASTER"] = cluster.address
    try:
        cluster.start_master()

        def online() -> bool:
            nodes = cluster.client().nodes()
            ours = [n for n in nodes if n.get("kubernetes")]
            return len(ours) == 2 and all(n["state"] == "online" for n in nodes)

        wait_for("both Nodes as mgpu nodes", online, 120)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def master(
    kube: KubeCluster, bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with pod_network_master(kube, bin_dir, tmp_path_factory.mktemp("kmaster")) as cluster:
        yield cluster


def _sacct(master: LocalCluster, token: str, job_id: str) -> list[str]:
    done = subprocess.run(
        [str(BIN / "mgpu"), "sacct", "-j", job_id, "-n", "-P", "--format=JobID,State,ExitCode"],
        env={**master.env, "MGPU_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


TWO_NODES = """\
#!/bin/sh
srun -N2 --ntasks-per-node=2 sh -c 'echo "task $SLURM_PROCID local $SLURM_LOCALID \
node $SLURM_NODEID on $(hostname) gpu $CUDA_VISIBLE_DEVICES"'
echo "first=$?"
srun -n2 sh -c 'echo "exiting $SLURM_PROCID"; exit $((SLURM_PROCID + 3))'
echo "second=$?"
"""


def test_srun_steps_run_across_the_jobs_two_pods(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    job_id = nobody.submit_script(
        TWO_NODES, name="job.sh", nodes=2, gpus_per_node=1, env=ENV, slurm=SLURM
    ).id

    def both() -> dict[str, str] | None:  # rank → its Pod's name, once both are made
        pods = job_pods(kube, f"mgpu.io/job={job_id}")
        names = {p["metadata"]["labels"]["mgpu.io/rank"]: p["metadata"]["name"] for p in pods}
        return names if len(names) == 2 else None

    names = wait_for("the job's two pods", both, 120)
    job = nobody.wait(job_id, timeout=240)
    out = nobody.logs(job_id)
    assert job["state"] == "completed", (job, out, (master.root / "master.log").read_text()[-3000:])
    tasks = sorted(line for line in out.splitlines() if line.startswith("task "))
    assert tasks == [
        f"task 0 local 0 node 0 on {names['0']} gpu 0",
        f"task 1 local 1 node 0 on {names['0']} gpu 0",
        f"task 2 local 0 node 1 on {names['1']} gpu 0",
        f"task 3 local 1 node 1 on {names['1']} gpu 0",
    ], out
    assert "first=0" in out and "second=4" in out, out  # srun's: its tasks' highest code
    assert sorted(x for x in out.splitlines() if x.startswith("exiting")) == [
        "exiting 0",
        "exiting 1",
    ]
    rows = _sacct(master, nobody_token, job_id)
    assert f"{job_id}.0|COMPLETED|0:0" in rows, rows
    assert f"{job_id}.1|FAILED|4:0" in rows, rows
    wait_for("the job's pods gone", lambda: not job_pods(kube, f"mgpu.io/job={job_id}"), 60)


def test_a_step_runs_in_a_one_node_jobs_pod(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    script = (
        '#!/bin/sh\nsrun sh -c \'echo "step in $(hostname) as $(id -u)"; exit 7\'\necho "srun=$?"\n'
    )
    job_id = nobody.submit_script(script, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the job running", lambda: nobody.show(job_id)["state"] != "queued", 120)
    [pod] = wait_for("the job's pod", lambda: job_pods(kube, f"mgpu.io/job={job_id}"), 120)
    job = nobody.wait(job_id, timeout=180)
    out = nobody.logs(job_id)
    assert job["state"] == "completed", (job, out)
    uid = pod["spec"]["containers"][0]["securityContext"]["runAsUser"]
    assert out.splitlines() == [
        f"step in {pod['metadata']['name']} as {uid}",
        f"srun: error: {job['pods'][0]['node']}: task 0: Exited with exit code 7",  # srun's
        "srun=7",
    ], out
    assert f"{job_id}.0|FAILED|7:0" in _sacct(master, nobody_token, job_id)


def _scancel(master: LocalCluster, token: str, *args: str) -> None:
    """`scancel ARGS` as the token's user; it must say nothing failed."""
    done = subprocess.run(
        [str(BIN / "mgpu"), "scancel", *args],
        env={**master.env, "MGPU_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


TRAPS_USR1 = """\
#!/bin/sh
trap 'echo "got USR1"; exit 0' USR1
echo ready
while :; do sleep 1; done
"""


def test_the_time_limits_signal_warning_reaches_the_batch_script(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    """`--time=1 --signal=B:USR1@50`: the pod agent signals the batch script 50 s before
    its one-minute limit, as slurmstepd would; its trap ends the job before the limit."""
    job_id = nobody.submit_script(
        TRAPS_USR1, name="job.sh", gpus=1, env=ENV, slurm=SLURM, time="1", signal="B:USR1@50"
    ).id
    job = nobody.wait(job_id, timeout=240)
    out = nobody.logs(job_id)
    assert job["state"] == "completed", (job, out)
    assert out.splitlines() == ["ready", "got USR1"], out


def test_scancel_signal_reaches_the_batch_script_in_its_pod(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    """`scancel --signal=USR1 -b`: the pod agent signals the batch script, whose trap
    writes a line that `mgpu logs` shows; scancel says nothing failed."""
    job_id = nobody.submit_script(TRAPS_USR1, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the script ready", lambda: "ready" in nobody.logs(job_id), 180)
    # Its Pod's agent connects beside the script: a signal sent before waits for it.
    _scancel(master, nobody_token, "--signal=USR1", "-b", job_id)
    job = nobody.wait(job_id, timeout=120)
    out = nobody.logs(job_id)
    assert job["state"] == "completed", (job, out)
    assert out.splitlines() == ["ready", "got USR1"], out


def test_a_script_that_traps_nothing_dies_of_scancel_signal(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    """`scancel --signal=USR1 --full` (the batch script too, as Slurm's `-f`): the
    script traps nothing and dies of it, as on Slurm (before, as its container's pid 1,
    it ignored the signal and ran on)."""
    script = "#!/bin/sh\necho ready\nsleep 300\necho after-the-sleep\n"
    job_id = nobody.submit_script(script, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the script ready", lambda: "ready" in nobody.logs(job_id), 180)
    [pod] = job_pods(kube, f"mgpu.io/job={job_id}")
    assert pod["spec"]["shareProcessNamespace"] is True
    _scancel(master, nobody_token, "--signal=USR1", "--full", job_id)
    job = nobody.wait(job_id, timeout=120)
    out = nobody.logs(job_id)
    assert job["state"] == "failed" and job["exit_code"] == -10, (job, out)  # USR1's death
    assert "after-the-sleep" not in out, out


def test_a_script_killed_by_a_signal_reads_as_slurms_0_9(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    """A batch script killed by SIGKILL: Kubernetes says exit code 137, as for `exit 137`;
    `mgpu pod-init` tells the death by signal, so the job is FAILED `0:9` as on Slurm
    (was `137:0`), and one that exits 137 stays `137:0`."""
    killed = nobody.submit_script(
        "#!/bin/sh\necho before\nkill -9 $$\necho after\n",
        name="job.sh", gpus=1, env=ENV, slurm=SLURM,
    ).id  # fmt: skip
    exits = nobody.submit_script(
        "#!/bin/sh\necho Killed\nexit 137\n", name="job.sh", gpus=1, env=ENV, slurm=SLURM
    ).id
    job = nobody.wait(killed, timeout=180)
    out = nobody.logs(killed)
    assert (job["state"], job["exit_code"]) == ("failed", -9), (job, out)
    assert out == "before\n", out
    assert f"{killed}|FAILED|0:9" in _sacct(master, nobody_token, killed)
    job = nobody.wait(exits, timeout=180)
    assert (job["state"], job["exit_code"]) == ("failed", 137), job
    assert f"{exits}|FAILED|137:0" in _sacct(master, nobody_token, exits)


def test_a_cancels_sigterm_reaches_the_batch_script_through_pod_init(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    """`mgpu cancel`: the kubelet sends SIGTERM to the container's first process, now
    `mgpu pod-init`, which sends it on to the batch script: its trap runs within the kill
    grace and its line is in the job's output."""
    script = (
        "#!/bin/sh\ntrap 'echo got-TERM; exit 0' TERM\necho ready\nwhile :; do sleep 0.2; done\n"
    )
    job_id = nobody.submit_script(script, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the script ready", lambda: "ready" in nobody.logs(job_id), 180)
    [pod] = job_pods(kube, f"mgpu.io/job={job_id}")
    assert "pod-init" in " ".join(pod["spec"]["containers"][0]["command"])
    nobody.cancel(job_id)
    assert nobody.wait(job_id, timeout=120)["state"] == "cancelled"
    wait_for("the trap's line", lambda: "got-TERM" in nobody.logs(job_id), 60)
    assert nobody.logs(job_id).splitlines() == ["ready", "got-TERM"]


def test_srun_pty_into_a_running_job_is_a_terminal_in_its_pod(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    """`srun --jobid=ID --pty /bin/sh` from outside the job (as `kubectl exec -it`): a
    shell on a pty in the job's Pod, of the user's terminal's size, its exit code srun's."""
    job_id = nobody.submit_script(TRAPS_USR1, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the script ready", lambda: "ready" in nobody.logs(job_id), 180)
    ours, theirs = os.openpty()
    fcntl.ioctl(theirs, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
    env = {**master.env, "MGPU_TOKEN": nobody_token, "PYTHONPATH": str(SRC)}
    srun = [sys.executable, "-m", "mgpu.slurm", "srun", f"--jobid={job_id}", "--pty", "/bin/sh"]
    proc = subprocess.Popen(
        srun, stdin=theirs, stdout=theirs, stderr=theirs, env=env, start_new_session=True
    )
    seen = b""

    def shown(pattern: bytes) -> bool:
        nonlocal seen
        if select.select([ours], [], [], 0.2)[0]:
            with contextlib.suppress(OSError):
                seen += os.read(ours, 65536)
        return pattern in seen

    try:
        wait_for("the shell's prompt", lambda: shown(b"$ "), 120)
        os.write(ours, b"tty; stty size; echo hi-$((6*7)); exit 3\n")
        wait_for("the shell's answers", lambda: shown(b"hi-42"), 60)
        assert proc.wait(timeout=60) == 3, seen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        os.close(ours)
        os.close(theirs)
    assert b"/dev/pts/" in seen and b"31 101" in seen, seen  # a pty, the user's size
    nobody.cancel(job_id)
    assert nobody.wait(job_id, timeout=60)["state"] == "cancelled"


def test_a_step_goes_on_through_a_master_restart(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str, bin_dir: Path
) -> None:
    """The master is killed while a step runs in the job's Pod and started again: the
    step is followed again (the Node's hello reports it, its Pod's agent says it runs it),
    and its end reaches srun and sacct.  Before, the restarted master took it for lost and
    dropped its end.  (Last in the module: it restarts the module's master.)"""
    go = bin_dir / f"go-{os.getpid()}"  # a hostPath volume: the Pod sees it appear
    script = (
        "#!/bin/sh\n"
        f"srun sh -c 'echo step-up; while [ ! -e {go} ]; do sleep 0.2; done; "
        "echo step-done; exit 5'\n"
        'echo "srun=$?"\n'
    )
    job_id = nobody.submit_script(script, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    wait_for("the step running", lambda: "step-up" in nobody.logs(job_id), 180)
    assert master.master is not None
    master.master.kill()
    master.master.wait(timeout=30)
    master.start_master()

    def online() -> bool:
        try:
            nodes = master.client().nodes()
        except MgpuError:  # not listening yet
            return False
        return [n["state"] for n in nodes if n.get("kubernetes")] == ["online", "online"]

    wait_for("both Nodes online again", online, 120)
    go.touch()
    job = nobody.wait(job_id, timeout=180)
    out = nobody.logs(job_id)
    log = (master.root / "master.log").read_text()[-3000:]
    assert job["state"] == "completed", (job, out, log)
    assert out.splitlines()[0] == "step-up" and "step-done" in out, out
    assert out.splitlines()[-1] == "srun=5", out  # the step's own exit code, through srun
    assert f"{job_id}.0|FAILED|5:0" in _sacct(master, nobody_token, job_id)
