"""Each job in its own cgroup, so that its end kills everything it started.

A process can leave its process group (`setsid`), its parent (a double fork) and its
environment (`env -i`), but not its cgroup: only root may move it out.  So each run gets
a cgroup, which the agent moves the shim into before the job's own program starts (see
mgpu.agent.launcher: the shim waits at a gate meanwhile), and the end of the run (normal
exit, cancel, time limit) kills whatever is still in it:

* `cgroup-v2`: one write of `1` to `cgroup.kill` (Linux >= 5.14) kills every process in
  it, atomically with respect to forks;
* `cgroup-v1-freezer`: freeze the cgroup (no process can fork or run), SIGKILL every pid
  in `cgroup.procs`, thaw;
* `process-tree`: no usable cgroup (no permission, an old kernel, a read-only
  cgroupfs): the shim's process group, its descendants and processes carrying the run's
  `MGPU_RUN_TAG` (what the launcher always signals as well).

The v2 hierarchy and the v1 freezer are found from /proc/self/mountinfo (v2 may be at
/sys/fs/cgroup or, on a hybrid host, /sys/fs/cgroup/unified).  The cgroups live under
the agent's own cgroup, `<own>/mgpu/<node>-<hash of the spool path>/<job>.<epoch>`: the
agent needs no other part of the tree, and two agents on one machine (tests, several
node ids) never touch each other's runs.  A run's path is kept in its run record, so a
restarted agent finds it again; cgroups of runs it no longer knows are killed and
removed when it starts.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mgpu.agent")

V2 = "cgroup-v2"
V1_FREEZER = "cgroup-v1-freezer"
PROCESS_TREE = "process-tree"
METHODS = (V2, V1_FREEZER, PROCESS_TREE)

TOP = "mgpu"
"""The directory under the agent's own cgroup that holds every agent's runs."""
_REMADE = 5
"""How many times an agent's directory removed by a neighbour's start-up is made again."""
CHOICE_ENV = "MGPU_JOB_CONTAINMENT"
"""Set to a method name in the agent's environment to use that one (tests, workarounds)."""


@dataclass(frozen=True, slots=True)
class Containment:
    method: str
    base: str | None = None
    """The directory of this agent's run cgroups (None for process-tree)."""

    def describe(self) -> str:
        return self.method if self.base is None else f"{self.method} ({self.base})"


# ---- finding the hierarchies ------------------------------------------------------------


def candidates(mountinfo: str, self_cgroup: str) -> list[tuple[str, str]]:
    """(method, directory of this process's own cgroup) in the order to try them."""
    own_v2 = None
    own_freezer = None
    for line in self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            own_v2 = path
        elif "freezer" in controllers.split(","):
            own_freezer = path
    v2_dir = freezer_dir = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, mountpoint = fields[3], _unescape(fields[4])
        fstype, _, super_opts = line.split(" - ", 1)[1].split(" ", 2)
        if fstype == "cgroup2" and own_v2 is not None and v2_dir is None:
            v2_dir = _join(mountpoint, root, own_v2)
        elif (
            fstype == "cgroup"
            and "freezer" in super_opts.strip().split(",")
            and own_freezer is not None
            and freezer_dir is None
        ):
            freezer_dir = _join(mountpoint, root, own_freezer)
    found = []
    if v2_dir is not None:
        found.append((V2, v2_dir))
    if freezer_dir is not None:
        found.append((V1_FREEZER, freezer_dir))
    return found


def v1_hierarchy(mountinfo: str, self_cgroup: str, controller: str) -> str | None:
    """The directory of this process's own cgroup in the v1 hierarchy of `controller`
    (`devices`, ...), or None where that controller is not mounted as v1."""
    own = None
    for line in self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid != "0" and controller in controllers.split(","):
            own = path
    if own is None:
        return None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, super_opts = line.split(" - ", 1)[1].split(" ", 2)
        if fstype == "cgroup" and controller in super_opts.strip().split(","):
            return _join(_unescape(fields[4]), fields[3], own)
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _join(mountpoint: str, root: str, own: str) -> str:
    """Where this process's cgroup `own` (as /proc/self/cgroup names it) is in the mount."""
    if root != "/" and (own == root or own.startswith(root + "/")):
        own = own[len(root) :]
    return mountpoint.rstrip("/") + "/" + own.strip("/") if own.strip("/") else mountpoint


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _name(text: str, limit: int = 100) -> str:
    return _UNSAFE.sub("-", text)[:limit] or "-"


