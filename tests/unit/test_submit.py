"""The submit path as units, no master: `JobSpec` (every field rule and the cross-field
rules), `build_jobs`, admission (mutators, validators, the site validator off the event
loop), the sentence a refusal answers, and the client's side (what it sends and warns)."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mgpu.client import api
from mgpu.client.api import Client
from mgpu.config import Admission as AdmissionConfig
from mgpu.config import Scheduling
from mgpu.execspec import MAX_ARG_BYTES, MAX_ENV_VARS
from mgpu.master.control.admission import Admission, AdmissionContext
from mgpu.master.control.jobbuild import SubmitDefaults, build_jobs
from mgpu.master.control.submit import JobSpec, Shape, SubmitError
from mgpu.master.http.sentences import validation_sentence as _validation_sentence
from mgpu.model import Attempt, Job, JobState, Slot
from mgpu.scheduler.types import JobRequest, NodeView
from mgpu.spec import ArraySpec, Dependency

ME = getpass.getuser()


def spec(**fields: Any) -> JobSpec:
    fields.setdefault("command", "true")
    return JobSpec.model_validate(fields)


def refusal(body: Any) -> str:
    """The sentence the submit route answers for `body` (422), checked to be one clean
    sentence: one line, no pydantic wording, encodable for the wire."""
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(body)
    message = _validation_sentence(exc.value)
    assert message and "\n" not in message and message.strip() == message
    for jargon in ("Input should", "Value error", "should be", "Field required", "[type="):
        assert jargon not in message, message
    message.encode("utf-8")
    return message


def jobs_of(s: JobSpec, defaults: SubmitDefaults | None = None) -> list[Job]:
    ids = iter(["a1b2c3d4", "ffffffff"])
    return build_jobs(s, ME, defaults or SubmitDefaults(), 1000.0, lambda _block: next(ids))


# ---- JobSpec: what the client sends is accepted as before -----------------------------


def test_the_clients_json_is_accepted_and_parsed() -> None:
    s = JobSpec.model_validate(
        {
            "command": "python train.py",
            "name": " train ",
            "gpus": 2,
            "gpu_ids": "1,0",
            "nodelist": "node[001-002]",
            "exclude": ["node003"],
            "gpu_type": "a100",
            "policy": "spread",
            "distributed": True,
            "time": "1:00:00",
            "priority": 5,
            "retries": 0,
            "dependency": "afterok:A1B2C3D4",
            "array": "0-3%2",
            "preemptible": True,
            "interactive": True,
            "cwd": "/home/al/exp",
            "env": {"HOME": "/home/al", "LANG": "C.UTF-8"},
            "image": "pytorch:24.01",
        }
    )
    assert s.name == "train"
    assert s.gpu_ids == (0, 1)
    assert s.nodelist == ("node001", "node002") and s.exclude == ("node003",)
    assert s.time == 3600.0
    assert s.dependency == (Dependency("afterok", "a1b2c3d4"),)
    assert s.array == ArraySpec(indices=(0, 1, 2, 3), max_running=2)
    assert s.shape == Shape(gpus=2)
    assert s.dropped_env == []


@pytest.mark.parametrize(
    "body",
    [
        {"command": "true", "gpu_ids": [3, 1, 1]},
        {"command": "true", "gpu_ids": "", "nodelist": "", "exclude": [], "time": ""},
        {"command": "true", "array": None, "dependency": None, "env": None, "cwd": None},
        {"argv": ["echo", "a b", "ü", "-n", "tab\tnewline\n"]},
        {"command": "true", "gpus": "2"},  # a Python caller's string, as before
        {"command": "true", "env": {"BASH_FUNC_module%%": "() {  eval x\n}"}},
    ],
)
def test_accepted_bodies(body: dict[str, Any]) -> None:
    JobSpec.model_validate(body)


def test_unlimited_is_kept_apart_from_absent() -> None:
    defaults = SubmitDefaults(time_limit=3600.0)
    assert spec().time is None
    assert jobs_of(spec(), defaults)[0].time_limit == 3600.0  # absent: the default
    unlimited = spec(time="UNLIMITED")
    assert unlimited.time == math.inf
    assert jobs_of(unlimited, defaults)[0].time_limit is None  # explicit: no limit
    assert jobs_of(spec(time="90"), defaults)[0].time_limit == 5400.0


# ---- JobSpec: refusals name the option as the user typed it ---------------------------


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ({}, "the command is empty; give the command to run"),
        ({"command": "   "}, "the command is empty; give the command to run"),
        ({"argv": []}, "the command is empty; give the command to run"),
        ({"command": "true", "argv": ["true"]}, "either as a string or as argv, not both"),
        ({"command": "true", "gpus": -1}, "--gpus must be greater than or equal to 0"),
        ({"command": "true", "gpus": True}, "--gpus needs a whole number, not true"),
        ({"command": "true", "gpus": 1.5}, "--gpus must be a valid integer"),
        ({"command": "true", "gpus": 10**30}, "--gpus must be less than or equal to 65536"),
        ({"command": "true", "gpus_per_node": -1}, "--gpus-per-node must be greater than"),
        ({"command": "true", "nodes": 0}, "--nodes must be greater than or equal to 1"),
        ({"command": "true", "retries": 1001}, "--retries must be less than or equal to 1000"),
        ({"command": "true", "priority": "high"}, "--priority must be a valid integer"),
        ({"command": "true", "time": "soon"}, "--time: time limit 'soon' is not understood"),
        ({"command": "true", "time": 60}, "--time must be text such as 90 or 1:00:00"),
        ({"command": "true", "time": "0"}, "--time: time limit '0' is zero"),
        ({"command": "true", "gpu_ids": "1-x"}, "--gpu-ids: GPU id '1-x' is not"),
        ({"command": "true", "gpu_ids": [-1]}, "--gpu-ids: GPU id -1 is out of range"),
        ({"command": "true", "gpu_ids": [True]}, "--gpu-ids must list whole numbers"),
        ({"command": "true", "node_gpu_ids": "n1"}, "--node-gpu-ids: node 'n1' has no GPU"),
        ({"command": "true", "nodelist": "a,,b"}, "--nodelist: node list 'a,,b' has an empty"),
        ({"command": "true", "exclude": ["ok", "-bad"]}, "--exclude: node id '-bad' is not"),
        ({"command": "true", "nodelist": [1]}, "--nodelist must list node names, not 1"),
        ({"command": "true", "dependency": "after:x"}, "--dependency: dependency type 'after'"),
        ({"command": "true", "array": "5-1"}, "--array: array range '5-1' runs backwards"),
        ({"command": "true", "array": "0-" + "9" * 20}, "--array: array entry"),
        ({"command": "true", "name": "a\nb"}, "--name: job name 'a\\nb' contains control"),
        ({"command": "true", "name": ""}, "--name: the job name is empty"),
        ({"command": "true", "user": "../root"}, "--user '../root' is not a user name"),
        ({"command": "true", "gpu_type": "\x1b[31m"}, "--gpu-type '\\x1b[31m' is not a GPU"),
        ({"command": "true", "policy": "best"}, "--policy must be 'fill_first' or 'spread'"),
        ({"command": "true", "cwd": "rel"}, "--cwd 'rel' is not an absolute path"),
        ({"command": "true", "image": "-v"}, "--image '-v' is not a valid image name"),
        ({"command": "true", "image": "x" * 513}, "--image 'xxx"),
        ({"command": "true", "env": {"A=B": "1"}}, "--env name 'A=B' is not a variable name"),
        ({"command": "true", "env": {"": "1"}}, "--env name '' is not a variable name"),
        ({"command": "true", "env": {"A": 1}}, "--env[A] must be a valid string"),
        ({"command": "true", "env": ["A=1"]}, "--env must be a valid dictionary"),
        ({"command": "true", "distributed": "maybe"}, "--distributed must be a valid boolean"),
        ({"command": "true", "bogus": 1}, "--bogus is not an option of this request"),
        ({"command": "true", "\udcff": 1}, "a field name of the request is not valid UTF-8"),
        ({"command": "true", "x\ny": 1}, "--'x\\ny' is not an option of this request"),
        ({"command": "true", "array": "1" * 70000}, "--array is 70000 characters long"),
        ({"script": "true", "script_name": "."}, "'.' is not a file name for the job script"),
        ({"script": "true", "script_name": ".."}, "'..' is not a file name for the job script"),
        ({"script": "true", "script_name": "a/b"}, "'a/b' is not a file name for the job"),
        ({"script": "true", "script_name": "a\x00b"}, "the job script's name contains a NUL"),
        ({"script": "true", "script_name": "a\nb"}, "'a\\nb' is not a file name for the"),
        ({"script": "true", "script_name": ""}, "'' is not a file name for the job script"),
        ([1, 2], "the request body must be a JSON object"),
        ("true", "the request body must be a JSON object"),
    ],
)
def test_refusals_are_one_sentence_naming_the_option(body: Any, sentence: str) -> None:
    assert sentence in refusal(body)


STRING_FIELDS: list[tuple[str, Any]] = [
    # (where the hostile text goes, the option the sentence names)
    ("command", "the command"),
    ("argv.1", "--argv[1]"),
    ("name", "--name"),
    ("user", "--user"),
    ("gpu_ids", "--gpu-ids"),
    ("node_gpu_ids", "--node-gpu-ids"),
    ("nodelist", "--nodelist"),
    ("nodelist.0", "--nodelist"),
    ("exclude", "--exclude"),
    ("gpu_type", "--gpu-type"),
    ("time", "--time"),
    ("dependency", "--dependency"),
    ("array", "--array"),
    ("cwd", "--cwd"),
    ("env.name", "--env name"),
    ("env.value", "--env[HOME]"),
    ("image", "--image"),
]


def _with(path: str, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {"command": "true"}
    field, _, part = path.partition(".")
    if field == "argv":
        body = {"argv": ["echo", text]}
    elif field == "env":
        body["env"] = {text: "x"} if part == "name" else {"HOME": text}
    elif part:
        body[field] = [text]
    else:
        body[field] = ("/" + text) if field == "cwd" else text
    return body


@pytest.mark.parametrize(("path", "option"), STRING_FIELDS)
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("\ud800", "is not valid UTF-8"),
        ("ok\udcff", "is not valid UTF-8"),  # a non-UTF-8 byte, as the CLI would send it
        ("a\x00b", "contains a NUL byte"),
    ],
)
def test_every_string_field_refuses_surrogates_and_nul(
    path: str, option: str, text: str, problem: str
) -> None:
    message = refusal(_with(path, text))
    assert message.startswith(option) and problem in message


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ({"argv": ["x"] * 4097}, "--argv has 4097 arguments"),
        ({"argv": ["echo", "a" * (MAX_ARG_BYTES + 1)]}, "--argv[1] is 65537 bytes long"),
        ({"argv": ["echo", "a" * 2**20]}, "--argv[1] is 1048576 bytes long"),  # the 1 MB case
        ({"argv": ["a" * MAX_ARG_BYTES] * 5}, "--argv is 327685 bytes in all"),
        ({"command": "x", "env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}}, "4097"),
        ({"command": "x", "env": {"V": "x" * 2**20}}, "--env[V] is 1048578 bytes long"),
        ({"command": "x", "env": {f"V{i}": "x" * 60000 for i in range(5)}}, "--env is 300020"),
        ({"command": "x" * (64 * 1024 + 1)}, "the command is 65537 bytes long"),
    ],
)
def test_size_limits(body: dict[str, Any], sentence: str) -> None:
    assert sentence in refusal(body)


# ---- JobSpec: the cross-field rules ------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "shape"),
    [
        ({}, Shape(gpus=1)),
        ({"gpus": 0}, Shape(gpus=0)),
        ({"gpus": 3}, Shape(gpus=3)),
        ({"nodes": 2}, Shape(gpus=2, nodes=2, gpus_per_node=1)),
        ({"nodes": 2, "gpus": 8}, Shape(gpus=8, nodes=2, gpus_per_node=4)),
        ({"gpus_per_node": 3}, Shape(gpus=3, nodes=1, gpus_per_node=3)),
        ({"nodes": 2, "gpus_per_node": 0}, Shape(gpus=0, nodes=2, gpus_per_node=0)),
        ({"nodes": 2, "gpus_per_node": 2, "gpus": 4}, Shape(gpus=4, nodes=2, gpus_per_node=2)),
        ({"gpu_ids": "0,2"}, Shape(gpus=2)),
        ({"gpu_ids": "0,2", "gpus": 2}, Shape(gpus=2)),
        ({"node_gpu_ids": "a:0,1;b:0"}, Shape(gpus=3)),
        ({"node_gpu_ids": "a:0;b:1", "nodes": 2, "gpus_per_node": 1}, Shape(2, 2, 1)),
    ],
)
def test_gpus_nodes_and_gpu_lists_agree(fields: dict[str, Any], shape: Shape) -> None:
    assert spec(**fields).shape == shape


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        ({"nodes": 2, "gpus": 5}, "--gpus 5 does not match --nodes 2 × --gpus-per-node 2"),
        ({"nodes": 2, "gpus_per_node": 2, "gpus": 3}, "--gpus 3 does not match --nodes 2"),
        ({"gpu_ids": "0,1", "gpus": 3}, "--gpus 3 does not match the 2 --gpu-ids"),
        ({"node_gpu_ids": "a:0;b:0,1", "gpus": 2}, "--gpus 2 does not match the 3 GPUs"),
        ({"gpu_ids": "0", "node_gpu_ids": "a:0"}, "use either --gpu-ids or --node-gpu-ids"),
        ({"gpu_ids": "0", "nodes": 2}, "--gpu-ids picks GPUs on one node"),
        ({"gpu_ids": "0", "gpus_per_node": 1}, "--gpu-ids picks GPUs on one node"),
        ({"node_gpu_ids": "a:0;b:0", "nodes": 3}, "--nodes 3 does not match the 2 nodes"),
        ({"node_gpu_ids": "a:0;b:0,1", "gpus_per_node": 1}, "which gives b 2"),
    ],
)
def test_contradictions_are_refused(fields: dict[str, Any], sentence: str) -> None:
    assert sentence in refusal({"command": "true", **fields})


# ---- build_jobs -----------------------------------------------------------------------


def test_build_a_command_job() -> None:
    s = spec(
        command="echo hi",
        gpu_type="NVIDIA A100-SXM4-80GB",
        env={"HOME": "/h", "CUDA_VISIBLE_DEVICES": "7", "MGPU_JOB_ID": "x", "SLURM_X": "1"},
        dependency="afterany:a1b2c3d4",
        exclude="n[1-2]",
    )
    [job] = jobs_of(s, SubmitDefaults(max_retries=7))
    assert (job.id, job.user, job.state, job.reason) == (
        "a1b2c3d4",
        ME,
        JobState.QUEUED,
        "waiting to be scheduled",
    )
    assert job.argv == ["/bin/sh", "-c", "echo hi"] and job.command == "echo hi"
    assert job.env == {"HOME": "/h"}  # what the scheduler sets is not the user's to give
    assert s.dropped_env == ["CUDA_VISIBLE_DEVICES", "MGPU_JOB_ID", "SLURM_X"]
    assert job.gpu_type == "A100"
    assert job.dependency == [("afterany", "a1b2c3d4")]
    assert job.exclude == ["n1", "n2"] and job.nodelist is None
    assert job.max_retries == 7 and job.time_limit is None
    assert job.submit_time == job.eligible_time == 1000.0
    assert job.array_job_id is None


def test_build_an_argv_job() -> None:
    [job] = jobs_of(spec(command=None, argv=["python", "-c", "print('a b')"], retries=0))
    assert job.argv == ["python", "-c", "print('a b')"]
    assert job.command == "python -c 'print('\"'\"'a b'\"'\"')'"  # shlex.join: shown, not run
    assert job.max_retries == 0


def test_build_an_array() -> None:
    jobs = jobs_of(spec(array="0-4:2%2", gpus=2, nodelist="n1"))
    assert [j.id for j in jobs] == ["a1b2c3d4_0", "a1b2c3d4_2", "a1b2c3d4_4"]
    assert {j.array_job_id for j in jobs} == {"a1b2c3d4"}
    assert [j.array_task_id for j in jobs] == [0, 2, 4]
    assert all(j.array_max_running == 2 and j.gpus == 2 for j in jobs)
    assert all(Job.from_record(j.to_record()) == j for j in jobs)
    jobs[0].allocation.append(Slot("n1", [0, 1]))
    jobs[0].attempts.append(Attempt(1, ["n1"], {"n1": [0, 1]}))
    assert jobs[1].allocation == [] and jobs[1].attempts == []  # each task its own


def test_a_jobs_attempts_in_its_json_are_every_field_of_each() -> None:
    [job] = jobs_of(spec())
    job.attempts.append(Attempt(1, ["n1"], {"n1": [0, 1]}, 1.0, 2.0, "node lost"))
    public = job.to_public()["attempts"]
    assert public == [dataclasses.asdict(a) for a in job.attempts]
    public[0]["gpu_ids"]["n1"].append(9)  # a copy: the job is not changed through it
    assert job.attempts[0].gpu_ids == {"n1": [0, 1]}


def test_build_a_large_array_quickly() -> None:
    s = spec(array="0-99999", env=dict(os.environ))
    t0 = time.perf_counter()
    jobs = jobs_of(s)
    assert len(jobs) == 100_000 and jobs[-1].id == "a1b2c3d4_99999"
    assert time.perf_counter() - t0 < 10  # ~1 s on one idle core; the old path took ~25 s


def test_defaults_from_the_config() -> None:
    d = SubmitDefaults.from_config(Scheduling(default_time_limit="2:00:00", max_retries=2))
    assert d == SubmitDefaults(time_limit=7200.0, max_retries=2)
    assert SubmitDefaults.from_config(Scheduling()) == SubmitDefaults(None, 5)


# ---- admission -----------------------------------------------------------------------


def _request(job: Job) -> JobRequest:
    return JobRequest(
        job_id=job.id,
        user=job.user,
        submit_time=job.submit_time,
        gpus=job.gpus,
        gpu_ids=None if job.gpu_ids is None else tuple(job.gpu_ids),
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        nodelist=None if job.nodelist is None else frozenset(job.nodelist),
        distributed=job.distributed,
        requires=frozenset({"container"}) if job.image else frozenset(),
    )


NODES = [
    NodeView("node001", (0, 1, 2, 3), frozenset({0, 1, 2, 3})),
    NodeView("node002", (0, 1), frozenset({0, 1}), features=frozenset({"container"})),
]


def context(
    nodes: list[NodeView] | None = None, known: tuple[str, ...] = (), groups: tuple[str, ...] = ()
) -> AdmissionContext:
    return AdmissionContext(
        nodes=NODES if nodes is None else nodes,
        request_for=_request,
        job_exists=lambda job_id: job_id in known,
        groups=lambda user: set(groups),
    )


def admit(adm: Admission, s: JobSpec, ctx: AdmissionContext | None = None) -> list[Job]:
    jobs = jobs_of(s)
    asyncio.run(adm.admit(jobs, s, ctx or context()))
    return jobs


def refused(adm: Admission, s: JobSpec, ctx: AdmissionContext | None = None) -> str:
    with pytest.raises(SubmitError) as exc:
        admit(adm, s, ctx)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_mutators_set_max_time_as_the_default() -> None:
    adm = Admission(AdmissionConfig(max_time_per_job="2:00:00"))
    assert [j.time_limit for j in admit(adm, spec(array="0-2"))] == [7200.0] * 3
    assert admit(adm, spec(time="30"))[0].time_limit == 1800.0  # given: kept
    with_default = jobs_of(spec(), SubmitDefaults(time_limit=600.0))
    adm.mutate(with_default, spec())
    assert with_default[0].time_limit == 600.0  # scheduling.default_time_limit comes first


def test_site_limits() -> None:
    adm = Admission(
        AdmissionConfig(
            max_gpus_per_job=2,
            max_nodes_per_job=1,
            max_time_per_job="1:00:00",
            allowed_users=["alice"],
            allowed_groups=["gpu"],
        )
    )
    ok = context(groups=("gpu",))
    assert refused(adm, spec(), context(groups=("other",))) == (
        f"user {ME} may not submit jobs to this cluster "
        "(not in site.admission's allowed users or groups)"
    )
    assert refused(adm, spec(gpus=3), ok) == (
        "the job asks for 3 GPUs but this cluster allows at most 2 per job"
    )
    assert refused(adm, spec(nodes=2, gpus_per_node=1), ok) == (
        "the job asks for 2 nodes but this cluster allows at most 1 per job"
    )
    assert refused(adm, spec(node_gpu_ids="node001:0;node002:0"), ok).startswith(
        "the job asks for 2 nodes"
    )
    assert refused(adm, spec(time="UNLIMITED"), ok) == (
        "the job asks for no time limit but this cluster allows at most 01:00:00 per job"
    )
    assert refused(adm, spec(time="2:00:00"), ok) == (
        "the job's time limit 02:00:00 is more than this cluster allows per job (01:00:00)"
    )
    admit(adm, spec(gpus=2, time="59"), ok)


def test_scheduler_validators() -> None:
    adm = Admission(AdmissionConfig(), max_gpus_per_user=3)
    assert refused(adm, spec(gpus=4)) == (
        "the job asks for 4 GPUs but a user may hold at most 3 (scheduling.max_gpus_per_user)"
    )
    assert refused(adm, spec(dependency="afterok:deadbeef")) == (
        "--dependency afterok:deadbeef names no known job"
    )
    admit(adm, spec(dependency="afterok:deadbeef"), context(known=("deadbeef",)))
    free = Admission(AdmissionConfig())
    assert refused(free, spec(gpus=5)).startswith("no node has 5 GPUs (the largest has 4)")
    assert refused(free, spec(nodelist="node009")) == "node node009 is not in the cluster"
    assert refused(free, spec(image="busybox"), context(nodes=NODES[:1])) == (
        "no node has a container runtime (podman, docker or apptainer) to run --image busybox"
    )
    admit(free, spec(image="busybox"))
    admit(free, spec(gpus=64), context(nodes=[]))  # no node known yet: judged later


def test_never_fits_is_what_submit_says() -> None:
    adm = Admission(AdmissionConfig())
    [job] = jobs_of(spec(gpus=5))
    assert adm.never_fits(job, [], _request) is None
    why = adm.never_fits(job, NODES, _request)
    assert why is not None and why == refused(adm, spec(gpus=5))


def _validator(tmp_path: Path, body: str) -> Admission:
    script = tmp_path / "validator.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return Admission(AdmissionConfig(validator=str(script), validator_timeout=5))


def test_site_validator_reads_the_job_and_refuses_with_its_first_line(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    adm = _validator(tmp_path, f"cat > {seen}\necho\necho '  no GPUs on Sunday  '\nexit 3\n")
    assert refused(adm, spec(array="0-9%2", gpus=2), context(groups=("g",))) == (
        "refused by the site's job validator: no GPUs on Sunday"
    )
    import json

    payload = json.loads(seen.read_text())
    assert (payload["user"], payload["groups"], payload["gpus"]) == (ME, ["g"], 2)
    assert payload["array"] == "0-9%2" and payload["argv"] == ["/bin/sh", "-c", "true"]
    assert refused(_validator(tmp_path, "exit 4\n"), spec()) == (
        "refused by the site's job validator (exit code 4)"
    )
    long = _validator(tmp_path, "printf '%0500d\\033x' 0; exit 1\n")
    assert len(refused(long, spec())) < 400
    missing = Admission(AdmissionConfig(validator=str(tmp_path / "nope")))
    assert refused(missing, spec()).startswith("the site's job validator cannot run: ")
    admit(_validator(tmp_path, "cat >/dev/null\n"), spec())


def test_site_validator_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """A validator that hangs delays its own submission (refused at the timeout), while
    the loop keeps turning; its process group is killed."""
    pidfile = tmp_path / "pid"
    adm = _validator(tmp_path, f"echo $$ > {pidfile}\nsleep 30 & wait\n")
    adm.config.validator_timeout = 3.0  # a blocked loop would stall this long

    async def main() -> tuple[str, float]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        jobs = jobs_of(spec())
        try:
            await adm.admit(jobs, spec(), context())
        except SubmitError as e:
            message = str(e)
        stop.set()
        await tick
        return message, max(gaps)

    t0 = time.monotonic()
    message, longest_gap = asyncio.run(main())
    assert message == "the site's job validator did not answer within 3 s"
    assert time.monotonic() - t0 < 15
    assert longest_gap < 1.0, longest_gap  # not the 3 s wait: a loaded machine's slack
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # killed with its group (the sleep child too)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"validator {pid} still alive")


# ---- the sentence of other refusals ---------------------------------------------------


def test_malformed_json_is_named_as_such() -> None:
    exc = RequestValidationError(
        [
            {
                "type": "json_invalid",
                "loc": ("body", 20),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "Expecting value"},
            }
        ]
    )
    assert _validation_sentence(exc) == (
        "the request body is not valid JSON (Expecting value at character 20)"
    )


def test_missing_body() -> None:
    exc = RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert _validation_sentence(exc) == "the request body is missing; send a JSON object"


# ---- the client's side ---------------------------------------------------------------


def test_client_leaves_out_what_cannot_travel_and_names_it() -> None:
    env, skipped = api._portable_environment(
        {
            "HOME": "/h",
            "BASH_FUNC_ml%%": "() { x; }",
            "LATIN1": "caf\udce9",
            "BAD\udcff": "x",
            "has.dot": "1",
            "new\nline": "1",
        }
    )
    assert env == {"HOME": "/h", "BASH_FUNC_ml%%": "() { x; }"}
    assert skipped == ["BAD\\xff", "LATIN1", "has.dot", "new\\nline"]
    assert all(name.isprintable() for name in skipped)


def test_client_sums_up_long_families_of_names() -> None:
    slurm = [f"SLURM_V{i}" for i in range(12)]
    assert api._names(["CUDA_VISIBLE_DEVICES", *slurm, "RANK"]) == (
        "CUDA_VISIBLE_DEVICES, SLURM_* (12 variables), RANK"
    )
    assert api._names(["MASTER_ADDR", "MASTER_PORT"]) == "MASTER_ADDR, MASTER_PORT"


class FakeClient(Client):
    """A Client whose master answers submit with `answer` and records the body."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("127.0.0.1:1", token="t")
        self.answer = answer
        self.sent: dict[str, Any] = {}

    def _request(self, method: str, path: str, body: Any = None, timeout: Any = None) -> Any:
        assert (method, path) == ("POST", "/api/jobs")
        self.sent = body
        return self.answer


