"""Shared jobs under MPS: the agent finds the control daemon by its pipe and sets the job's
MPS variables (a fake pipe directory stands in for `nvidia-cuda-mps-control -d`)."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import pytest

from mgpu.agent import mps
from mgpu.agent.mps import DEFAULT_LOG_DIR, mps_env, pipe_dir

SHARED = {"MGPU_GPU_SHARE": "0.25", "MGPU_GPU_MEMORY_LIMIT_MB": "20480"}


def daemon(tmp_path: Path) -> Path:
    pipes = tmp_path / "mps"
    pipes.mkdir(mode=0o755)
    os.mkfifo(pipes / "control")
    (tmp_path / "mps-log").mkdir(mode=0o755)
    return pipes


def daemon_env(tmp_path: Path) -> dict[str, str]:
    """The agent's environment: where the daemon's pipe and log directories are."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
    }


def test_shared_job_runs_under_the_daemon(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    env = mps_env(SHARED, daemon_env(tmp_path))
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    }


def test_the_default_log_directory_is_used_when_it_is_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipes = daemon(tmp_path)
    monkeypatch.setattr(mps, "DEFAULT_LOG_DIR", str(tmp_path / "mps-log"))
    env = mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps-log")
    assert DEFAULT_LOG_DIR == "/var/log/nvidia-mps"


@pytest.mark.parametrize("which", ["mps", "mps-log"])
@pytest.mark.parametrize("how", ["another user's", "group-writable", "world-writable", "a link"])
def test_a_directory_a_user_could_have_made_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str, how: str
) -> None:
    """/tmp/nvidia-mps (the default) can be made by anyone before the daemon starts: a
    user's fake `control` there would have other users' jobs talk to that user's server."""
    daemon(tmp_path)
    path = tmp_path / which
    if how == "another user's":
        os.chown(path, 12345, 12345)
    elif how == "group-writable":
        path.chmod(0o775)
    elif how == "world-writable":
        path.chmod(0o1777)  # sticky /tmp-like: still anyone's to fill
    else:
        real = tmp_path / f"{which}.real"
        path.rename(real)
        path.symlink_to(real)
    assert os.path.isdir(path)
    mps._refused.clear()
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        assert mps_env(SHARED, daemon_env(tmp_path)) == {}
        assert mps_env(SHARED, daemon_env(tmp_path)) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and "without MPS" in lines[0], lines


def test_a_missing_log_directory_is_refused(tmp_path: Path) -> None:
    daemon(tmp_path)
    (tmp_path / "mps-log").rmdir()
    assert mps_env(SHARED, daemon_env(tmp_path)) == {}


def test_a_daemon_listening_on_a_socket_is_found(tmp_path: Path) -> None:
    """Driver 580's daemon (seen on an H200) makes `control` a Unix socket, not a FIFO: the
    agent that looked for a FIFO started a second daemon, which failed, and ran every shared
    job without MPS."""
    pipes = tmp_path / "mps"
    pipes.mkdir(mode=0o755)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):  # not only a stream socket
        (pipes / "control").unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, kind) as listening:
            listening.bind(str(pipes / "control"))
            listening.listen(1)
            assert pipe_dir(env) == pipes
        # It quit: its socket stays on disk (as driver 580's does), and nothing answers.
        assert (pipes / "control").exists()
        assert pipe_dir(env) is None


def test_no_daemon_or_no_share_no_mps(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    assert mps_env({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}) == {}
    empty = tmp_path / "none"
    empty.mkdir()
    assert mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) == {}
    (empty / "control").write_text("")  # a plain file is not the daemon's FIFO
    assert pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) is None


# --------------------------------------------------------------------------- the daemon

