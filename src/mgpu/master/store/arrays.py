"""Job arrays kept compactly: one stored row for the whole array, a task row once it changes.

As Slurm keeps one job record for the pending part of an array and splits a task off only
when it starts, the store holds an array as one `arrays` row (the request as a template
job, and the task indices as ranges).  A task gets a row of its own in `jobs` the first time
it changes (starts, is cancelled, ends); until then it is the template with its index.  So
submitting 100,000 tasks writes one small row in one transaction (all of it or nothing),
and a restart rebuilds the tasks that have no row from the template (`tasks`).

In memory every active task is a `Job` (the scheduler sees them in order); the tasks share
the template's lists and dicts (argv, env ...), which nothing changes after submit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import fields
from typing import Any

from mgpu import spec as specs
from mgpu.model import Job
from mgpu.spec import encode_indices

__all__ = ["decode_indices", "encode_indices", "task", "tasks"]

_JOB_FIELDS = tuple(f.name for f in fields(Job))
_PER_TASK = frozenset(
    {"id", "array_job_id", "array_task_id", "array_max_running", "allocation", "attempts"}
)
"""Fields each task of an array has for itself (allocation and attempts: fresh lists)."""


def common_fields(template: Job) -> dict[str, Any]:
    """What every task of `template`'s array shares with it."""
    return {f: getattr(template, f) for f in _JOB_FIELDS if f not in _PER_TASK}


def task(common: dict[str, Any], array_id: str, index: int, max_running: int | None) -> Job:
    """Task `index` of an array (its id ``ARRAY_INDEX``), queued as submitted."""
    return Job(
        **common,
        id=specs.array_task_id(array_id, index),
        array_job_id=array_id,
        array_task_id=index,
        array_max_running=max_running,
    )


def tasks(template: Job, indices: Iterable[int], max_running: int | None) -> Iterator[Job]:
    """The tasks of `template`'s array at `indices`, in that order."""
    common = common_fields(template)
    for index in indices:
        yield task(common, template.id, index, max_running)


def decode_indices(text: str) -> list[int]:
    """The indices `encode_indices` wrote."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out
