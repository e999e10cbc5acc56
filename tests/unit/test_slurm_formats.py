"""The Slurm commands' output: squeue's and sinfo's `%` formats, sacct's field lists, Slurm's
state names and letters, `EXIT:SIGNAL` codes, host lists and array task ids."""

from __future__ import annotations

from typing import Any

import pytest

from mgpu.slurm import fields, sacct, scancel, scontrol, sinfo, squeue, states
from mgpu.slurm.common import SlurmError, clock, elapsed

NOW = 1_700_000_000.0


def test_sacct_lists_a_batch_jobs_batch_step_after_it() -> None:
    cols = fields.parse_fields(
        "sacct", "JobID,JobIDRaw,JobName,Partition,State,Timelimit", sacct.KNOWN
    )
    slurm = {"batch": True, "partition": "gpu"}
    done = job(state="completed", exit_code=0, slurm=slurm)
    task = job(
        id="50_2", array_job_id="50", array_task_id=2, state="failed", exit_code=3, slurm=slurm
    )
    pending = job(id="60", state="queued", start_time=None, slurm=slurm)
    rows = [r for j in (done, task, pending, job()) for r in (j, sacct.batch_step(j)) if r]
    assert fields.render_fields(cols, rows, False, "P") == [
        "1234|1234|a-long-job-name|gpu|COMPLETED|01:00:00",
        "1234.batch|1234.batch|batch||COMPLETED|",
        "50_2|52|a-long-job-name|gpu|FAILED|01:00:00",
        "50_2.batch|52.batch|batch||FAILED|",
        "60|60|a-long-job-name|gpu|PENDING|01:00:00",  # not started: no batch step yet
        "1234|1234|a-long-job-name|gpu|RUNNING|01:00:00",  # mgpu's own job: no batch step
    ]


def test_sacct_lists_the_srun_steps_a_job_ran_after_its_batch_step() -> None:
    cols = fields.parse_fields(
        "sacct", "JobID,JobName,Partition,AllocCPUS,State,ExitCode,NodeList", sacct.KNOWN
    )
    steps = [
        {"number": 0, "name": "hostname", "start": NOW, "end": NOW + 1, "exit_code": 0,
         "state": "completed", "nodes": ["n1", "n2"], "ntasks": 4},
        {"number": 1, "name": "python", "start": NOW + 2, "end": NOW + 3, "exit_code": 3,
         "state": "failed", "nodes": ["n1"], "ntasks": 1},
    ]  # fmt: skip
    done = job(
        state="completed",
        end_code="completed",  # the job's: a step's row shows its own state
        exit_code=0,
        slurm={"batch": True, "partition": "gpu"},
    )
    done["steps"] = steps
    rows = [r for r in (done, sacct.batch_step(done), *sacct.step_rows(done)) if r]
    assert fields.render_fields(cols, rows, False, "P") == [
        "1234|a-long-job-name|gpu|1|COMPLETED|0:0|node001",
        "1234.batch|batch||1|COMPLETED|0:0|node001",
        "1234.0|hostname||4|COMPLETED|0:0|n[1-2]",
        "1234.1|python||1|FAILED|3:0|n1",
    ]


def job(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "1234",
        "name": "a-long-job-name",
        "user": "alice",
        "state": "running",
        "gpus": 2,
        "nodes": 1,
        "exit_code": None,
        "reason": None,
        "allocation": [{"node_id": "node001", "gpu_ids": [0, 1]}],
        "submit_time": NOW - 100,
        "start_time": NOW - 65,
        "end_time": NOW,
        "time_limit": 3600.0,
        "cwd": "/home/alice",
        "slurm": {"partition": "gpu", "ntasks": 4, "cpus_per_task": 2},
    }
    base.update(over)
    return base


def render(fmt: str, jobs: list[dict[str, Any]], header: bool = True) -> list[str]:
    items = fields.parse_percent("squeue", fmt, squeue.KNOWN)
    return fields.render_percent(items, squeue.KNOWN, jobs, header)


