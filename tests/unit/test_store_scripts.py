"""An array's script is stored once: each task's row refers to its array's (a 1 MiB script
in a 100,000-task array would otherwise be 100 GB of rows), and reads give it back."""

from __future__ import annotations

import json

from factories import master_job
from mgpu.master.store import arrays
from mgpu.master.store.base import SCRIPT_OF_ARRAY, Store
from mgpu.model import JobState
from stores import Backend

SCRIPT = "#!/bin/sh\n" + "# padding\n" * 20_000 + "echo $MGPU_ARRAY_TASK_ID\n"


def _raw(backend: Backend, store: Store, job_id: str) -> str:
    return str(backend.sql(store, "SELECT record FROM jobs WHERE id=?", (job_id,))[0][0])


def test_a_tasks_row_refers_to_its_arrays_script_and_reads_give_it_back(backend: Backend) -> None:
    store = backend.open()
    template = master_job("a1b2c3d4", command="job.sh")
    template.script, template.script_name, template.submit_time = SCRIPT, "job.sh", 1.0
    store.save_array(template, [0, 1, 2], None)
    done, running, _queued = arrays.tasks(template, [0, 1, 2], None)
    done.state, done.end_time, done.exit_code = JobState.COMPLETED, 5.0, 0
    running.state = JobState.RUNNING
    store.save_jobs([done, running])

    for task in (done, running):
        raw = json.loads(_raw(backend, store, task.id))
        assert raw["script"] is None and raw[SCRIPT_OF_ARRAY] is True
        assert len(_raw(backend, store, task.id)) < 4_000  # not the 200 KB script
        assert store.get_job(task.id) == task
    assert store.get_jobs([running.id])[running.id].script == SCRIPT
    assert [j.script for j in store.jobs_with_prefix("a1b2c3d4_")] == [SCRIPT, SCRIPT]
    assert [j.script for j in store.read_finished(0.0)] == [SCRIPT]  # its own connection
    store.close()

    again = backend.open()  # a restarted master: from the rows and the array's
    active = {j.id: j for j in again.load_active_jobs()}
    assert set(active) == {running.id, _queued.id}
    assert {j.script for j in active.values()} == {SCRIPT}
    again.close()


def test_a_lone_jobs_script_is_in_its_own_row(backend: Backend) -> None:
    store = backend.open()
    job = master_job("e5f6a7b8", command="job.sh", submit_time=1.0)
    job.script = SCRIPT
    store.save_jobs([job])
    assert json.loads(_raw(backend, store, job.id))["script"] == SCRIPT
    assert store.get_job(job.id) == job
    store.close()