def run_name(job_id: str, epoch: int) -> str:
    """The directory name of a run's cgroup."""
    return f"{_name(job_id)}.{epoch}"


def agent_key(node_id: str, spool: Path) -> str:
    """This agent's directory name: its node id and a hash of its spool's path."""
    digest = hashlib.sha256(str(spool.resolve()).encode()).hexdigest()[:10]
    return f"{_name(node_id, 64)}-{digest}"


def choose(
    key: str,
    prefer: str | None = None,
    mountinfo_path: str = "/proc/self/mountinfo",
    cgroup_path: str = "/proc/self/cgroup",
) -> Containment:
    """The best method that works here for the agent named `key` (its base dir created).

    `prefer` (default: $MGPU_JOB_CONTAINMENT) names one method to use if it works."""
    prefer = prefer if prefer is not None else os.environ.get(CHOICE_ENV, "auto")
    if prefer == PROCESS_TREE:
        return Containment(PROCESS_TREE)
    try:
        with open(mountinfo_path) as f:
            mountinfo = f.read()
        with open(cgroup_path) as f:
            self_cgroup = f.read()
    except OSError:
        return Containment(PROCESS_TREE)
    for method, own in candidates(mountinfo, self_cgroup):
        if prefer not in ("auto", "", method):
            continue
        base = os.path.join(own, TOP, key)
        why = make_base(base, "cgroup.kill" if method == V2 else "freezer.state")
        if why is None:
            return Containment(method, base)
        log.debug("cannot use %s: %s", method, why)
    return Containment(PROCESS_TREE)


def make_base(base: str, needed: str, prepare: Callable[[], None] | None = None) -> str | None:
    """Make an agent's directory `base` in a hierarchy (`prepare`d, once made) and check
    that its runs' cgroups can go there (`needed` and `cgroup.procs` writable): None, or
    why not (then it is removed).  Another agent starting beside this one removes the
    empty directories of others (`sweep`), so this one may go between its making and its
    check: it is made again then, not taken for a hierarchy that cannot be used."""
    for _ in range(_REMADE):
        try:
            os.makedirs(base, exist_ok=True)
            if prepare is not None:
                prepare()
        except OSError as e:
            if not os.path.isdir(base) and e.errno == errno.ENOENT:
                continue  # removed as it was being prepared
            release(base)
            return f"cannot make {base}: {e.strerror}"
        if all(os.access(os.path.join(base, name), os.W_OK) for name in (needed, "cgroup.procs")):
            return None
        if os.path.isdir(base):
            release(base)
            return f"{base}/{needed} is not writable"
    return f"{base} was removed each time it was made"


# ---- one run ------------------------------------------------------------------------------


def make_run_dir(path: str) -> None:
    """Make a run's cgroup (v1 limits, device rules) and the agent's directory above it,
    which a neighbour agent's start-up may remove, empty, at that very moment (`sweep`):
    made again then.  One left by this very run (an agent crash) is reused."""
    for _ in range(_REMADE - 1):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    os.makedirs(path, exist_ok=True)


def create(containment: Containment, job_id: str, epoch: int) -> str | None:
    """A fresh cgroup for one run (None: none, use the process tree)."""
    if containment.base is None:
        return None
    path = os.path.join(containment.base, run_name(job_id, epoch))
    for _ in range(2):
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            kill(path)  # a leftover of this very run (an agent crash before it was removed)
            return path
        except FileNotFoundError:
            # Another agent's start-up sweep removed our (then empty) base: make it again,
            # with the controllers its runs had (their CPU and memory limits need them).
            with contextlib.suppress(OSError):
                os.makedirs(containment.base, exist_ok=True)
                if containment.method == V2:
                    _enable_as_parent(containment.base)
        except OSError as e:
            log.warning("cannot create cgroup %s: %s", path, e)
            return None
    return None


