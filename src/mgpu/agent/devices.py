"""GPU isolation: a job's processes may open only the GPU device files it was given.

`CUDA_VISIBLE_DEVICES` is advice: a job that resets it (or runs `nvidia-smi`) would see
every GPU of the node.  So where the machine allows it, the agent also denies each run
the NVIDIA device files of the GPUs it was not given.  GPU `i` is the character device
`DIR/nvidia{i}` (`mgpu node --gpu-device-dir DIR`, default /dev; its numbers read with
stat, so any major works).  `nvidiactl`, `nvidia-uvm` and the rest stay open: every GPU
job needs them.  The kernel checks the rules when a file is opened, so a denied GPU
gives EPERM whatever the job's user, uid 0 included (a root job could undo them, though).

* `devices-cgroup-v1`: the v1 `devices` controller (hybrid and v1 hosts).  Each run gets
  a cgroup there, `<own>/mgpu/<agent key>/<job>.<epoch>` as for containment, with one
  `devices.deny` line `c MAJOR:MINOR rwm` per GPU not given; the shim joins it at its
  gate (mgpu.agent.launcher) with the run's other cgroup, before the job runs.
* `bpf-cgroup-v2`: no v1 devices controller (pure v2 hosts): a BPF_PROG_TYPE_CGROUP_DEVICE
  program that refuses those devices is attached to the run's own v2 cgroup (the
  containment's, see mgpu.agent.cgroups) before the shim enters it.  The program is
  built here instruction by instruction and loaded with the bpf() syscall through ctypes;
  it goes when the cgroup is removed.
* `none`: neither works (no permission, no such controller, no cgroup v2 containment, no
  bpf()), or there are no GPU device files: jobs are trusted to keep to their GPUs.

A launch the chosen method cannot set up fails as a node failure (LaunchError): a job
never runs with GPUs it was not given because a rule could not be written.
`$MGPU_GPU_ISOLATION` names one method to use if it works (tests, workarounds).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import re
import stat
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mgpu.agent import cgroups

log = logging.getLogger("mgpu.agent")

V1 = "devices-cgroup-v1"
BPF = "bpf-cgroup-v2"
NONE = "none"
METHODS = (V1, BPF, NONE)
CHOICE_ENV = "MGPU_GPU_ISOLATION"
"""Set to a method name in the agent's environment to use that one (tests, workarounds)."""
DEFAULT_DIR = Path("/dev")

Device = tuple[int, int]
"""(major, minor) of a character device."""


class IsolationError(RuntimeError):
    """Device rules could not be set up (one sentence)."""


@dataclass(frozen=True, slots=True)
class Isolation:
    method: str
    devices: Mapping[int, Device] = field(default_factory=dict)
    """GPU index -> its device file's numbers (GPUs that have one)."""
    base: str | None = None
    """v1: the directory of this agent's run cgroups in the devices hierarchy."""
    why: str = ""
    """For `none`: why there is no isolation here."""

    def describe(self) -> str:
        if self.method == NONE:
            return f"{NONE} ({self.why})" if self.why else NONE
        return f"{self.method} ({len(self.devices)} GPU device file(s))"


# ---- the rules ----------------------------------------------------------------------------