DROPPED = {"job_id": "a1b2c3d4", "dropped_env": ["CUDA_VISIBLE_DEVICES", "MGPU_MASTER"]}


def test_client_warns_about_inherited_variables_only_when_it_would_surprise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MGPU_JOB_ID", raising=False)
    monkeypatch.setenv("MGPU_MASTER", "127.0.0.1:1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("NOT_UTF8", "\udcff")
    c = FakeClient(DROPPED)
    job = c.submit("true")
    assert c.sent["env"]["CUDA_VISIBLE_DEVICES"] == "3" and "NOT_UTF8" not in c.sent["env"]
    assert job.warnings == [
        "not passed to the job (name or value not UTF-8, or not a variable name): NOT_UTF8",
        "not passed to the job, mgpu sets them itself: CUDA_VISIBLE_DEVICES",  # not MGPU_*
    ]
    monkeypatch.setenv("MGPU_JOB_ID", "a1b2c3d4")  # inside a job: it all came from mgpu
    assert FakeClient(DROPPED).submit("true").warnings[1:] == []
    explicit = FakeClient(DROPPED).submit(["true"], env={"CUDA_VISIBLE_DEVICES": "3"})
    assert explicit.warnings == [
        "not passed to the job, mgpu sets them itself: CUDA_VISIBLE_DEVICES, MGPU_MASTER"
    ]
    assert FakeClient({"job_id": "a1b2c3d4"}).submit("true", env={}).warnings == []


def test_client_refuses_a_directory_that_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(odd)
    monkeypatch.chdir(odd)
    with pytest.raises(api.MgpuError) as exc:
        FakeClient(DROPPED).submit("true")
    assert str(exc.value) == (
        f"the current directory {tmp_path}/caf\\xe9 is not valid UTF-8, and the job would run "
        "there; submit from another directory or give cwd"
    )
    assert FakeClient({"job_id": "x"}).submit("true", cwd="/tmp").id == "x"  # given: fine