FAKE_CONTROL = r"""#!/bin/sh
# nvidia-cuda-mps-control as the agent uses it: -d forks the daemon (here: opens its
# control pipe and returns); one command on stdin otherwise.  Servers are made-up pids
# (7000 + uid) listed in `servers`; every call is logged, one line each.
here="$(dirname "$0")"
log="$here/calls"
if [ "$1" = "-d" ]; then
    echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$log"
    mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read -r command
set -- $command
case "$1" in
    quit) echo "quit $CUDA_MPS_PIPE_DIRECTORY" >> "$log"
          rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" "$here/servers" ;;
    get_server_list) echo "$command" >> "$log"; cat "$here/servers" 2>/dev/null || true ;;
    start_server) echo "$command" >> "$log"
          if [ -e "$here/slow" ]; then
              (sleep 0.3; echo $((7000 + $3)) >> "$here/servers") >/dev/null 2>&1 &
          elif [ ! -e "$here/refuse-$3" ]; then
              echo $((7000 + $3)) >> "$here/servers"
          fi ;;
    shutdown_server) echo "$command" >> "$log"
          grep -v "^$2\$" "$here/servers" > "$here/kept"; mv "$here/kept" "$here/servers" ;;
    set_active_thread_percentage) echo "$command" >> "$log"
          echo "$3.0" ;;  # driver 580's daemon echoes the percentage it set
    *) echo "$command" >> "$log" ;;
esac
"""

UID = 1234
PID = 7000 + UID
GPU = "GPU-6f1c2d3e-0000-1111-2222-333344445555"


def owner(pid: int) -> int | None:
    """The fake's servers' users (its pids are made up)."""
    return pid - 7000 if pid >= 7000 else None