def gpu_devices(dev_dir: Path) -> dict[int, Device]:
    """The numbers of the GPU device files `dev_dir/nvidiaN` (character devices only)."""
    found: dict[int, Device] = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return found
    for name in names:
        m = re.fullmatch(r"nvidia(\d+)", name)
        if m is None:
            continue
        try:
            st = os.stat(dev_dir / name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            found[int(m.group(1))] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def denied(devices: Mapping[int, Device], given: Collection[int]) -> list[Device]:
    """The device numbers a run with GPUs `given` must not open (sorted, each once; a
    number shared with a given GPU stays allowed)."""
    allowed = {devices[i] for i in given if i in devices}
    return sorted({dev for i, dev in devices.items() if i not in given} - allowed)


def v1_rules(devices: Collection[Device]) -> list[str]:
    """The `devices.deny` lines for these character devices."""
    return [f"c {major}:{minor} rwm" for major, minor in devices]


# A BPF_PROG_TYPE_CGROUP_DEVICE program sees struct bpf_cgroup_dev_ctx in r1:
# {u32 access_type (access << 16 | type); u32 major; u32 minor}; it returns 1 to allow.
_DEV_CHAR = 2  # BPF_DEVCG_DEV_CHAR
_LDX_W, _AND32_K, _JNE_K, _MOV64_K, _EXIT = 0x61, 0x54, 0x55, 0xB7, 0x95


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def bpf_program(devices: Collection[Device]) -> bytes:
    """eBPF instructions that refuse these character devices and allow everything else."""
    rules = sorted(devices)
    code = [
        _insn(_LDX_W, dst=2, src=1, off=0),  # r2 = access_type
        _insn(_AND32_K, dst=2, imm=0xFFFF),  # r2 = device type
        _insn(_LDX_W, dst=3, src=1, off=4),  # r3 = major
        _insn(_LDX_W, dst=4, src=1, off=8),  # r4 = minor
        _insn(_JNE_K, dst=2, off=4 * len(rules), imm=_DEV_CHAR),  # not a char device: allow
    ]
    for major, minor in rules:
        code += [
            _insn(_JNE_K, dst=3, off=3, imm=major),
            _insn(_JNE_K, dst=4, off=2, imm=minor),
            _insn(_MOV64_K, dst=0, imm=0),  # this one: deny
            _insn(_EXIT),
        ]
    code += [_insn(_MOV64_K, dst=0, imm=1), _insn(_EXIT)]
    return b"".join(code)


# ---- bpf() ----------------------------------------------------------------------------------

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280}.get(platform.machine())
_PROG_LOAD, _PROG_ATTACH = 5, 8
_PROG_TYPE_CGROUP_DEVICE, _ATTACH_CGROUP_DEVICE = 15, 6
_F_ALLOW_MULTI = 2  # beside the programs of other tools (systemd, runc) on our ancestors
_ATTR_SIZE = 128


def _bpf(cmd: int, attr: bytes) -> int:
    if _SYS_BPF is None:
        raise IsolationError(f"no bpf() syscall number known for {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = int(libc.syscall(ctypes.c_long(_SYS_BPF), ctypes.c_int(cmd), buf, _ATTR_SIZE))
    if ret < 0:
        raise IsolationError(f"bpf(): {os.strerror(ctypes.get_errno())}")
    return ret


def _load(program: bytes) -> int:
    """Load a device program; its file descriptor."""
    insns = ctypes.create_string_buffer(program, len(program))
    license = ctypes.create_string_buffer(b"MIT")
    attr = struct.pack(
        "<IIQQIIQII16s",
        _PROG_TYPE_CGROUP_DEVICE,
        len(program) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license),
        0,  # no verifier log
        0,
        0,
        0,
        0,
        b"mgpu_gpus",
    )
    return _bpf(_PROG_LOAD, attr)


def bpf_attach(cgroup_dir: str, devices: Collection[Device]) -> None:
    """Attach a program refusing `devices` to the v2 cgroup `cgroup_dir`.  The cgroup keeps
    it until it is removed."""
    prog = _load(bpf_program(devices))
    try:
        target = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            attr = struct.pack("<IIII", target, prog, _ATTACH_CGROUP_DEVICE, _F_ALLOW_MULTI)
            _bpf(_PROG_ATTACH, attr)
        finally:
            os.close(target)
    finally:
        os.close(prog)


# ---- choosing the method --------------------------------------------------------------------