def _enable_as_parent(path: str) -> None:
    """Enable in a v2 cgroup made again the controllers its parent enables for it, as
    mgpu.agent.runlimits.enable_v2 had, from the parent down."""
    enable(path, _read(os.path.dirname(path), "cgroup.subtree_control").split())


def enable(path: str, controllers: Iterable[str]) -> None:
    """Enable v2 `controllers` for the children of `path`, each where the kernel lets it
    (one that it refuses is left off; the caller sees which are on)."""
    for ctrl in controllers:
        try:
            write(path, "cgroup.subtree_control", f"+{ctrl}")
        except OSError as e:
            log.debug("cannot enable %s in %s: %s", ctrl, path, e)


def enter(path: str, pid: int) -> bool:
    """Move process `pid` (the shim, still waiting at its gate) into the run's cgroup."""
    try:
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)
        return True
    except OSError as e:
        log.warning("cannot move pid %d into cgroup %s: %s", pid, path, e)
        return False


def pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def populated(path: str) -> bool:
    """Is any process left in the cgroup?"""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 1" in f.read()
    except FileNotFoundError:
        return bool(pids(path))  # v1 has no cgroup.events
    except OSError:
        return False


def signal_all(path: str, sig: int) -> None:
    """Send `sig` to every process in the cgroup (the polite SIGTERM of a cancel)."""
    for pid in pids(path):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def kill(path: str) -> None:
    """SIGKILL everything in the cgroup, forks included."""
    if not populated(path):
        return
    if os.path.exists(os.path.join(path, "cgroup.kill")):
        with contextlib.suppress(OSError):
            write(path, "cgroup.kill", "1")
        return
    if not os.path.exists(os.path.join(path, "freezer.state")):
        signal_all(path, signal.SIGKILL)
        return
    try:
        write(path, "freezer.state", "FROZEN")
        deadline = time.monotonic() + 1.0
        while _read(path, "freezer.state") == "FREEZING" and time.monotonic() < deadline:
            time.sleep(0.001)
        signal_all(path, signal.SIGKILL)  # frozen: none can fork meanwhile
    except OSError as e:
        log.warning("cannot freeze cgroup %s: %s", path, e)
        signal_all(path, signal.SIGKILL)
    finally:
        with contextlib.suppress(OSError):
            write(path, "freezer.state", "THAWED")  # a frozen process cannot die


def release(path: str) -> bool:
    """Remove an empty cgroup (True), or leave one that still has processes (False)."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def write(path: str, name: str, value: str) -> None:
    """One write to a cgroup file (they take one value or rule per write)."""
    fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as f:
        return f.read().strip()


# ---- start-up -----------------------------------------------------------------------------


def sweep(containment: Containment, keep: set[str]) -> list[str]:
    """Kill and remove this agent's cgroups of runs it no longer knows (not in `keep`), and
    remove other agents' empty directories; returns the run cgroups removed."""
    base = containment.base
    if base is None:
        return []
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if entry.is_dir() and entry.path not in keep:
                kill(entry.path)
                _wait_empty(entry.path, 2.0)
                if release(entry.path):
                    removed.append(entry.path)
    with contextlib.suppress(OSError):
        for entry in os.scandir(os.path.dirname(base)):
            if entry.is_dir() and entry.path != base:
                release(entry.path)  # fails (EBUSY) while that agent has runs
    return removed


def _wait_empty(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while populated(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


__all__ = [
    "CHOICE_ENV",
    "METHODS",
    "PROCESS_TREE",
    "V1_FREEZER",
    "V2",
    "Containment",
    "agent_key",
    "candidates",
    "choose",
    "create",
    "enable",
    "enter",
    "kill",
    "make_base",
    "make_run_dir",
    "pids",
    "populated",
    "release",
    "run_name",
    "signal_all",
    "sweep",
    "v1_hierarchy",
    "write",
]