def test_squeues_default_columns() -> None:
    pending = job(
        id="1235",
        state="queued",
        allocation=[],
        start_time=None,
        end_time=None,
        reason="waiting for 2 GPUs",
        reason_code="resources",
        nodes=2,
        slurm={},
    )
    lines = render(squeue.DEFAULT, [job(), pending])
    assert lines == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "              1234       gpu a-long-j    alice  R       1:05      1 node001",
        "              1235      main a-long-j    alice PD       0:00      2 (Resources)",
    ]


def test_squeue_fields() -> None:
    fmt = "%i|%j|%u|%t|%T|%M|%l|%L|%D|%R|%N|%P|%C|%b|%Z|%A|%F|%K|%r"
    assert render(fmt, [job()], header=False) == [
        "1234|a-long-job-name|alice|R|RUNNING|1:05|1:00:00|58:55|1|node001|node001|gpu|8|"
        "gres:gpu:2|/home/alice|1234|1234|N/A|None"
    ]
    assert render("%.6i %4t.", [job()]) == [" JOBID ST  .", "  1234 R   ."]


def test_array_tasks_folded_and_own() -> None:
    folded = job(id="50_3", array_job_id="50", array_task_id=3, array_tasks="3-9", state="queued")
    task = job(id="50_1", array_job_id="50", array_task_id=1)
    assert render("%i %F %K", [folded, task], header=False) == ["50_[3-9] 50 [3-9]", "50_1 50 1"]


def test_unknown_format_letters_are_said_and_printed_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Slurm's squeue/print.c: `Invalid job format specification: X` on stderr, the spec
    # printed as it is written, and the other fields as usual (exit status 0).
    items = fields.parse_percent("squeue", "%i %.5! %u", squeue.KNOWN)
    assert capsys.readouterr().err == "squeue: error: Invalid job format specification: !\n"
    assert fields.render_percent(items, squeue.KNOWN, [job(id="7", user="ann")], True) == [
        "JOBID %.5! USER",
        "7 %.5! ann",
    ]
    items = fields.parse_long("squeue", "jobid:4,nosuch:9|,name:3", squeue.KNOWN, squeue.LONG_NAMES)
    assert capsys.readouterr().err == "squeue: error: Invalid job format specification: nosuch\n"
    assert [i[0] if isinstance(i, tuple) else i for i in items] == ["i", "|", "j"]


def test_squeue_long_format() -> None:
    items = fields.parse_long("squeue", "jobid:8,name:.12,state", squeue.KNOWN, squeue.LONG_NAMES)
    lines = fields.render_percent(items, squeue.KNOWN, [job()], True)
    assert lines[0].rstrip() == "JOBID           NAMESTATE"  # as wide as said: no separator
    assert lines[1].rstrip() == "1234    a-long-job-nRUNNING"


def test_filters_and_order() -> None:
    jobs = [
        job(id="1", user="bob"),
        job(id="2", state="queued", allocation=[]),
        job(id="10"),
        job(id="3", state="completed"),
    ]
    got = squeue.select(jobs, None, {"alice"}, {"RUNNING", "PENDING"}, None, None)
    assert [j["id"] for j in got] == ["2", "10"]  # pending first, as Slurm sorts
    assert [j["id"] for j in squeue.select(jobs, {"10"}, None, None, None, None)] == ["10"]


