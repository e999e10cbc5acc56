"""A batch job whose -o/-e file cannot be opened, on a Kubernetes partition: the runner
says so first in the Pod's log and ends with 53 (mgpu.master.kube.podoutput); the master
fails the job with Slurm's sentence as a launch error, as on mgpu's own nodes.  A script's
own exit 53, or a 53 without that first line, is the script's exit code."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from mgpu.exits import OPEN_FAILED, open_failure
from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.pods import PodRuns
from mgpu.master.kube.runs import PodRun

SENTENCE = "slurmstepd: error: Could not open stdout file /nas/x/out.txt: Permission denied"


def test_the_runners_sentence_with_its_status_is_an_open_failure() -> None:
    assert open_failure(OPEN_FAILED, [SENTENCE]) == (
        "Could not open stdout file /nas/x/out.txt: Permission denied"
    )
    assert open_failure(OPEN_FAILED, ["the script's own first line"]) is None
    assert open_failure(OPEN_FAILED, []) is None  # nothing in the log
    assert open_failure(1, [SENTENCE]) is None


def _ended(first_line: str | None, code: int) -> Any:
    told: list[Any] = []
    cluster = SimpleNamespace(
        config=SimpleNamespace(cluster=SimpleNamespace(name="lab")),
        agent_message=lambda node, message: told.append(message),
    )
    runs = PodRuns(cluster, "k8s", KubernetesSection(), None)  # type: ignore[arg-type]
    run = PodRun("mgpu-lab-7-1-0", "7", 1, 0, "n1", 0.0)
    run.first_line = first_line
    view = SimpleNamespace(phase="Failed", reason="", deleting=False)
    asyncio.run(runs._finish(run, view, {"exitCode": code, "reason": "Error"}))  # type: ignore[arg-type]
    [exited] = told
    return exited


def test_the_job_fails_with_the_sentence_as_a_launch_error() -> None:
    exited = _ended(SENTENCE, OPEN_FAILED)
    assert exited.exit_code == OPEN_FAILED and exited.fatal
    assert exited.launch_error == "Could not open stdout file /nas/x/out.txt: Permission denied"


def test_a_scripts_own_53_is_its_exit_code() -> None:
    exited = _ended("starting the training", OPEN_FAILED)
    assert exited.exit_code == OPEN_FAILED and exited.launch_error is None and not exited.fatal
