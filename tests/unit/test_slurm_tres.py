"""CPUs and memory in the Slurm commands' output, in Slurm 22.05's formats: squeue %C %m,
sinfo %c %m %e %C (and -O), sacct AllocCPUS ReqCPUS ReqMem AllocTRES ReqTRES, scontrol
show job/node; from the job's ask and grants and the node's CPUs and memory."""

from __future__ import annotations

from typing import Any

import pytest

from mgpu.slurm import fields, sacct, scontrol, sinfo, squeue, tres

NOW = 1_700_000_000.0


def job(**over: Any) -> dict[str, Any]:
    """A running Slurm job of 2 GPUs on 2 nodes, granted 8 CPUs and 16 GiB on each."""
    base: dict[str, Any] = {
        "id": "77",
        "name": "train",
        "user": "alice",
        "state": "running",
        "gpus": 4,
        "nodes": 2,
        "gpus_per_node": 2,
        "exit_code": None,
        "reason": None,
        "allocation": [
            {"node_id": "n1", "gpu_ids": [0, 1], "cpus": 8, "mem_mb": 16384},
            {"node_id": "n2", "gpu_ids": [0, 1], "cpus": 8, "mem_mb": 16384},
        ],
        "submit_time": NOW - 100,
        "start_time": NOW - 60,
        "end_time": None,
        "time_limit": 3600.0,
        "cwd": "/home/alice",
        "resources": {"cpus_per_gpu": 4, "mem_per_gpu_mb": 8192},
        "slurm": {"partition": "gpu", "ntasks_per_node": 2},
    }
    base.update(over)
    return base


QUEUED = {"state": "queued", "allocation": [], "start_time": None}
PLAIN = {"resources": None, "slurm": {"ntasks": 4, "cpus_per_task": 2}}
"""A job that asked for nothing and holds nothing of its own: its tasks times -c."""
PLAIN_ALLOCATION = [{"node_id": "n1", "gpu_ids": [], "cpus": None, "mem_mb": None}]


@pytest.mark.parametrize(
    ("number", "unit", "text"),
    [
        (0, 2, "0"),
        (16000, 2, "16000M"),
        (16384, 2, "16G"),
        (1536, 2, "1.50G"),  # half values count as exact
        (1024 * 1024, 2, "1T"),
        (64, 0, "64"),
        (1024, 0, "1K"),
    ],
)
def test_slurms_units(number: int, unit: int, text: str) -> None:
    assert tres.convert(number, unit) == text


def squeue_line(fmt: str, j: dict[str, Any]) -> str:
    items = fields.parse_percent("squeue", fmt, squeue.KNOWN)
    return fields.render_percent(items, squeue.KNOWN, [j], False)[0]


@pytest.mark.parametrize(
    ("over", "line"),
    [
        # As Slurm 22.05 (measured, tests/slurmdiff): %C the CPUs granted, or while
        # pending its tasks times -c (not --cpus-per-gpu's); %m only a size asked per
        # node or CPU (--mem-per-gpu's is MemPerTres)
        ({}, "16|0"),
        (QUEUED, "4|0"),
        ({**QUEUED, "resources": {"mem_per_cpu_mb": 2048, "cpus_per_node": 3}}, "6|2G"),
        ({**QUEUED, "resources": {"mem_per_node_mb": 16000}}, "4|16000M"),  # 2 tasks x 2
        ({**PLAIN, "allocation": PLAIN_ALLOCATION, "nodes": 1}, "8|0"),  # as before
    ],
)
def test_squeue_cpus_and_min_memory(over: dict[str, Any], line: str) -> None:
    assert squeue_line("%C|%m", job(**over)) == line
    items = fields.parse_long("squeue", "NumCPUs:|,MinMemory", squeue.KNOWN, squeue.LONG_NAMES)
    assert fields.render_percent(items, squeue.KNOWN, [job(**over)], False)[0].replace(
        " ", ""
    ) == line.replace(" ", "")


def sacct_row(spec: str, j: dict[str, Any]) -> str:
    cols = fields.parse_fields("sacct", spec, sacct.KNOWN)
    return fields.render_fields(cols, [j], False, "P")[0]


SACCT = "AllocCPUS,ReqCPUS,ReqMem,AllocTRES,ReqTRES"


