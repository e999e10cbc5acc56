"""The account's login environment under a batch script sent SLURM_GET_USER_ENV=1
(sbatch --export=NONE or a list), as Slurm's --get-user-env: mgpu.agent.userenv."""

from __future__ import annotations

import asyncio
import os
import pwd
from typing import Any

import pytest

from mgpu.agent import userenv
from mgpu.protocol import Grant, Launch


def launch(**over: Any) -> Launch:
    fields: dict[str, Any] = {
        "job_id": "7",
        "epoch": 1,
        "argv": ["true"],
        "env": {"SLURM_GET_USER_ENV": "1", "SLURM_JOB_ID": "7"},
        "grant": Grant(gpus=[]),
        "output_file": "slurm-7.out",
        "user": pwd.getpwuid(os.geteuid()).pw_name,
    }
    return Launch(**(fields | over))


def test_only_a_batch_script_on_the_node_that_asked_loads_it() -> None:
    assert userenv.wanted(launch())
    assert not userenv.wanted(launch(env={"SLURM_JOB_ID": "7"}))  # --export=ALL
    assert not userenv.wanted(launch(output_file=None))  # an srun step: the script's env
    assert not userenv.wanted(launch(image="ubuntu:22.04"))  # the image's environment


def test_parse_skips_what_the_login_printed_and_slurms_discarded_names() -> None:
    out = (
        b"Welcome to the cluster\n\nXXXXMGPUSTARTPARSINGHEREXXXX\n"
        b"USER=alice\0MULTI=a\nb\0DISPLAY=:0\0HOSTNAME=login1\0EMPTY=\0"
        b"XXXXMGPUSTOPPARSINGHEREXXXX\n"
    )
    assert userenv.parse(out) == {"USER": "alice", "MULTI": "a\nb", "EMPTY": ""}
    assert userenv.parse(b"USER=alice\0") is None  # the login never reached `env`


@pytest.mark.skipif(os.geteuid() != 0, reason="a login as another account needs root")
def test_the_login_environment_goes_under_the_variables_sent() -> None:
    msg = launch(user="root", env={"SLURM_GET_USER_ENV": "1", "HOME": "/sent"})
    note = asyncio.run(userenv.load(msg, timeout=60))
    assert note is None
    assert msg.env["USER"] == msg.env["LOGNAME"] == "root"  # the login's
    assert msg.env["HOME"] == "/sent"  # what the job was sent wins
    assert msg.env["SLURM_GET_USER_ENV"] == "1"
    assert "PATH" in msg.env and "ENVIRONMENT" not in msg.env


def test_a_login_that_fails_still_runs_the_job_and_says_why() -> None:
    msg = launch(user="no-such-account-h31", env={"SLURM_GET_USER_ENV": "1", "A": "1"})
    note = asyncio.run(userenv.load(msg, timeout=60))
    assert note is not None and "could not load no-such-account-h31's login environment" in note
    assert msg.env == {"SLURM_GET_USER_ENV": "1", "A": "1"}
