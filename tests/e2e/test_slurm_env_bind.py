"""Issue 31, items 1, 4 and 10, end to end: `sbatch` scripts run by a real master and
agents (fake GPUs), through the same `sbatch`/`srun`/`squeue` a job finds on its PATH.

* item 1: what the script exported before `srun` (MASTER_ADDR, MASTER_PORT, ...) is what
  every task sees, and `srun --export` chooses the tasks' environment as Slurm's;
* item 4: `--gpu-bind` decides each task's CUDA_VISIBLE_DEVICES (none, single, map_gpu,
  mask_gpu, verbose; the job's own as its steps' default); a bad value is Slurm's sentence;
* item 10: a dependency that can never be met, and a --time over the partition's, leave
  the job pending with Slurm's reason in squeue."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster, local_cluster, wait_for

CONFIG = "partitions:\n  - {name: gpu, default: true}\n  - {name: short, max_time: '1:00:00'}\n"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master and two agents with 4 fake GPUs each."""
    with local_cluster(tmp_path_factory.mktemp("envbind"), 2, 4, config=CONFIG) as cluster:
        yield cluster


def run(
    c: LocalCluster, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mgpu"), *argv],
        capture_output=True,
        text=True,
        env={**c.env, **(env or {})},
        timeout=120,
    )


