"""Slurm batch jobs across real (virtual) hosts: the script runs once, on the first node;
its `srun` runs tasks on both nodes, each with its own SLURM_PROCID; and a 2-node torchrun
launched by `srun bash -c 'torchrun --node_rank $SLURM_PROCID ...'` completes a gloo
all-reduce (master/control/srun.py, mgpu/client/steps.py).

`srun` is a small stand-in for helper slurmcli's command, as in tests/e2e/test_sruns.py;
the batch job goes through the API with a `slurm` block (helper slurmjob's field)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import test_multinode
from test_multinode import TRAIN, MultiNode

from helpers import BIN
from mgpu import hostlist
from mgpu.client.api import RequestError

pytestmark = pytest.mark.netns

multinode = test_multinode.mn
"""test_multinode's cluster of three hosts, started once for this module's tests."""

SRUN = f"""#!{sys.executable}
import argparse, sys
from mgpu.client.steps import StepOptions, run_step

p = argparse.ArgumentParser(prog="srun")
p.add_argument("-n", "--ntasks", type=int)
p.add_argument("-l", "--label", action="store_true")
p.add_argument("argv", nargs=argparse.REMAINDER)
a = p.parse_args()
sys.exit(run_step(a.argv, StepOptions(ntasks=a.ntasks, label=a.label)))
"""


def _batch(mn: MultiNode, tmp_path: Path, script: str, timeout: float = 60) -> tuple[Any, str]:
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "srun").write_text(SRUN)
    (shims / "srun").chmod(0o755)
    env = {**mn.env, "PATH": f"{shims}:{BIN}:{mn.env['PATH']}", "OMP_NUM_THREADS": "1"}
    client = mn.client()
    try:
        job = client.submit_script(
            script, nodes=2, gpus_per_node=2, env=env, cwd=str(tmp_path), slurm={"batch": True}
        )
    except RequestError as e:  # until helper slurmjob's branch (Job.slurm) is merged
        if e.status == 422 and "slurm" in str(e):
            pytest.skip("the master takes no slurm block yet (helper slurmjob's Job.slurm)")
        raise
    end = mn.wait_job(job.id, timeout=timeout)
    return end, client.logs(job.id)


def test_a_batch_script_runs_on_the_first_host_and_srun_on_both(
    multinode: MultiNode, tmp_path: Path
) -> None:
    script = """#!/bin/sh
echo "script on $(hostname)"
srun -l sh -c 'echo "task $SLURM_PROCID of $SLURM_NTASKS on $(hostname) $SLURMD_NODENAME \
$SLURM_STEP_NODELIST"'
"""
    end, out = _batch(multinode, tmp_path, script)
    assert end["state"] == "completed", out
    first, second = (s["hostname"] for s in end["allocation"])
    assert re.findall(r"^script on (\S+)$", out, re.M) == [first]
    tasks = sorted(line for line in out.splitlines() if re.match(r"\d: task", line))
    both = hostlist.compress([first, second])  # SLURM_STEP_NODELIST: gpu[001-002]
    assert tasks == [
        f"0: task 0 of 2 on {first} {first} {both}",
        f"1: task 1 of 2 on {second} {second} {both}",  # its own node's SLURMD_NODENAME
    ]


def test_srun_torchrun_across_two_hosts(multinode: MultiNode, tmp_path: Path) -> None:
    torchrun = BIN / "torchrun"
    if importlib.util.find_spec("torch") is None or not torchrun.exists():
        pytest.skip("torch (with torchrun) is not installed next to this Python")
    (tmp_path / "train.py").write_text(TRAIN)
    # As on Slurm: the script sets the rendezvous (mgpu sets none for a Slurm job).
    script = f"""#!/bin/sh
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
export MASTER_PORT=29517
srun bash -c '{torchrun} --nnodes 2 --nproc_per_node 2 --node_rank $SLURM_PROCID \
--master_addr $MASTER_ADDR --master_port $MASTER_PORT {tmp_path}/train.py'
"""
    end, out = _batch(multinode, tmp_path, script, timeout=240)
    assert end["state"] == "completed", out
    results = re.findall(r"RESULT rank=(\d) sum=(\S+) world=(\d) host=(\S+)", out)
    assert sorted(int(r) for r, _, _, _ in results) == [0, 1, 2, 3], out
    assert {(s, w) for _, s, w, _ in results} == {("10", "4")}
    assert {h for _, _, _, h in results} == {s["hostname"] for s in end["allocation"]}
