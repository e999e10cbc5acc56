"""mgpu.agent.grants: a launch's grant made into the run's GPU variables, device numbers
and container flags, in one place."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgpu.agent import containers, grants
from mgpu.agent.gpus import GpuInfo
from mgpu.agent.mps import share_of
from mgpu.protocol import Grant, Launch

FOUR = [GpuInfo(i, "A100", 40960, f"GPU-{i}") for i in range(4)]
MIG = [
    GpuInfo(0, "A100 MIG 3g.20gb", 20096, "MIG-aaaa", device_index=0),
    GpuInfo(1, "A100 MIG 3g.20gb", 20096, "MIG-bbbb", device_index=0),
    GpuInfo(2, "H100", 81559, "GPU-cccc", device_index=1),
]


def test_whole_gpus_are_the_visible_devices_and_mgpus_ids() -> None:
    env = grants.variables(Grant(gpus=[1, 3]), FOUR)
    assert env == {"CUDA_VISIBLE_DEVICES": "1,3", "MGPU_GPU_IDS": "1,3"}
    assert grants.variables(Grant(gpus=[]), FOUR) == {
        "CUDA_VISIBLE_DEVICES": "",  # a CPU job sees no GPU, as before
        "MGPU_GPU_IDS": "",
    }


def test_a_slurm_job_names_its_gpus_in_slurms_variables_but_only_when_it_has_some() -> None:
    env = grants.variables(Grant(gpus=[2, 3], slurm=True), FOUR)
    assert (env["SLURM_JOB_GPUS"], env["SLURM_GPUS_ON_NODE"]) == ("2,3", "2")
    assert "SLURM_STEP_GPUS" not in env
    cpu = grants.variables(Grant(gpus=[], slurm=True), FOUR)
    assert "SLURM_JOB_GPUS" not in cpu and "SLURM_GPUS_ON_NODE" not in cpu


def test_an_srun_task_sees_its_gpus_and_knows_the_jobs() -> None:
    env = grants.variables(Grant(gpus=[3], job_gpus=[2, 3], slurm=True, step=True), FOUR)
    assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_STEP_GPUS"] == "3"
    assert env["SLURM_JOB_GPUS"] == env["MGPU_GPU_IDS"] == "2,3"
    assert env["SLURM_GPUS_ON_NODE"] == "2"


def test_a_share_is_its_fraction_its_memory_and_its_threads() -> None:
    grant = Grant(gpus=[1], share_units=250, gpu_memory_mb=10240)
    env = grants.variables(grant, FOUR)
    assert env["MGPU_GPU_SHARE"] == "0.25" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["MGPU_GPU_MEMORY_LIMIT_MB"] == "10240" and env["CUDA_VISIBLE_DEVICES"] == "1"
    eighth = grants.share_variables(Grant(gpus=[0], share_units=125))
    assert eighth == {"MGPU_GPU_SHARE": "0.125", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "12.5"}
    assert grants.share_variables(Grant(gpus=[0])) == {}  # whole GPUs: no share
    # What MPS holds the job's user's server to: the same grant.
    share = share_of(grants.share_variables(grant), 1000, "GPU-1")
    assert share is not None and (share.percent, share.memory_mb) == (25, 10240)
    assert grants.share_device(grant, FOUR) == ("GPU-1", "1")


def test_mig_instances_are_named_by_uuid_and_opened_through_their_parent() -> None:
    grant = Grant(gpus=[1, 2])
    assert grants.variables(grant, MIG)["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb,GPU-cccc"
    assert grants.variables(grant, MIG)["MGPU_GPU_IDS"] == "1,2"  # mgpu's own indices
    assert grants.device_numbers(grant, MIG) == [0, 1]
    assert grants.device_numbers(Grant(gpus=[3, 1]), FOUR) == [1, 3]
    assert grants.share_device(Grant(gpus=[1], share_units=500), MIG) == ("MIG-bbbb", "1")


def test_gpu_variables_in_the_launchs_env_cannot_widen_the_grant() -> None:
    """Whoever put them there (a user's submit, an srun's environment): the grant's win,
    and a name no grant sets here is dropped, not passed on."""
    wide = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "SLURM_STEP_GPUS": "0,1,2,3",
        "SLURM_JOB_GPUS": "0,1,2,3",
        "MGPU_GPU_SHARE": "1",
        "HOME": "/home/al",
    }
    env = grants.apply(wide, Grant(gpus=[2]), FOUR)
    assert env == {"CUDA_VISIBLE_DEVICES": "2", "MGPU_GPU_IDS": "2", "HOME": "/home/al"}


def test_container_runtimes_get_only_the_granted_gpus() -> None:
    grant = Grant(gpus=[1, 3])
    podman = grants.container_gpus("podman", grant)
    assert podman.flags == ["--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3"]
    assert podman.env == ["-e", "CUDA_VISIBLE_DEVICES=0,1"]  # renumbered from 0 inside
    docker = grants.container_gpus("docker", grant)
    assert docker.flags == ["--gpus", '"device=1,3"'] and docker.env == podman.env
    apptainer = grants.container_gpus("apptainer", grant)
    assert apptainer.flags == ["--nv"]
    assert apptainer.env == ["--env", "CUDA_VISIBLE_DEVICES=1,3"]  # --nv shows all: narrowed
    for name in ("podman", "docker", "apptainer"):
        none = grants.container_gpus(name, Grant(gpus=[]))
        assert none.flags == [] and none.env[1] == "CUDA_VISIBLE_DEVICES="
    with pytest.raises(ValueError, match="unknown container runtime"):
        grants.container_gpus("lxc", grant)
    rt = containers.Runtime("docker", "/usr/bin/docker")
    argv = containers.build_argv(
        rt, "img", ["true"], grant=grant, cwd=None, uid_gid=None, env_file=None, name="c"
    )
    assert argv[argv.index("--gpus") + 1] == '"device=1,3"'


def test_a_launch_names_its_grant_and_the_grant_is_checked() -> None:
    raw = {"type": "launch", "job_id": "1", "epoch": 1, "argv": ["true"], "env": {}}
    with pytest.raises(ValidationError, match="grant"):
        Launch.model_validate(raw)  # a launch without a grant is no launch
    with pytest.raises(ValidationError, match="gpus"):
        Grant.model_validate({"gpus": [-1]})
    with pytest.raises(ValidationError, match="share_units"):
        Grant.model_validate({"gpus": [0], "share_units": 1001})
    grant = Launch.model_validate(raw | {"grant": {"gpus": [0]}}).grant
    assert (grant.cpus, grant.mem_mb) == (None, None)  # not granted yet: not limited
