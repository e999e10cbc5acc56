"""What reaches the processes the agent runs as itself (root on a real node): never the
environment a user submitted (mgpu.agent.privileged)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mgpu.agent import containers, privileged
from mgpu.agent.containers import Runtime
from mgpu.agent.launcher import JobError
from mgpu.agent.site import SiteHooks
from mgpu.protocol import Launch

# What a hostile user puts in a job's environment, hoping a root process picks it up.
USER_ENV = {
    "LD_PRELOAD": "/tmp/evil.so",
    "LD_LIBRARY_PATH": "/tmp/evil",
    "PATH": "/tmp/evil/bin:/usr/bin",
    "PYTHONPATH": "/tmp/evil/py",
    "BASH_ENV": "/tmp/evil/rc",
    "SECRET": "s3cr3t",
}
JOB_ENV = USER_ENV | {"MGPU_JOB_ID": "j1", "CUDA_VISIBLE_DEVICES": "2", "WORLD_SIZE": "1"}


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's own environment: its runtime settings, and junk it must not pass on."""
    monkeypatch.setenv("CONTAINERS_CONF", "/etc/mgpu/containers.conf")
    monkeypatch.setenv("PYTHONPATH", "/agent/only")


def _no_user_values(env: dict[str, str]) -> None:
    for key, value in USER_ENV.items():
        assert env.get(key) != value, key
    assert "LD_PRELOAD" not in env and "PYTHONPATH" not in env and "SECRET" not in env
    assert env["PATH"] == privileged.SAFE_PATH


def test_base_env_is_fixed(agent_env: None) -> None:
    env = privileged.base_env({"MGPU_JOB_USER": "al"})
    me = pwd.getpwuid(os.geteuid())
    assert env == {
        "PATH": privileged.SAFE_PATH,
        "HOME": me.pw_dir,
        "USER": me.pw_name,
        "LOGNAME": me.pw_name,
        "CONTAINERS_CONF": "/etc/mgpu/containers.conf",
        "MGPU_JOB_USER": "al",
    }


def test_site_scripts_get_the_scheduler_variables_only(agent_env: None) -> None:
    env = privileged.script_env(JOB_ENV | {"MGPU_RUN_TAG": "t"}, "al", "prolog")
    _no_user_values(env)
    assert env["MGPU_JOB_ID"] == "j1" and env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env["WORLD_SIZE"] == "1" and env["MGPU_SCRIPT_CONTEXT"] == "prolog"
    assert "MGPU_RUN_TAG" not in env  # the agent would kill the script with the job