@pytest.mark.parametrize(
    ("over", "name", "letters", "code"),
    [
        ({"state": "queued"}, "PENDING", "PD", "0:0"),
        ({"state": "running"}, "RUNNING", "R", "0:0"),
        ({"state": "completed", "exit_code": 0}, "COMPLETED", "CD", "0:0"),
        ({"state": "failed", "exit_code": 3}, "FAILED", "F", "3:0"),
        ({"state": "failed", "exit_code": -9}, "FAILED", "F", "0:9"),
        ({"state": "cancelled", "exit_code": 143}, "CANCELLED", "CA", "0:15"),
        ({"state": "timeout", "exit_code": 137}, "TIMEOUT", "TO", "0:9"),
        ({"state": "failed", "end_code": "node_fail"}, "NODE_FAIL", "NF", "0:0"),
        ({"state": "failed", "end_code": "boot_fail"}, "BOOT_FAIL", "BF", "0:0"),
        ({"state": "failed", "end_code": "launch_failed"}, "FAILED", "F", "0:0"),
        ({"state": "failed", "end_code": "never_fits"}, "FAILED", "F", "0:0"),
        ({"state": "cancelled", "end_code": "idle"}, "CANCELLED", "CA", "0:0"),
        ({"state": "cancelled", "end_code": "dependency_never"}, "CANCELLED", "CA", "0:0"),
        ({"state": "timeout", "end_code": "timeout"}, "TIMEOUT", "TO", "0:0"),
        # Never from the English text: a code says failed, the text what it likes.
        ({"state": "failed", "end_code": "failed", "reason": "oom"}, "FAILED", "F", "0:0"),
        ({"state": "failed", "end_code": "failed", "reason": "node n1 lost"}, "FAILED", "F", "0:0"),
        ({"state": "failed", "reason": "oom: node n1 lost"}, "FAILED", "F", "0:0"),
        ({"state": "running", "end_code": "node_fail"}, "RUNNING", "R", "0:0"),
    ],
)
def test_states(over: dict[str, Any], name: str, letters: str, code: str) -> None:
    j = job(**over)
    assert (states.state(j), states.letters(states.state(j)), states.exit_code(j)) == (
        name,
        letters,
        code,
    )


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"held": True}, "JobHeldUser"),
        ({"held": True, "held_by": "admin"}, "JobHeldAdmin"),
        ({"reason_code": "dependency"}, "Dependency"),
        ({"reason_code": "priority"}, "Priority"),
        ({"reason_code": "resources"}, "Resources"),
        ({"reason_code": "begin_time"}, "BeginTime"),
        ({"reason_code": "reservation"}, "Reservation"),
        ({"reason_code": "node_not_available"}, "ReqNodeNotAvail"),
        ({"reason_code": "user_gpu_limit"}, "QOSMaxGRESPerUser"),
        ({"reason_code": "user_job_limit"}, "QOSMaxJobsPerUserLimit"),
        ({"reason_code": "array_limit"}, "JobArrayTaskLimit"),
        ({"reason_code": None}, "None"),  # no pass has looked at it yet
        # Never from the English text, nor from what its start estimate waits on.
        ({"reason": "waiting for dependency 12", "reason_code": "resources"}, "Resources"),
        ({"waiting_on": ["7"], "reason_code": "resources"}, "Resources"),
    ],
)
def test_pending_reasons(over: dict[str, Any], reason: str) -> None:
    assert states.reason(job(state="queued", **over)) == reason


def test_state_filters() -> None:
    assert states.parse_states("squeue", "pd,R,completed") == {"PENDING", "RUNNING", "COMPLETED"}
    with pytest.raises(SlurmError) as e:
        states.parse_states("squeue", "sleeping")
    assert str(e.value) == "squeue: error: Invalid job state specified: sleeping"


def test_times() -> None:
    assert [elapsed(s) for s in (5, 65, 3600, 90061)] == ["0:05", "1:05", "1:00:00", "1-01:01:01"]
    assert [clock(s) for s in (5, 3600, 90061)] == ["00:00:05", "01:00:00", "1-01:01:01"]


def test_sacct_columns_and_parsable() -> None:
    cols = fields.parse_fields("sacct", sacct.DEFAULT, sacct.KNOWN)
    done = job(state="completed", exit_code=0)
    lines = fields.render_fields(cols, [done], True, None)
    assert lines == [
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
        "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
        "1234         a-long-jo+        gpu                     8  COMPLETED      0:0 ",
    ]
    cols = fields.parse_fields(
        "sacct", "jobid,State,exitcode,Elapsed,NodeList,JobName%20", sacct.KNOWN
    )
    assert fields.render_fields(cols, [done], True, "P") == [
        "JobID|State|ExitCode|Elapsed|NodeList|JobName",
        "1234|COMPLETED|0:0|00:01:05|node001|a-long-job-name",
    ]
    assert fields.render_fields(cols, [done], False, "p")[0].endswith("|a-long-job-name|")
    with pytest.raises(SlurmError) as e:
        fields.parse_fields("sacct", "JobID,Nonsense", sacct.KNOWN)
    assert str(e.value) == 'sacct: error: Invalid field requested: "Nonsense"'