def fake_control(tmp_path: Path) -> dict[str, str]:
    """A fake `nvidia-cuda-mps-control` on PATH; the agent's environment naming it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / mps.CONTROL
    script.write_text(FAKE_CONTROL)
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", **daemon_env(tmp_path)}


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "bin" / "calls"
    return log.read_text().splitlines() if log.exists() else []


def control_of(node_dir: Path, env: dict[str, str]) -> mps.MpsControl:
    control = mps.MpsControl(node_dir, env, owner=owner)
    control.server_wait = 0.0  # the fake lists a server at once, or never
    return control


def started(
    control: mps.MpsControl, env: dict[str, str], job_id: str, uid: int = UID, gpu: str = GPU
) -> dict[str, str]:
    """What the agent does for a shared job: limits set (prepare), then its environment."""
    control.prepare(env, job_id, uid, gpu)
    got = control.job_env(env, job_id)
    control.launched(job_id)
    return got


LIMITED = [
    "get_server_list",
    f"start_server -uid {UID}",
    "get_server_list",
    f"set_active_thread_percentage {PID} 25",
    f"set_device_pinned_mem_limit {PID} {GPU} 20480M",
]
"""The commands that start a user's server and hold it to SHARED's grant."""


def test_the_agent_starts_mps_for_shared_jobs_and_stops_it_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = fake_control(tmp_path)
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    control = control_of(node_dir, env)
    assert control.enforced() and "started when shared jobs need it" in control.describe()
    control.prepare({"CUDA_VISIBLE_DEVICES": "0"}, "whole", UID, GPU)
    assert control.job_env({"CUDA_VISIBLE_DEVICES": "0"}, "whole") == {}
    assert calls(tmp_path) == []  # a whole-GPU job needs no daemon

    first = started(control, SHARED, "a")
    pipes, logs = tmp_path / "mps", tmp_path / "mps-log"
    assert calls(tmp_path) == [f"start {pipes} {logs}", *LIMITED]
    assert first["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
    assert first["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert (node_dir / mps.STARTED_MARK).exists()
    assert started(control, SHARED, "b") == first  # it runs: not started again
    assert calls(tmp_path)[6:] == ["get_server_list"]  # its limits are already the grant
    assert "an MPS control daemon runs" in control.describe()

    now = time.monotonic()
    control.settle(["b", "whole"], now)  # one shared job still runs
    assert calls(tmp_path)[7:] == ["get_server_list"]  # limits kept: b's grant is a's
    control.settle(["whole"], now)
    assert calls(tmp_path)[8:] == [f"quit {pipes}"]  # the daemon and its servers go
    assert pipe_dir(env) is None and not (node_dir / mps.STARTED_MARK).exists()
    control.settle([], now)  # nothing left to stop
    assert len(calls(tmp_path)) == 9
    assert "answered" not in caplog.text  # the percentage echoed back is not an error


def test_a_job_launched_after_the_running_list_was_read_is_kept(tmp_path: Path) -> None:
    control = control_of(tmp_path, fake_control(tmp_path))
    as_of = time.monotonic()
    started(control, SHARED, "late")  # launched while the heartbeat read its list
    control.settle([], as_of)
    assert calls(tmp_path)[0].startswith("start ")
    assert not any(c.startswith(("quit", "shutdown_server")) for c in calls(tmp_path))


def test_a_daemon_the_agent_did_not_start_is_left_running(tmp_path: Path) -> None:
    daemon(tmp_path)  # the site's
    env = fake_control(tmp_path)
    control = control_of(tmp_path, env)
    assert started(control, SHARED, "a")["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps")
    assert calls(tmp_path) == LIMITED  # its server is held all the same
    control.settle([], time.monotonic())
    # The user's last shared job ended: their server goes (its limits with it), the
    # site's daemon stays.
    assert calls(tmp_path)[5:] == ["get_server_list", f"shutdown_server {PID}"]
    assert pipe_dir(env) is not None


def test_the_next_agent_stops_the_daemon_its_predecessor_started(tmp_path: Path) -> None:
    env = fake_control(tmp_path)
    started(control_of(tmp_path, env), SHARED, "a")
    restarted = control_of(tmp_path, env)
    restarted.settle(["a"], time.monotonic())  # the job was re-adopted: it still runs
    assert not calls(tmp_path)[-1].startswith("quit")
    restarted.settle([], time.monotonic())
    assert calls(tmp_path)[-1].startswith("quit")


# --------------------------------------------------------------------------- server limits


def share(fraction: str, memory_mb: int) -> dict[str, str]:
    return {
        "MGPU_GPU_SHARE": fraction,
        "MGPU_GPU_MEMORY_LIMIT_MB": str(memory_mb),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(float(fraction) * 100),
    }


def test_a_users_server_holds_the_largest_of_their_grants(tmp_path: Path) -> None:
    """Limits hold per client of a user's server, and a client can only lower them: the
    largest grant of the user's shared jobs (per GPU for memory), updated as they end."""
    control = control_of(tmp_path, fake_control(tmp_path))
    started(control, share("0.25", 10000), "small", UID, GPU)
    started(control, share("0.5", 20000), "big", UID, GPU)
    started(control, share("0.125", 5000), "other-gpu", UID, "3")
    got = calls(tmp_path)[1:]
    assert got == [
        *LIMITED[:3],
        f"set_active_thread_percentage {PID} 25",
        f"set_device_pinned_mem_limit {PID} {GPU} 10000M",
        "get_server_list",  # it runs: raised to the larger grant
        f"set_active_thread_percentage {PID} 50",
        f"set_device_pinned_mem_limit {PID} {GPU} 20000M",
        "get_server_list",  # another GPU: its own memory limit, the percentage kept
        f"set_device_pinned_mem_limit {PID} 3 5000M",
    ]
    n = len(calls(tmp_path))
    control.settle(["small", "other-gpu"], time.monotonic())  # the big one ended
    assert calls(tmp_path)[n:] == [
        "get_server_list",
        f"set_active_thread_percentage {PID} 25",
        f"set_device_pinned_mem_limit {PID} {GPU} 10000M",
    ]


def test_each_user_has_their_own_server_and_limits(tmp_path: Path) -> None:
    control = control_of(tmp_path, fake_control(tmp_path))
    started(control, share("0.5", 20000), "a", UID, GPU)
    started(control, share("0.25", 10000), "b", 2000, GPU)
    assert calls(tmp_path)[6:] == [
        "get_server_list",
        "start_server -uid 2000",
        "get_server_list",
        "set_active_thread_percentage 9000 25",
        f"set_device_pinned_mem_limit 9000 {GPU} 10000M",
    ]
    n = len(calls(tmp_path))
    control.settle(["a"], time.monotonic())
    assert calls(tmp_path)[n:] == ["get_server_list", "shutdown_server 9000"]


