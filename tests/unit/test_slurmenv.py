"""A Slurm job's variables and -o/-e file names (mgpu.slurmenv), each in Slurm 22.05's
format, and the `slurm` block of a submission (master/control/slurmblock.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mgpu.config import ClusterConfig, ConfigError, Partition
from mgpu.master.control.jobbuild import SubmitDefaults, build_jobs, submit_warnings
from mgpu.master.control.slurmblock import choose_partition, parse_slurm_block
from mgpu.master.control.submit import JobSpec
from mgpu.master.http.sentences import validation_sentence
from mgpu.master.state.snapshot import job_request
from mgpu.model import Job, SlurmOptions
from mgpu.slurmenv import (
    NO_VAL,
    PatternValues,
    Where,
    array_shape,
    expand_pattern,
    job_env,
    job_name,
    job_number,
    node_names,
    output_files,
    task_counts,
    tasks_per_node,
)
from mgpu.spec import SpecError

# ---- formats ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "text"),
    [
        ([1], "1"),
        ([4, 4], "4(x2)"),
        ([2, 2, 2, 1], "2(x3),1"),
        ([3, 1, 1, 3], "3,1(x2),3"),
        ([8, 8, 8, 8], "8(x4)"),
    ],
)
def test_tasks_per_node_is_slurms_run_length_form(counts: list[int], text: str) -> None:
    assert tasks_per_node(counts) == text


@pytest.mark.parametrize(
    ("nnodes", "ntasks", "per_node", "counts"),
    [
        (3, None, None, [1, 1, 1]),  # Slurm's default: one task per node
        (3, 8, None, [3, 3, 2]),  # block: the first nodes take one more
        (2, None, 4, [4, 4]),
        (2, 6, 4, [4, 2]),  # -n caps --ntasks-per-node
        (1, 5, None, [5]),
    ],
)
def test_task_counts(
    nnodes: int, ntasks: int | None, per_node: int | None, counts: list[int]
) -> None:
    assert task_counts(nnodes, ntasks, per_node) == counts


def test_node_names_are_short_hostnames_unless_they_cannot_tell_nodes_apart() -> None:
    hosts = [("n1", "gpu001.lab.example"), ("n2", "gpu002")]
    assert node_names(hosts) == ("gpu001.lab.example", "gpu002")  # as they resolve
    assert node_names([("node001", "box"), ("node002", "box")]) == ("node001", "node002")
    assert node_names([("node001", None), ("node002", "b")]) == ("node001", "node002")


def test_array_shape() -> None:
    assert array_shape([0, 1, 2, 3]) == (4, 0, 3, 1)
    assert array_shape([1, 5, 9]) == (3, 1, 9, 4)
    assert array_shape([1, 2, 7]) == (3, 1, 7, 1)  # uneven: step 1, as Slurm
    assert array_shape([4]) == (1, 4, 4, 1)


def slurm_job(**fields: Any) -> Job:
    slurm = fields.pop("slurm", SlurmOptions(batch=True, job_name_default="train.sh"))
    base: dict[str, Any] = {"id": "1234", "user": "alice", "argv": [], "command": "x"}
    return Job(**{**base, **fields}, slurm=slurm)


WHERE = Where(("gpu001", "gpu002", "gpu003", "gpu004"), "lab", "gpu")


def test_job_env_has_every_variable_in_slurms_format() -> None:
    slurm = SlurmOptions(
        batch=True,
        job_name_default="train.sh",
        ntasks_per_node=4,
        cpus_per_task=2,
        mem_per_node_mb=16000,
        submit_host="head01",
        submit_dir="/home/alice/proj",
    )
    job = slurm_job(slurm=slurm, restarts=2)
    env = job_env(job, 1, WHERE)
    assert env == {
        "SLURM_JOB_ID": "1234",
        "SLURM_JOBID": "1234",
        "SLURM_JOB_NAME": "train.sh",
        "SLURM_JOB_NODELIST": "gpu[001-004]",
        "SLURM_NODELIST": "gpu[001-004]",
        "SLURM_NNODES": "4",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NTASKS": "16",
        "SLURM_NPROCS": "16",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_TASKS_PER_NODE": "4(x4)",
        "SLURM_JOB_CPUS_PER_NODE": "8(x4)",
        "SLURM_CPUS_ON_NODE": "8",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_MEM_PER_NODE": "16000",
        "SLURM_SUBMIT_DIR": "/home/alice/proj",
        "SLURM_SUBMIT_HOST": "head01",
        "SLURM_CLUSTER_NAME": "lab",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_USER": "alice",
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "gpu002",
        "SLURM_RESTART_COUNT": "2",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_GTIDS": "0",
    }


def test_job_env_leaves_out_what_was_not_asked_as_slurm_does() -> None:
    env = job_env(slurm_job(cwd="/work"), 0, Where(("node1",), "mgpu", "main"))
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        assert name not in env
    assert "SLURM_JOB_GPUS" not in env and "SLURM_GPUS_ON_NODE" not in env  # the grant's
    assert "SLURM_ARRAY_JOB_ID" not in env
    assert env["SLURM_SUBMIT_DIR"] == "/work"  # no submit dir sent: the working directory
    # No task count asked: Slurm's batch script has no SLURM_NTASKS (the tier measured it).
    assert "SLURM_NTASKS" not in env and "SLURM_NPROCS" not in env
    assert env["SLURM_TASKS_PER_NODE"] == "1"


def test_array_task_env_and_its_own_numeric_job_id() -> None:
    slurm = SlurmOptions(batch=True, array_count=3, array_min=0, array_max=8, array_step=4)
    job = slurm_job(id="1234_4", array_job_id="1234", array_task_id=4, slurm=slurm)
    env = job_env(job, 0, Where(("n1",), "mgpu", "main"))
    assert env["SLURM_JOB_ID"] == "1238" == env["SLURM_JOBID"]  # int() works (Lightning)
    assert env["SLURM_ARRAY_JOB_ID"] == "1234"
    assert env["SLURM_ARRAY_TASK_ID"] == "4"
    assert env["SLURM_ARRAY_TASK_COUNT"] == "3"
    assert env["SLURM_ARRAY_TASK_MIN"] == "0"
    assert env["SLURM_ARRAY_TASK_MAX"] == "8"
    assert env["SLURM_ARRAY_TASK_STEP"] == "4"
    first = slurm_job(id="1234_0", array_job_id="1234", array_task_id=0, slurm=slurm)
    assert job_number(first) == "1234"  # the first task has the array's id, as in Slurm
    old = slurm_job(id="a1b2c3d4_4", array_job_id="a1b2c3d4", array_task_id=4, slurm=slurm)
    assert job_number(old) == "a1b2c3d4_4"


def test_job_name_defaults_to_the_scripts_name() -> None:
    assert job_name(slurm_job()) == "train.sh"
    assert job_name(slurm_job(name="mine")) == "mine"
    assert job_name(slurm_job(slurm=SlurmOptions(), script_name="run.sh")) == "run.sh"


# ---- -o/-e patterns --------------------------------------------------------------------

VALUES = PatternValues(
    job_id="1240",
    array_job_id="1234",
    array_task_id=6,
    job_name="train",
    user="alice",
    node_name="gpu001",
)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("slurm-%j.out", "slurm-1240.out"),
        ("%J.out", "1240.out"),  # the batch step has no step number
        ("logs/%x-%A_%a.out", "logs/train-1234_6.out"),
        ("%u@%N.%n.%t.%s", "alice@gpu001.0.0.batch"),
        ("%%j %%", "%j %"),
        ("%5j", "01240"),
        ("%3a", "006"),
        ("%012j", "0000001240"),  # at most 10 digits of padding
        ("%q-%j", "%q-1240"),  # a % Slurm does not know stays as it is
        ("job\\%j.out", "job%j.out"),  # a backslash turns expansion off
        ("a\\\\b", "a\\b"),
    ],
)
def test_expand_pattern(pattern: str, name: str) -> None:
    assert expand_pattern(pattern, VALUES) == name


def test_percent_a_and_A_of_a_job_that_is_no_array() -> None:
    plain = PatternValues("77", "77", None, "x", "u", "n")
    assert expand_pattern("%A_%a", plain) == f"77_{NO_VAL}"


def test_output_files_defaults() -> None:
    assert output_files(slurm_job(), "gpu001") == ("slurm-1234.out", "slurm-1234.out")
    task = slurm_job(id="1234_3", array_job_id="1234", array_task_id=3)
    assert output_files(task, "gpu001") == ("slurm-1234_3.out", "slurm-1234_3.out")
    both = SlurmOptions(batch=True, output="o-%j.txt", error="/tmp/e-%x.txt")
    assert output_files(slurm_job(slurm=both, name="n"), "h") == ("o-1234.txt", "/tmp/e-n.txt")


# ---- the slurm block -------------------------------------------------------------------


def test_slurm_block_parses_every_option() -> None:
    block = {
        "batch": True,
        "job_name_default": "train.sh",
        "ntasks": 8,
        "ntasks_per_node": None,
        "cpus_per_task": 2,
        "mem_per_node_mb": 0,
        "mem_per_cpu_mb": None,
        "gpus_per_task": 1,
        "partition": "gpu",
        "output": "logs/%x-%A_%a.out",
        "error": None,
        "open_mode": "append",
        "submit_host": "head01",
        "submit_dir": "/home/u/proj",
    }
    got = parse_slurm_block(block)
    assert got == SlurmOptions(
        batch=True,
        job_name_default="train.sh",
        ntasks=8,
        cpus_per_task=2,
        mem_per_node_mb=0,
        gpus_per_task=1,
        partition="gpu",
        output="logs/%x-%A_%a.out",
        open_mode="append",
        submit_host="head01",
        submit_dir="/home/u/proj",
    )
    assert parse_slurm_block(None) is None
    assert parse_slurm_block({}) == SlurmOptions()


def refusal(block: Any) -> str:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({"command": "true", "slurm": block})
    message = validation_sentence(exc.value)
    assert "\n" not in message and "Input should" not in message
    return message


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ([], "must be a JSON object"),
        ({"nodes": 2}, "no option 'nodes'"),
        ({"ntasks": 0}, "--ntasks needs a whole number from 1"),
        ({"ntasks": True}, "--ntasks needs a whole number"),
        ({"cpus_per_task": "2"}, "--cpus-per-task needs a whole number"),
        ({"mem_per_node_mb": -1}, "--mem needs a whole number from 0"),
        ({"open_mode": "overwrite"}, "--open-mode 'overwrite' is not append or truncate"),
        ({"partition": "a b"}, "is not a partition name"),
        ({"output": "   "}, "--output is empty"),
        ({"error": 3}, "--error must be text"),
        ({"batch": "yes"}, "batch must be true or false"),
        ({"submit_dir": "rel/dir"}, "is not absolute"),
    ],
)
def test_slurm_block_refusals_are_one_sentence(block: Any, words: str) -> None:
    assert words in refusal(block)


def test_a_slurm_job_that_asks_for_no_gpu_gets_none() -> None:
    assert JobSpec.model_validate({"command": "x", "slurm": {}}).shape.gpus == 0
    assert JobSpec.model_validate({"command": "x"}).shape.gpus == 1  # mgpu's own default
    assert JobSpec.model_validate({"command": "x", "slurm": {}, "gpus": 2}).shape.gpus == 2


# ---- partitions ------------------------------------------------------------------------

PARTS = ClusterConfig(
    partitions=[
        Partition(name="cpu", nodes=["node[01-02]"]),
        Partition(name="gpu", nodes=["node03", "node04"], default=True, max_time="1:00:00"),
    ]
)


def test_partition_config() -> None:
    assert PARTS.partitions[0].nodes == ["node01", "node02"]  # host lists expanded
    assert PARTS.default_partition().name == "gpu"
    assert ClusterConfig().default_partition().name == "main"  # none configured: every node
    assert ClusterConfig(partitions=[Partition(name="a")]).default_partition().name == "a"
    with pytest.raises(ValidationError, match="more than one partition"):
        ClusterConfig(partitions=[Partition(name=n, default=True) for n in "ab"])
    with pytest.raises(ValidationError, match="'a' is listed twice"):
        ClusterConfig(partitions=[Partition(name="a")] * 2)
    with pytest.raises(ValidationError, match="not understood"):
        Partition(name="a", max_time="soon")


def test_load_config_with_partitions(tmp_path: Any) -> None:
    from mgpu.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "partitions:\n  - {name: gpu, nodes: ['n[1-2]'], default: true, max_time: '2-00:00:00'}\n"
        "refuse_unknown_partition: true\n"
    )
    conf = load_config(path)
    assert conf.partition("gpu") is not None and conf.refuse_unknown_partition
    path.write_text("partitions:\n  - {name: 'bad name'}\n")
    with pytest.raises(ConfigError, match="partitions"):
        load_config(path)


def test_choose_partition() -> None:
    assert choose_partition(None, PARTS).name == "gpu"
    cpu = choose_partition("cpu", PARTS)
    assert (cpu.name, cpu.nodes, cpu.max_time, cpu.warning) == (
        "cpu",
        ("node01", "node02"),
        None,
        None,
    )
    unknown = choose_partition("nope", PARTS)
    assert unknown.name == "gpu"
    assert unknown.warning == "partition 'nope' does not exist here; the job runs in 'gpu'"
    strict = PARTS.model_copy(update={"refuse_unknown_partition": True})
    with pytest.raises(SpecError, match="invalid partition specified: nope"):
        choose_partition("nope", strict)


def built(body: dict[str, Any], config: ClusterConfig = PARTS) -> Job:
    spec = JobSpec.model_validate({"command": "true", **body})
    defaults = SubmitDefaults(cluster=config)
    [job] = build_jobs(spec, "alice", defaults, 0.0, lambda _block: "1")
    return job


def test_a_partition_restricts_where_the_job_runs_and_its_time() -> None:
    job = built({"slurm": {"partition": "cpu"}})
    assert job.slurm is not None and job.slurm.partition == "cpu"
    assert job.slurm.partition_nodes == ("node01", "node02") and job.time_limit is None
    assert job_request(job).allowed_nodes == {"node01", "node02"}
    assert job_request(job, frozenset({"node02", "node09"})).allowed_nodes == {"node02"}
    job = built({"slurm": {}})
    assert job_request(job).allowed_nodes == {"node03", "node04"}
    assert job.time_limit == 3600.0  # the default partition's max_time
    assert built({"slurm": {}, "time": "10"}).time_limit == 600.0
    # Over its partition's max_time: kept, and waiting (PartitionTimeLimit), as Slurm's.
    over = built({"slurm": {}, "time": "2:00:00"})
    assert over.time_limit == 7200.0 and job_request(over).over_partition_time
    assert not job_request(built({"slurm": {}, "time": "1:00:00"})).over_partition_time
    assert job_request(built({"slurm": {}, "time": "UNLIMITED"})).over_partition_time
    assert not job_request(built({"time": "2:00:00"})).over_partition_time  # mgpu's own
    with pytest.raises(ValueError, match="names no node of partition 'gpu'"):
        built({"slurm": {}, "nodelist": "node01"})
    plain = built({})
    assert plain.slurm is None and job_request(plain).allowed_nodes is None  # as before
    whole = built({"slurm": {}}, ClusterConfig())  # no partitions configured: every node
    assert whole.slurm is not None and whole.slurm.partition == "main"
    assert job_request(whole).allowed_nodes is None


def test_unknown_partition_is_one_warning() -> None:
    spec = JobSpec.model_validate({"command": "x", "slurm": {"partition": "nope"}})
    assert submit_warnings(spec, SubmitDefaults(cluster=PARTS)) == [
        "partition 'nope' does not exist here; the job runs in 'gpu'"
    ]
    fallback = built({"slurm": {"partition": "nope"}}).slurm
    assert fallback is not None and fallback.partition_nodes == ("node03", "node04")
    assert submit_warnings(JobSpec.model_validate({"command": "x"}), SubmitDefaults()) == []


def test_an_array_takes_a_block_of_ids_and_keeps_its_shape() -> None:
    spec = JobSpec.model_validate({"command": "x", "array": "0-8:4", "slurm": {}})
    blocks: list[int] = []

    def new_id(block: int) -> str:
        blocks.append(block)
        return "100"

    jobs = build_jobs(spec, "alice", SubmitDefaults(), 0.0, new_id)
    assert blocks == [9]  # 100 .. 108: each task's own SLURM_JOB_ID
    assert [j.id for j in jobs] == ["100_0", "100_4", "100_8"]
    slurm = jobs[0].slurm
    assert slurm is not None
    assert (slurm.array_count, slurm.array_min, slurm.array_max, slurm.array_step) == (3, 0, 8, 4)


def test_slurm_options_stored_and_shown() -> None:
    job = built({"slurm": {"batch": True, "output": "o.txt"}})
    again = Job.from_record(job.to_record())
    assert again.slurm == job.slurm
    assert job.to_public()["slurm"]["output"] == "o.txt"
    old = job.to_record()
    del old["slurm"]  # a job stored before the field existed
    assert Job.from_record(old).slurm is None