def test_sinfo_rows() -> None:
    def node(name: str, busy: int, state: str = "online") -> dict[str, Any]:
        gpus = [{"index": i, "busy_job": "1" if i < busy else None} for i in range(2)]
        return {"node_id": name, "state": state, "connected": True, "gpus": gpus}

    nodes = [
        node("node001", 0),
        node("node002", 1),
        node("node003", 0),
        node("node004", 2),
        node("node005", 0, "drained"),
    ]
    parts = [
        sinfo.Partition("gpu", True, "2-00:00:00", ["node001", "node002", "node003", "node004"]),
        sinfo.Partition("debug", False, "infinite", ["node004", "node005"]),
    ]
    rows = sinfo.rows(parts, nodes, per_node=False, wanted=None)
    items = fields.parse_percent("sinfo", "%P %a %l %D %t %N", sinfo.KNOWN, what="node")
    assert fields.render_percent(items, sinfo.KNOWN, rows, True) == [
        "PARTITION AVAIL TIMELIMIT NODES STATE NODELIST",
        "gpu* up 2-00:00:00 2 idle node[001,003]",
        "gpu* up 2-00:00:00 1 mix node002",
        "gpu* up 2-00:00:00 1 alloc node004",
        "debug up infinite 1 alloc node004",
        "debug up infinite 1 drain node005",
    ]
    per_node = sinfo.rows(parts, nodes, per_node=True, wanted={"idle"})
    assert [(r.partition, r.nodes[0]["node_id"]) for r in per_node] == [
        ("gpu", "node001"),
        ("gpu", "node003"),
    ]


def test_hostnames(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert scontrol.hostnames(["node[01-02],gpu7"]) == 0
    assert capsys.readouterr().out == "node01\nnode02\ngpu7\n"
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "a[1-2]")
    assert scontrol.hostnames([]) == 0
    assert capsys.readouterr().out == "a1\na2\n"
    monkeypatch.setenv("SLURM_NODELIST", "b7")  # Slurm's default, before the job's
    assert scontrol.hostnames([]) == 0
    assert capsys.readouterr().out == "b7\n"
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST")
    with pytest.raises(SlurmError) as e:
        scontrol.hostnames([])
    assert str(e.value) == "scontrol: error: host list is empty"
    with pytest.raises(SlurmError) as e:
        scontrol.hostnames(["node[3-1]"])
    assert str(e.value) == "Invalid hostlist: node[3-1]"
    assert [scontrol.entity(w) for w in ("hostn", "host", "j", "jobid", "n", "pa", "p")] == [
        "hostnames",
        "host",
        "job",
        "job",
        "node",
        "partition",
        "p",
    ]


def test_scancel_task_ids() -> None:
    assert scancel.task_ids("12_[1-3,7]") == ["12_1", "12_2", "12_3", "12_7"]
    assert scancel.task_ids("12_4") == ["12_4"]
    with pytest.raises(SlurmError):
        scancel.task_ids("12_[a]")


def test_squeue_long_format_suffixes() -> None:
    items = fields.parse_long("squeue", "jobid:6|,state:.8|,name:", squeue.KNOWN, squeue.LONG_NAMES)
    assert fields.render_percent(items, squeue.KNOWN, [job()], False) == [
        "1234  | RUNNING|a-long-job-name"
    ]