def test_processes_started_as_the_agent_really_get_the_base(agent_env: None) -> None:
    """Through `run` (version probes, nvidia-smi) and `start` (scripts, image checks)."""

    def parse(text: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in text.splitlines())

    assert parse(privileged.run(["/usr/bin/env"], 10).stdout) == privileged.base_env()

    async def started() -> dict[str, str]:
        proc = await privileged.start(
            ["/usr/bin/env"], {"MGPU_JOB_ID": "j1"}, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        return parse(out.decode())

    assert asyncio.run(started()) == privileged.base_env({"MGPU_JOB_ID": "j1"})


def test_env_file_takes_posix_names_and_line_safe_values(tmp_path: Path) -> None:
    env = {
        "GOOD": "a b = c $HOME # ' \" \\",
        "_x1": "",
        "A=B": "1",
        "1ABC": "1",
        "BASH_FUNC_f%%": "() { :; }",
        "NL": "a\nb",
        "CR": "a\r",
        "NUL": "a\0b",
        "SURR": "\ud800",
        "UNI": "é€",
    }
    path = tmp_path / "j.env"
    path.write_text("old, world-readable\n")
    path.chmod(0o644)
    dropped = privileged.write_env_file(path, env, inherit=["MGPU_RUN_TAG"])
    assert dropped == sorted(["A=B", "1ABC", "BASH_FUNC_f%%", "NL", "CR", "NUL", "SURR"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text(encoding="utf-8").splitlines() == [
        "GOOD=a b = c $HOME # ' \" \\",
        "UNI=é€",
        "_x1=",
        "MGPU_RUN_TAG",
    ]
    link = tmp_path / "link.env"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # never written through a symlink
        privileged.write_env_file(link, {"A": "1"})
    assert not (tmp_path / "elsewhere").exists()


def _hooks(tmp_path: Path, runtime: Runtime) -> SiteHooks:
    spool = tmp_path / "spool"
    spool.mkdir()
    launcher: Any = SimpleNamespace(spool=spool)
    hooks = SiteHooks(SimpleNamespace(), launcher, "n1")
    hooks.runtime = runtime
    return hooks


def _launch(**kw: Any) -> Launch:
    fields: dict[str, Any] = {
        "job_id": "j1",
        "epoch": 1,
        "argv": ["python", "train.py"],
        "env": JOB_ENV,
        "grant": {"gpus": [2]},
        "image": "img:1",
        "epilog": "/etc/mgpu/epilog.sh",
    }
    return Launch(**(fields | kw))


NOBODY = (65534, 65534, [65534])


@pytest.mark.parametrize("name", ["podman", "docker"])
def test_root_container_runtime_gets_the_base_and_the_job_an_env_file(
    tmp_path: Path, agent_env: None, name: str
) -> None:
    hooks = _hooks(tmp_path, Runtime(name, f"/usr/bin/{name}"))
    argv, env, ids, note = hooks.wrap(_launch(), dict(JOB_ENV), NOBODY)
    assert ids is None  # the runtime (and its shim) run as the agent...
    _no_user_values(env)  # ...with the agent's environment, not the job's
    assert env == privileged.base_env()
    assert argv[argv.index("--user") + 1] == "65534:65534"  # the job keeps its uid inside
    env_file = Path(argv[argv.index("--env-file") + 1])
    assert env_file.parent == hooks.launcher.spool
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    lines = env_file.read_text().splitlines()
    # The job's own variables reach the container, where they act as the job's user (not
    # the host-only ones, nor the GPUs' host numbering): by file, so no value is on the
    # runtime's command line.
    assert lines == [
        "BASH_ENV=/tmp/evil/rc",
        "MGPU_JOB_ID=j1",
        "SECRET=s3cr3t",
        "WORLD_SIZE=1",
        "MGPU_RUN_TAG",
    ]
    assert not any("s3cr3t" in a for a in argv)
    assert note is None
    side = json.loads((hooks.launcher.spool / "j1.1.site.json").read_text())
    _no_user_values(side["epilog"]["env"])
    hooks.discard("j1", 1)  # a launch that then failed leaves nothing
    assert list(hooks.launcher.spool.iterdir()) == []


def test_apptainer_runs_as_the_user_with_the_users_environment(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path, Runtime("apptainer", "/usr/bin/apptainer"))
    argv, env, ids, _ = hooks.wrap(_launch(epilog=None), dict(JOB_ENV), NOBODY)
    assert ids == NOBODY and env == JOB_ENV  # not root: the job's own process
    assert "--env-file" not in argv and not containers.uses_env_file(hooks.runtime)  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_root_runtime_mounts_only_a_directory_the_user_can_enter(tmp_path: Path) -> None:
    private = tmp_path / "private"
    sub = private / "sub"
    sub.mkdir(parents=True)
    private.chmod(0o700)
    tmp_path.chmod(0o755)
    hooks = _hooks(tmp_path, Runtime("podman", "/usr/bin/podman"))
    fd = privileged.enter_dir("/", NOBODY)
    assert fd is not None
    os.close(fd)
    assert privileged.enter_dir(str(sub), NOBODY) is None
    with pytest.raises(JobError, match=f"cannot enter the working directory {sub}"):
        hooks.wrap(_launch(cwd=str(sub)), dict(JOB_ENV), NOBODY)
    argv, *_ = hooks.wrap(_launch(cwd=str(sub)), dict(JOB_ENV), None)  # a root job may
    assert argv[argv.index("-v") + 1] == f"{sub}:{sub}"


def test_bare_names_are_found_in_the_agents_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where to find a program is the admin's (the agent's PATH, e.g. an nvidia-smi under
    /opt); what it runs with is the fixed base."""
    tool = tmp_path / "site-tool"
    tool.write_text('#!/bin/sh\necho "$PATH"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    res = privileged.run(["site-tool"], 10)
    assert (res.returncode, res.stdout) == (0, privileged.SAFE_PATH + "\n")


def test_a_run_without_side_files_ends_without_spool_lookups(tmp_path: Path) -> None:
    """No epilog, no container: nothing written, and its end reads nothing (a hot path);
    once forgotten, it is looked up as any run is."""
    hooks = _hooks(tmp_path, Runtime("podman", "/usr/bin/podman"))
    hooks.wrap(_launch(image=None, epilog=None), dict(JOB_ENV), NOBODY)
    assert list(hooks.launcher.spool.iterdir()) == []
    run: Any = SimpleNamespace(rec=SimpleNamespace(job_id="j1", epoch=1), kill_reason=None)
    # A side file appearing behind its back is not read: the run is known to have none.
    (hooks.launcher.spool / "j1.1.site.json").write_text(
        '{"epilog": {"result": {"ok": false, "error": "x"}}}'
    )
    assert asyncio.run(hooks.after(run)) is None
    hooks.forget("j1", 1)
    assert asyncio.run(hooks.after(run)) == "epilog failed: x"  # forgotten: looked up again


def test_the_uid_switch_is_left_out_only_for_the_agents_own_ids() -> None:
    from mgpu.agent.spawn import same_ids

    uid, gid = os.getuid(), os.getgid()
    assert same_ids(uid, gid, [*os.getgroups(), gid])
    assert not same_ids(uid + 1, gid, os.getgroups())
    assert not same_ids(uid, gid + 1, os.getgroups())
    assert not same_ids(uid, gid, [*os.getgroups(), 4242, gid])