def test_a_server_that_cannot_start_yet_is_limited_when_it_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MPS runs one user's server at a time: a second user's starts when the first one's
    clients are gone, with the daemon's defaults.  Those hold it to the waiting user's grant
    until the agent sees the server (the next heartbeat) and sets its own limits."""
    env = fake_control(tmp_path)
    (tmp_path / "bin" / "refuse-2000").touch()
    control = control_of(tmp_path, env)
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        started(control, share("0.25", 10000), "b", 2000, GPU)
    assert "no MPS server for uid 2000 yet" in caplog.text
    assert calls(tmp_path)[1:] == [
        "get_server_list",
        "start_server -uid 2000",
        "get_server_list",
        "set_default_active_thread_percentage 25",
        f"set_default_device_pinned_mem_limit {GPU} 10000M",
    ]
    control.settle(["b"], time.monotonic())
    assert calls(tmp_path)[6:] == ["get_server_list"]  # not there yet, and not started again
    with open(tmp_path / "bin" / "servers", "a") as f:
        f.write("9000\n")  # its client started it
    control.settle(["b"], time.monotonic())
    assert calls(tmp_path)[7:] == [
        "get_server_list",
        "set_default_active_thread_percentage 100",  # no one waits: the memory one stays
        "set_active_thread_percentage 9000 25",
        f"set_device_pinned_mem_limit 9000 {GPU} 10000M",
    ]
    control.settle(["b"], time.monotonic())
    assert len(calls(tmp_path)) == 11  # nothing more to do


def test_a_server_listed_a_moment_after_its_start_is_limited_at_once(tmp_path: Path) -> None:
    control = control_of(tmp_path, fake_control(tmp_path))
    control.server_wait = 10.0
    (tmp_path / "bin" / "slow").touch()
    started(control, SHARED, "a")
    got = calls(tmp_path)[1:]
    assert got[:2] == ["get_server_list", f"start_server -uid {UID}"]
    assert set(got[2:-2]) == {"get_server_list"}  # until it is listed
    assert got[-2:] == LIMITED[-2:]


def test_two_waiting_users_get_the_smaller_defaults(tmp_path: Path) -> None:
    daemon(tmp_path)  # the site's: it stays when the shared jobs are gone
    env = fake_control(tmp_path)
    for uid in (2000, 3000):
        (tmp_path / "bin" / f"refuse-{uid}").touch()
    control = control_of(tmp_path, env)
    started(control, share("0.5", 20000), "b", 2000, GPU)
    started(control, share("0.25", 10000), "c", 3000, GPU)
    defaults = [c for c in calls(tmp_path) if c.startswith("set_default")]
    assert defaults == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {GPU} 20000M",
        "set_default_active_thread_percentage 25",
        f"set_default_device_pinned_mem_limit {GPU} 10000M",
    ]
    n = len(calls(tmp_path))
    control.settle([], time.monotonic())  # both ended before their servers started
    assert calls(tmp_path)[n:] == [
        "set_default_active_thread_percentage 100",  # none waits now
        "get_server_list",  # (no server of theirs to shut down)
        "get_server_list",
    ]


def test_a_job_being_prepared_keeps_the_daemon_until_it_launches(tmp_path: Path) -> None:
    """A heartbeat between `prepare` (in a thread) and the launch must not stop the daemon:
    the job is not running yet, but it is about to."""
    control = control_of(tmp_path, fake_control(tmp_path))
    control.prepare(SHARED, "a", UID, GPU)
    control.settle([], time.monotonic())
    assert control.job_env(SHARED, "a")["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps")
    control.settle([], time.monotonic())  # its prolog's environment: still not launched
    assert not any(c.startswith("quit") for c in calls(tmp_path))
    control.launched("a")
    control.settle([], time.monotonic())  # launched, and gone
    assert calls(tmp_path)[-1].startswith("quit")


def test_a_whole_gpu_job_is_kept_off_the_agents_daemon_in_the_default_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA finds a daemon in /tmp/nvidia-mps by itself: a whole-GPU job would run under its
    user's server's limits, or wait for another user's server to go."""
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path / "mps"))
    env = fake_control(tmp_path)
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    control = control_of(node_dir, env)
    whole = {"CUDA_VISIBLE_DEVICES": "1"}
    assert control.job_env(whole, "w") == {}  # no daemon yet
    started(control, SHARED, "a")
    assert control.job_env(whole, "w") == {"CUDA_MPS_PIPE_DIRECTORY": str(node_dir / "no-mps")}
    assert not (node_dir / "no-mps").exists()
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(tmp_path / "elsewhere")
    assert control_of(node_dir, env).job_env(whole, "w") == {}  # not in the default place