def test_a_job_without_a_name_shows_slurms_default() -> None:
    unnamed = job(name=None, slurm={"job_name_default": "wrap"})
    assert render("%j", [unnamed], header=False) == ["wrap"]
    cols = fields.parse_fields("sacct", "JobName", sacct.KNOWN)
    assert fields.render_fields(cols, [unnamed], False, "P") == ["wrap"]
    assert render("%j", [job(name=None, slurm=None)], header=False) == [""]


def test_sacct_field_names_are_prefixes_in_slurms_order() -> None:
    # The line: `time` is Timelimit (the first of sacct's fields it begins).
    spec = "User%20,JobID,Jobname%40,partition,state,time,start,nodelist"
    cols = fields.parse_fields("sacct", spec, sacct.KNOWN)
    assert [(title, width) for title, width, _ in cols] == [
        ("User", 20),
        ("JobID", -12),
        ("JobName", 40),
        ("Partition", 10),
        ("State", 10),
        ("Timelimit", 10),
        ("Start", 19),
        ("NodeList", 15),
    ]
    # A shorter prefix is the first match in sacct.c's table, as Slurm's loop takes it.
    short = fields.parse_fields("sacct", "jobn,sta,exit,nn,elapsedr", sacct.KNOWN)
    assert [t for t, _, _ in short] == ["JobName", "Start", "ExitCode", "NNodes", "ElapsedRaw"]
    # A field of Slurm's that mgpu gathers nothing for is there, empty.
    ((title, _, getter),) = fields.parse_fields("sacct", "maxrss", sacct.KNOWN)
    assert (title, getter(job())) == ("MaxRSS", "")
    assert len(fields.parse_fields("sacct", "ALL", sacct.KNOWN)) == len(sacct.KNOWN)
    with pytest.raises(SlurmError) as e:
        fields.parse_fields("sacct", "JobID,timez", sacct.KNOWN)
    assert str(e.value) == 'sacct: error: Invalid field requested: "timez"'


def test_squeue_and_sinfo_long_names_are_whole_names_in_any_case(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # squeue's and sinfo's opts.c compare -O names whole (xstrcasecmp), not by prefix.
    items = fields.parse_long("squeue", "JobID:6,NAME:5,stATe:8", squeue.KNOWN, squeue.LONG_NAMES)
    assert items == [("i", 6, False), ("j", 5, False), ("T", 8, False)]
    assert fields.parse_long("squeue", "time", squeue.KNOWN, squeue.LONG_NAMES) == []
    assert "squeue: error: Invalid job format specification: time" in capsys.readouterr().err
    items = fields.parse_long(
        "sinfo", "PartitionName:6,statecompact:6,NodeList", sinfo.KNOWN, sinfo.LONG_NAMES, "node"
    )
    assert items == [("R", 6, False), ("t", 6, False), ("N", 20, False)]
    assert fields.parse_long("sinfo", "part", sinfo.KNOWN, sinfo.LONG_NAMES, "node") == []
    assert "sinfo: error: Invalid node format specification: part" in capsys.readouterr().err
    # Each field is declared once: one row per letter, no name for two letters.
    for columns in (squeue.COLUMNS, sinfo.COLUMNS):
        letters = [c[0] for c in columns]
        names = [n.lower() for c in columns for n in c[1].split()]
        assert len(letters) == len(set(letters)) and len(names) == len(set(names))


def test_every_typed_end_has_slurms_state() -> None:
    from mgpu.model import EndCode

    assert set(states.END_CODES) == {code.value for code in EndCode}
    assert set(states.END_CODES.values()) <= states.ALL_NAMES


def test_slurm_states_read_no_english_text() -> None:
    """The jobs' states and reasons come from their typed codes: states.py never looks
    at a job's `reason` sentence (it did, to guess NODE_FAIL and OUT_OF_MEMORY)."""
    import inspect

    source = inspect.getsource(states)
    assert 'get("reason")' not in source and "['reason']" not in source
    assert '["reason"]' not in source


def test_every_typed_wait_reason_has_slurms_code() -> None:
    from mgpu.model import WaitCode

    assert set(states.WAIT_CODES) | {"held"} == {code.value for code in WaitCode}