def choose(
    key: str,
    dev_dir: Path,
    containment: cgroups.Containment,
    prefer: str | None = None,
    mountinfo_path: str = "/proc/self/mountinfo",
    cgroup_path: str = "/proc/self/cgroup",
) -> Isolation:
    """The best method that works here for the agent named `key` (its v1 base created).

    `prefer` (default: $MGPU_GPU_ISOLATION) names one method to use if it works."""
    prefer = prefer if prefer is not None else os.environ.get(CHOICE_ENV, "auto")
    devices = gpu_devices(dev_dir)
    if prefer == NONE:
        return Isolation(NONE, devices, why=f"${CHOICE_ENV}={NONE}")
    if not devices:
        return Isolation(NONE, why=f"no GPU device files {dev_dir}/nvidia*")
    whys: list[str] = []
    if prefer in ("auto", "", V1):
        base, why = _v1_base(key, mountinfo_path, cgroup_path)
        if base is not None:
            return Isolation(V1, devices, base)
        whys.append(why)
    if prefer in ("auto", "", BPF):
        refused = _bpf_works(containment)
        if refused is None:
            return Isolation(BPF, devices)
        whys.append(refused)
    return Isolation(NONE, devices, why="; ".join(whys) or f"${CHOICE_ENV}={prefer}")


def _v1_base(key: str, mountinfo_path: str, cgroup_path: str) -> tuple[str | None, str]:
    try:
        with open(mountinfo_path) as f:
            mountinfo = f.read()
        with open(cgroup_path) as f:
            own = cgroups.v1_hierarchy(mountinfo, f.read(), "devices")
    except OSError as e:
        return None, f"cannot read the cgroups: {e.strerror}"
    if own is None:
        return None, "no v1 devices cgroup"
    base = os.path.join(own, cgroups.TOP, key)
    why = cgroups.make_base(base, "devices.deny")
    return (base, "") if why is None else (None, why)


def _bpf_works(containment: cgroups.Containment) -> str | None:
    """None if a device program can be attached to a run cgroup here, else why not."""
    if containment.method != cgroups.V2 or containment.base is None:
        return "no cgroup v2 for the jobs (BPF device programs need one)"
    probe = os.path.join(containment.base, f".probe-{os.getpid()}")
    try:
        os.makedirs(probe, exist_ok=True)
        bpf_attach(probe, [(0, 0)])
    except OSError as e:
        return f"cannot make {probe}: {e.strerror}"
    except IsolationError as e:
        return f"cannot attach a BPF device program: {e}"
    finally:
        cgroups.release(probe)
    return None


# ---- one run ----------------------------------------------------------------------------------


def apply(
    iso: Isolation, job_id: str, epoch: int, gpu_ids: Collection[int], run_cgroup: str | None
) -> str | None:
    """Set up a run's device rules before its shim starts; for v1, the cgroup the shim must
    join (None: nothing to join).  `run_cgroup`: the run's containment cgroup (v2 for BPF).
    Raises IsolationError: the run must not start."""
    if iso.method == NONE:
        return None
    deny = denied(iso.devices, gpu_ids)
    if not deny:
        return None
    if iso.method == BPF:
        if run_cgroup is None:
            raise IsolationError("the run has no cgroup v2 to attach its device rules to")
        try:
            bpf_attach(run_cgroup, deny)
        except OSError as e:
            raise IsolationError(f"cannot open the cgroup {run_cgroup}: {e.strerror}") from None
        return None
    assert iso.base is not None
    path = os.path.join(iso.base, cgroups.run_name(job_id, epoch))
    try:
        cgroups.make_run_dir(path)
        for rule in v1_rules(deny):
            cgroups.write(path, "devices.deny", rule)
    except OSError as e:
        cgroups.release(path)
        raise IsolationError(f"cannot set up the devices cgroup {path}: {e.strerror}") from None
    return path


def sweep(iso: Isolation, keep: set[str]) -> list[str]:
    """Remove this agent's v1 device cgroups of runs it no longer knows (not in `keep`)."""
    if iso.method != V1:
        return []
    return cgroups.sweep(cgroups.Containment(V1, iso.base), keep)


__all__ = [
    "BPF",
    "CHOICE_ENV",
    "DEFAULT_DIR",
    "METHODS",
    "NONE",
    "V1",
    "Isolation",
    "IsolationError",
    "apply",
    "bpf_attach",
    "bpf_program",
    "choose",
    "denied",
    "gpu_devices",
    "sweep",
    "v1_rules",
]