def test_a_memory_limit_not_taken_by_uuid_is_set_by_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = fake_control(tmp_path)
    script = tmp_path / "bin" / mps.CONTROL
    script.write_text(
        script.read_text().replace(
            '    *) echo "$command" >> "$log" ;;',
            '    *) echo "$command" >> "$log"; case "$3" in GPU-*) echo "invalid device";; esac ;;',
        )
    )
    control = control_of(tmp_path, env)
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        control.prepare(SHARED, "a", UID, GPU, "2")
    assert calls(tmp_path)[-2:] == [
        f"set_device_pinned_mem_limit {PID} {GPU} 20480M",
        f"set_device_pinned_mem_limit {PID} 2 20480M",
    ]
    assert "answered: invalid device" in caplog.text


def test_share_of_rounds_the_percentage_up() -> None:
    assert mps.share_of(share("0.125", 100), 5, "0") == mps.Share(5, "0", 13, 100)
    assert mps.share_of({"MGPU_GPU_SHARE": "1"}, 5, "0") == mps.Share(5, "0", 100, None)
    assert mps.share_of({"CUDA_VISIBLE_DEVICES": "0"}, 5, "0") is None
    assert mps.device_name("GPU-abc", 2) == "GPU-abc"
    assert mps.device_name(None, 2) == "2" and mps.device_name("fake-1", 1) == "1"
    assert mps.process_uid(os.getpid()) == os.getuid()


def test_without_mps_shares_are_not_enforced(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), **daemon_env(tmp_path)}
    control = mps.MpsControl(tmp_path, env)
    assert not control.enforced()
    assert control.describe().startswith("not enforced: no nvidia-cuda-mps-control")
    assert started(control, SHARED, "a") == {}


def test_a_failing_start_leaves_the_job_without_mps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = fake_control(tmp_path)
    (tmp_path / "bin" / mps.CONTROL).write_text("#!/bin/sh\necho no GPU >&2\nexit 1\n")
    mps._refused.clear()
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        assert started(control_of(tmp_path, env), SHARED, "a") == {}
    assert "shared jobs run without MPS" in caplog.text
    assert not (tmp_path / mps.STARTED_MARK).exists()


def test_health_says_whether_shares_are_enforced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu.agent.health import check_gpu_shares

    for key, value in fake_control(tmp_path).items():
        monkeypatch.setenv(key, value)
    check = check_gpu_shares(tmp_path, "node001")
    assert (check.name, check.ok) == ("GPU shares", True)
    assert check.detail.startswith("enforced: ") and mps.CONTROL in check.detail
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    check = check_gpu_shares(tmp_path, "node001")
    assert check.ok and check.detail.startswith("not enforced: no nvidia-cuda-mps-control")


def test_an_agent_of_its_own_account_logs_in_its_node_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/var/log/nvidia-mps is root's; a site's daemon keeps its own log directory."""
    monkeypatch.setattr(mps.os, "geteuid", lambda: 1000)
    env = fake_control(tmp_path)
    del env["CUDA_MPS_LOG_DIRECTORY"]
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    logs = str(node_dir / "mps" / "log")
    assert started(control_of(node_dir, env), SHARED, "a")["CUDA_MPS_LOG_DIRECTORY"] == logs
    assert calls(tmp_path)[0] == f"start {tmp_path / 'mps'} {logs}"
    restarted = control_of(node_dir, env)  # its daemon runs on: so do its logs
    assert started(restarted, SHARED, "b")["CUDA_MPS_LOG_DIRECTORY"] == logs

    site = tmp_path / "site"
    site.mkdir()
    (site / "mps").mkdir(mode=0o755)
    os.mkfifo(site / "mps" / "control")
    site_env = {"PATH": env["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(site / "mps")}
    (site / "var-log").mkdir(mode=0o755)
    monkeypatch.setattr(mps, "DEFAULT_LOG_DIR", str(site / "var-log"))
    got = mps.MpsControl(site, site_env).job_env(SHARED, "c")  # no daemon of its own
    assert got["CUDA_MPS_LOG_DIRECTORY"] == str(site / "var-log")