def test_sacct_cpus_memory_and_tres() -> None:
    assert sacct_row(SACCT, job()) == (
        "16|4|32G|billing=16,cpu=16,gres/gpu=4,mem=32G,node=2|"
        "billing=4,cpu=4,gres/gpu=4,mem=32G,node=2"
    )  # ReqCPUS: its tasks times -c, as Slurm's (the CPUs per GPU come with the grant)
    # Pending: nothing allocated, what it asks.
    assert sacct_row(SACCT, job(**QUEUED)) == ("0|4|32G||billing=4,cpu=4,gres/gpu=4,mem=32G,node=2")
    # A job that asked for nothing: its tasks times -c, no memory, no GPU if none.
    plain = job(**PLAIN, allocation=PLAIN_ALLOCATION, nodes=1, gpus=0)
    assert sacct_row(SACCT, plain) == "8|8||billing=8,cpu=8,node=1|billing=8,cpu=8,node=1"


def test_sacct_steps_are_not_billed() -> None:
    batch = sacct.batch_step(job(slurm={"batch": True, "partition": "gpu"}))
    assert batch is not None
    assert sacct_row("JobID,AllocTRES,ReqTRES,ReqMem", batch) == (
        "77.batch|cpu=8,gres/gpu=2,mem=16G,node=1||"
    )


def test_scontrol_show_job() -> None:
    text = scontrol.job_text(job())
    assert "NumNodes=2 NumCPUs=16 NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:*" in text
    assert "   TRES=cpu=16,mem=32G,node=2,billing=16,gres/gpu=4\n" in text  # Slurm's id order
    assert "   Socks/Node=* NtasksPerN:B:S:C=2:0:*:* CoreSpec=*\n" in text
    assert "   MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0\n" in text  # per GPU: 0
    assert "   CpusPerTres=gres:gpu:4\n" in text
    assert "   MemPerTres=gres:gpu:8192\n" in text
    pending = scontrol.job_text(job(**QUEUED, resources={"mem_per_cpu_mb": 1000}))
    assert "MinMemoryCPU=1000M" in pending and "CpusPerTres" not in pending


def node(name: str, cpus: Any, free: Any, mem: Any, mem_free: Any, state: str = "online") -> Any:
    return {
        "node_id": name,
        "state": state,
        "connected": True,
        "gpus": [{"index": 0, "busy_job": None}],
        "cpus": cpus,
        "cpus_free": free,
        "mem_mb": mem,
        "mem_free_mb": mem_free,
    }


def test_scontrol_show_node() -> None:
    text = scontrol.node_text(node("n1", 64, 40, 257000, 200000))
    assert "   CPUAlloc=24 CPUEfctv=64 CPUTot=64 CPULoad=N/A\n" in text
    assert "   RealMemory=257000 AllocMem=57000 FreeMem=200000\n" in text
    older = scontrol.node_text(node("n0", None, None, None, None))  # says nothing: Slurm's 1
    assert "CPUAlloc=0 CPUEfctv=1 CPUTot=1" in older
    assert "RealMemory=1 AllocMem=0 FreeMem=N/A" in older


def test_sinfo_cpu_and_memory_columns() -> None:
    nodes = [
        node("n1", 64, 40, 257000, 200000),
        node("n2", 64, 64, 257000, 257000),
        node("n3", 32, 32, 128000, 128000, state="drained"),
    ]
    part = sinfo.Partition("gpu", True, "infinite", ["n1", "n2", "n3"])
    rows = sinfo.rows([part], nodes, per_node=False, wanted=None)
    items = fields.parse_percent("sinfo", "%t|%c|%m|%e|%C", sinfo.KNOWN, what="node")
    assert fields.render_percent(items, sinfo.KNOWN, rows, True) == [
        "STATE|CPUS|MEMORY|FREE_MEM|CPUS(A/I/O/T)",
        "idle|64|257000|200000-257000|24/104/0/128",
        "drain|32|128000|128000|0/0/32/32",
    ]
    everything = sinfo.rows([part], nodes[:1] + nodes[2:], per_node=False, wanted=None)
    items = fields.parse_long(
        "sinfo", "cpus:|,memory:|,freemem:|,cpusstate", sinfo.KNOWN, sinfo.LONG_NAMES, "node"
    )
    lines = fields.render_percent(items, sinfo.KNOWN, everything, False)
    assert [line.replace(" ", "") for line in lines] == [
        "64|257000|200000|24/40/0/64",
        "32|128000|128000|0/0/32/32",
    ]
    mixed = sinfo.Row(part, "idle", nodes)  # nodes unlike: the least, and `+`
    assert sinfo.KNOWN["c"][1](mixed) == "32+" and sinfo.KNOWN["m"][1](mixed) == "128000+"
