"""A `#!/bin/bash -l` batch script keeps Slurm's commands (issue 31 item 2), tested on
every root machine: where the machine has a Slurm of its own (the differential tier's,
scripts/install-system-deps.sh), the agents run in a private mount namespace in which
that Slurm's commands are hidden (an overlay on each directory that holds them, with a
whiteout per command) and /usr/local/bin is an overlay whose writes go to this test's
temp dir: the agents see a machine without Slurm, write their login wrappers there, and
the machine itself is left untouched."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster
from mgpu.agent import loginbin, slurmbin

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the login wrappers are a root agent's")


def _slurm_dirs() -> dict[str, list[str]]:
    """Each real directory that holds a Slurm command of the machine's own: its commands."""
    found: dict[str, list[str]] = {}
    for d in loginbin.SEARCHED:
        real = os.path.realpath(d)
        for name in slurmbin.SLURM_COMMANDS:
            path = Path(real) / name
            names = found.setdefault(real, [])
            if path.is_file() and not loginbin.is_ours(path) and name not in names:
                names.append(name)
    return {d: names for d, names in found.items() if names}


def _hiding_prefix(root: Path) -> list[str]:
    """`unshare -m` and a shell that mounts the overlays, then execs the agent."""
    lines = ["set -e"]
    dirs = _slurm_dirs()
    dirs.setdefault(str(loginbin.LOGIN_BIN), [])  # its writes go to the temp dir
    for i, (d, names) in enumerate(sorted(dirs.items())):
        upper, work = root / f"upper{i}", root / f"work{i}"
        upper.mkdir(parents=True)
        work.mkdir()
        for name in names:  # a whiteout: the name is gone from the merged directory
            os.mknod(upper / name, 0o600 | 0o020000, os.makedev(0, 0))
        opts = f"lowerdir={d},upperdir={upper},workdir={work}"
        lines.append(f"mount -t overlay overlay -o {shlex.quote(opts)} {shlex.quote(d)}")
    lines.append('exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(lines), "sh"]


def _can_hide(root: Path) -> str | None:
    """Why the machine's Slurm cannot be hidden here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(
        [*_hiding_prefix(root / "probe"), "sh", "-c", "command -v srun sbatch scontrol || true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"no private overlay mounts here: {probe.stderr.strip()[:200]}"
    if probe.stdout.strip():
        return f"the overlays left Slurm's commands: {probe.stdout.split()}"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two agents that see no Slurm of the machine's own, writing the login wrappers."""
    root = tmp_path_factory.mktemp("login")
    before = {n for n in slurmbin.SLURM_COMMANDS if (loginbin.LOGIN_BIN / n).exists()}
    hide = loginbin.real_slurm() is not None
    if hide:
        reason = _can_hide(root)
        if reason is not None:
            pytest.skip(f"this machine has a real Slurm and cannot hide it: {reason}")
    with contextlib.ExitStack() as stack:
        os.environ[loginbin.LOGIN_BIN_VAR] = str(loginbin.LOGIN_BIN)
        try:  # the cluster's processes take the environment as they start
            c = LocalCluster(root)
            stack.callback(c.stop)
            c.start_master()
            for name in ("gpu1", "gpu2"):  # each its own overlay dirs: a shared
                # upper/work dir is undefined in overlayfs, and a mount may fail on it
                prefix = _hiding_prefix(root / f"hidden-{name}") if hide else []
                c.start_agent(name, gpus=2, wait=False, prefix=prefix)
        finally:
            os.environ[loginbin.LOGIN_BIN_VAR] = ""
        for name in ("gpu1", "gpu2"):
            c.wait_node(name, "online")
        yield c
    if hide:  # the machine's own /usr/local/bin got nothing of the agents'
        after = {n for n in slurmbin.SLURM_COMMANDS if (loginbin.LOGIN_BIN / n).exists()}
        assert after == before
    for name in set(slurmbin.SLURM_COMMANDS) - before:
        if loginbin.is_ours(loginbin.LOGIN_BIN / name):
            (loginbin.LOGIN_BIN / name).unlink()


def test_a_login_shell_script_keeps_the_commands(cluster: LocalCluster, tmp_path: Path) -> None:
    """`#!/bin/bash -l` re-reads /etc/profile (PATH reset), and `env -i bash -lc` strips
    every variable: Slurm's commands are still found, as /usr/bin's are on a cluster."""
    script = tmp_path / "login.sh"
    script.write_text(
        "#!/bin/bash -l\n"
        'echo "path=$PATH"\n'
        "echo \"hosts=$(scontrol show hostnames 'gpu[1-2]' | tr '\\n' ' ')\"\n"
        'echo "step=$(srun -n1 echo ran)"\n'
        "bare=$(env -i bash -lc 'command -v srun scontrol sbatch' 2>/dev/null)\n"
        'echo "bare=$(echo $bare)"\n'
    )
    res = subprocess.run(
        [str(BIN / "mgpu"), "sbatch", "--parsable", f"--chdir={tmp_path}", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
    )
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    assert cluster.client().wait(job_id, timeout=90)["state"] == "completed"
    said = dict(
        line.split("=", 1)
        for line in cluster.client().logs(job_id).splitlines()  # a profile may say more
        if line.partition("=")[0] in ("path", "hosts", "step", "bare")
    )
    assert "slurm-bin" not in said["path"]  # the login shell did reset PATH
    assert (said["hosts"], said["step"]) == ("gpu1 gpu2 ", "ran"), said
    found = said["bare"].split()
    assert [p.rpartition("/")[2] for p in found] == ["srun", "scontrol", "sbatch"], said
    # mgpu's wrappers (the agents', in the namespace), not a machine's own Slurm
    assert all(p.startswith(f"{loginbin.LOGIN_BIN}/") for p in found), said