def sbatch(c: LocalCluster, *argv: str, env: dict[str, str] | None = None) -> str:
    res = run(c, "sbatch", "--parsable", *argv, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def batch_output(c: LocalCluster, tmp_path: Path, script: str, *argv: str, **env: str) -> str:
    """Run `script` with sbatch ARGV; its output, once it completed."""
    path = tmp_path / "job.sh"
    path.write_text(script)
    job_id = sbatch(c, f"--chdir={tmp_path}", *argv, str(path), env=env)
    job = c.client().wait(job_id, timeout=120)
    out = c.client().logs(job_id)
    assert job["state"] == "completed", out
    return out


def lines(out: str, prefix: str) -> list[str]:
    return sorted(line for line in out.splitlines() if line.startswith(prefix))


def test_srun_tasks_see_what_the_script_exported(c: LocalCluster, tmp_path: Path) -> None:
    script = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
echo "script ${MASTER_ADDR-unset} ${WORLD_SIZE-unset} $MASTER_PORT"
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
export MASTER_PORT=23456 WORLD_SIZE=11 MYVAR=mine
srun bash -c 'echo "all $SLURM_PROCID $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $MYVAR"'
srun --export=NONE /bin/bash -c 'echo "none $SLURM_PROCID ${MYVAR-unset} ${MASTER_PORT-unset} \
$SLURM_JOB_ID"'
srun --export=MYVAR,EXTRA=x /bin/bash -c 'echo "some $SLURM_PROCID $MYVAR $EXTRA \
${MASTER_ADDR-unset}"'
"""
    # The submitter's own MASTER_PORT reaches the script, as Slurm's --export=ALL.
    out = batch_output(c, tmp_path, script, MASTER_PORT="999")
    assert lines(out, "script ") == ["script unset unset 999"]  # mgpu set none of its own
    alls = [line.split() for line in lines(out, "all ")]
    assert [a[1] for a in alls] == ["0", "1"]
    first = {a[2] for a in alls}
    assert len(first) == 1 and first != {"unset"}
    assert {tuple(a[3:]) for a in alls} == {("23456", "11", "mine")}
    nones = [line.split() for line in lines(out, "none ")]
    assert [n[:4] for n in nones] == [
        ["none", "0", "unset", "unset"],
        ["none", "1", "unset", "unset"],
    ]
    assert all(n[4].isdigit() for n in nones)  # SLURM_* still set, as Slurm's
    assert lines(out, "some ") == ["some 0 mine x unset", "some 1 mine x unset"]


def test_gpu_bind_decides_each_tasks_gpus(c: LocalCluster, tmp_path: Path) -> None:
    script = """#!/bin/bash
#SBATCH -N 1 -n 4 --gpus-per-task=1
show='echo "$0 $SLURM_LOCALID $CUDA_VISIBLE_DEVICES"'
srun bash -c "$show" default
srun --gpu-bind=none bash -c "$show" none
srun --gpu-bind=single:2 bash -c "$show" single
srun --gpu-bind=map_gpu:3,2 bash -c "$show" map
srun --gpu-bind=mask_gpu:0x3,0xc bash -c "$show" mask
srun -n1 --gpus-per-task=4 --gpu-bind=verbose,map_gpu:1 true
srun --gpu-bind=sideways true
echo "bad rc=$?"
"""
    out = batch_output(c, tmp_path, script)
    own = lines(out, "default ")
    assert len({line.split()[2] for line in own}) == 4  # each task its own GPU
    assert all(len(line.split()[2].split(",")) == 1 for line in own)
    every = sorted(line.split()[2] for line in own)
    everything = ",".join(every)
    assert lines(out, "none ") == [f"none {t} {everything}" for t in range(4)]
    assert [line.split()[2] for line in lines(out, "single ")] == [
        every[0],
        every[0],
        every[1],
        every[1],
    ]
    assert lines(out, "map ") == ["map 0 3", "map 1 2", "map 2 3", "map 3 2"]
    masked = [line.split()[2] for line in lines(out, "mask ")]
    assert masked == ["0,1", "2,3", "0,1", "2,3"]
    verbose = "gpu-bind: usable_gres=0x2; bit_alloc=0xF; local_inx=0; global_list=1; local_list=1"
    assert verbose in out.splitlines()
    assert "srun: error: Invalid --gpu-bind argument: gpu:sideways" in out
    assert "bad rc=1" in out


def test_the_jobs_gpu_bind_is_its_steps_and_a_bad_one_is_refused(
    c: LocalCluster, tmp_path: Path
) -> None:
    script = """#!/bin/bash
#SBATCH -N 1 -n 2 --gpus-per-task=2 --gpu-bind=none
srun bash -c 'echo "task $SLURM_LOCALID $CUDA_VISIBLE_DEVICES $SLURM_GPU_BIND"'
"""
    out = batch_output(c, tmp_path, script)
    seen = lines(out, "task ")
    assert len(seen) == 2 and {line.split()[3] for line in seen} == {"none"}
    assert all(len(line.split()[2].split(",")) == 4 for line in seen)  # both see all 4
    res = run(c, "sbatch", "--gpu-bind=sideways", "--wrap", "true")
    assert res.returncode != 0
    assert res.stderr == "sbatch: error: Invalid --gpu-bind argument: gpu:sideways\n"


def squeue_reason(c: LocalCluster, job_id: str) -> tuple[str, str]:
    res = run(c, "squeue", "-h", "-j", job_id, "-o", "%t|%r")
    assert res.returncode == 0, res.stderr
    state, reason = res.stdout.strip().split("|")
    return state, reason


def test_squeue_says_dependency_never_satisfied_and_partition_time_limit(
    c: LocalCluster,
) -> None:
    failed = sbatch(c, "--wrap", "exit 1")
    assert c.client().wait(failed, timeout=60)["state"] == "failed"
    never = sbatch(c, f"--dependency=afterok:{failed}", "--wrap", "true")
    killed = sbatch(
        c, f"--dependency=afterok:{failed}", "--kill-on-invalid-dep=yes", "--wrap", "true"
    )
    over = sbatch(c, "-p", "short", "-t", "2:00:00", "--wrap", "true")
    try:
        wait_for(lambda: squeue_reason(c, never) == ("PD", "DependencyNeverSatisfied"), 60.0)
        wait_for(lambda: squeue_reason(c, over) == ("PD", "PartitionTimeLimit"), 60.0)
        assert c.client().wait(killed, timeout=60)["state"] == "cancelled"
        # Lowered within the partition's max_time, it runs.
        res = run(c, "scontrol", "update", f"JobId={over}", "TimeLimit=30:00")
        assert res.returncode == 0, res.stderr
        assert c.client().wait(over, timeout=60)["state"] == "completed"
        assert squeue_reason(c, never) == ("PD", "DependencyNeverSatisfied")
    finally:
        run(c, "scancel", never, over)
