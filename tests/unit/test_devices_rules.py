"""GPU isolation rules (mgpu.agent.devices): which device numbers a run is denied, as v1
`devices.deny` lines and as the eBPF device program, and how the method is chosen."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from mgpu.agent import cgroups, devices
from mgpu.agent.launcher import Launcher, LaunchError, LaunchRequest

NVIDIA = {0: (195, 0), 1: (195, 1), 2: (195, 2), 3: (195, 3)}


# ---- the rules of an allocation -----------------------------------------------------------


def test_denied_is_every_gpu_not_given() -> None:
    assert devices.denied(NVIDIA, [2]) == [(195, 0), (195, 1), (195, 3)]
    assert devices.denied(NVIDIA, [0, 3]) == [(195, 1), (195, 2)]
    assert devices.denied(NVIDIA, []) == sorted(NVIDIA.values())  # a CPU-only job: none
    assert devices.denied(NVIDIA, [0, 1, 2, 3]) == []
    # A GPU with no device file is nothing to deny; one given that has none changes nothing.
    assert devices.denied({0: (195, 0), 5: (195, 5)}, [1]) == [(195, 0), (195, 5)]
    # Two indices on one device number (a stale file): the given one wins.
    assert devices.denied({0: (195, 0), 1: (195, 0), 2: (195, 2)}, [0]) == [(195, 2)]


def test_v1_rules_are_deny_lines() -> None:
    assert devices.v1_rules(devices.denied(NVIDIA, [1])) == [
        "c 195:0 rwm",
        "c 195:2 rwm",
        "c 195:3 rwm",
    ]
    assert devices.v1_rules([]) == []


# ---- the eBPF program, run by a small interpreter of the instructions it uses ---------------

CHAR, BLOCK = 2, 1
READ, WRITE, MKNOD = 2, 4, 1  # BPF_DEVCG_ACC_*


def run_bpf(program: bytes, dev_type: int, access: int, major: int, minor: int) -> int:
    """Execute a device program as the kernel would for (type, access, major, minor)."""
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    regs = [0] * 11
    pc = 0
    insns = [struct.unpack("<BBhi", program[i : i + 8]) for i in range(0, len(program), 8)]
    for _ in range(10_000):
        code, regs_byte, off, imm = insns[pc]
        dst, src = regs_byte & 0xF, regs_byte >> 4
        pc += 1
        if code == 0x61:  # ldxw dst, [src + off]: only from the context (r1)
            assert src == 1
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif code == 0x54:  # and32 dst, imm
            regs[dst] = (regs[dst] & imm) & 0xFFFFFFFF
        elif code == 0x55:  # jne dst, imm, +off
            if regs[dst] != imm:
                pc += off
        elif code == 0xB7:  # mov64 dst, imm
            regs[dst] = imm
        elif code == 0x95:  # exit
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
    raise AssertionError("the program does not end")


def test_bpf_program_denies_exactly_the_gpus_not_given() -> None:
    program = devices.bpf_program(devices.denied(NVIDIA, [1]))
    assert len(program) == 8 * (5 + 4 * 3 + 2)
    for access in (READ, WRITE, READ | WRITE | MKNOD):
        assert [run_bpf(program, CHAR, access, 195, m) for m in range(4)] == [0, 1, 0, 0]
    assert run_bpf(program, CHAR, READ, 195, 255) == 1  # nvidiactl
    assert run_bpf(program, CHAR, READ, 1, 3) == 1  # /dev/null
    assert run_bpf(program, CHAR, READ, 0, 2) == 1  # same minor, other major
    assert run_bpf(program, BLOCK, READ, 195, 0) == 1  # a block device with those numbers
    nothing = devices.bpf_program([])
    assert [run_bpf(nothing, CHAR, READ, 195, m) for m in range(4)] == [1, 1, 1, 1]
    everything = devices.bpf_program(sorted(NVIDIA.values()))
    assert [run_bpf(everything, CHAR, READ, 195, m) for m in range(4)] == [0, 0, 0, 0]


# ---- device files ------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_gpu_devices_are_the_nvidia_char_files(tmp_path: Path) -> None:
    for i, minor in ((0, 7), (1, 9), (12, 12)):
        os.mknod(tmp_path / f"nvidia{i}", 0o666 | 0o020000, os.makedev(240, minor))
    os.mknod(tmp_path / "nvidiactl", 0o666 | 0o020000, os.makedev(240, 255))
    (tmp_path / "nvidia3").write_text("a regular file is no GPU")
    (tmp_path / "nvidia-uvm").write_text("")
    assert devices.gpu_devices(tmp_path) == {0: (240, 7), 1: (240, 9), 12: (240, 12)}
    assert devices.gpu_devices(tmp_path / "missing") == {}


# ---- choosing the method -----------------------------------------------------------------------

HYBRID = """\
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_v1_devices_hierarchy_from_mountinfo() -> None:
    own = "6:freezer:/\n5:devices:/system.slice/mgpu-node.service\n0::/x\n"
    assert cgroups.v1_hierarchy(HYBRID, own, "devices") == (
        "/sys/fs/cgroup/devices/system.slice/mgpu-node.service"
    )
    assert cgroups.v1_hierarchy(HYBRID, "0::/\n", "devices") is None  # pure v2
    pure_v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroups.v1_hierarchy(pure_v2, own, "devices") is None  # not mounted
    co = "40 31 0:33 / /cg/cpu,devices rw - cgroup cgroup rw,cpu,devices\n"
    assert cgroups.v1_hierarchy(co, "4:cpu,devices:/a\n", "devices") == "/cg/cpu,devices/a"


def _fake_devices_cgroup(tmp_path: Path, files: list[str]) -> tuple[str, str]:
    root = tmp_path / "devices"
    base = root / "agent" / cgroups.TOP / "n1-abc"
    base.mkdir(parents=True)
    for name in files:
        (base / name).write_text("")
    (tmp_path / "mountinfo").write_text(f"36 31 0:33 / {root} rw - cgroup cgroup rw,devices\n")
    (tmp_path / "cgroup").write_text("5:devices:/agent\n0::/agent\n")
    return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_choose_v1_then_none(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    no_cgroup = cgroups.Containment(cgroups.PROCESS_TREE)
    mountinfo, self_cgroup = _fake_devices_cgroup(tmp_path, ["devices.deny", "cgroup.procs"])

    def choose(prefer: str = "auto") -> devices.Isolation:
        return devices.choose("n1-abc", dev, no_cgroup, prefer, mountinfo, self_cgroup)

    # No GPU device files: nothing to isolate, whatever the machine has.
    assert choose() == devices.Isolation(devices.NONE, why=f"no GPU device files {dev}/nvidia*")
    for i in range(2):
        os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    iso = choose()
    assert iso.method == devices.V1
    assert iso.base == str(tmp_path / "devices" / "agent" / cgroups.TOP / "n1-abc")
    assert iso.devices == {0: (195, 0), 1: (195, 1)}
    assert iso.describe() == "devices-cgroup-v1 (2 GPU device file(s))"
    assert choose("none").method == devices.NONE
    # BPF asked for, but the jobs have no cgroup v2 to attach it to.
    asked = choose(devices.BPF)
    assert asked.method == devices.NONE
    assert "no cgroup v2 for the jobs" in asked.describe()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_choose_none_without_a_writable_devices_cgroup(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia0", 0o666 | 0o020000, os.makedev(195, 0))
    mountinfo, self_cgroup = _fake_devices_cgroup(tmp_path, ["cgroup.procs"])  # no devices.deny
    no_cgroup = cgroups.Containment(cgroups.PROCESS_TREE)
    iso = devices.choose("n1-abc", dev, no_cgroup, "auto", mountinfo, self_cgroup)
    assert iso.method == devices.NONE and iso.base is None
    assert "devices.deny is not writable" in iso.why


# ---- a run whose rules cannot be set up never starts -------------------------------------------


@pytest.mark.parametrize("method", [devices.V1, devices.BPF])
def test_rules_that_cannot_be_set_up_fail_the_launch(tmp_path: Path, method: str) -> None:
    spool = tmp_path / "spool"
    launcher = Launcher(spool, lambda *args: None)  # containment: the process tree, no cgroup
    not_a_cgroup = tmp_path / "devices"  # a plain directory: it has no devices.deny to write
    launcher.isolation = devices.Isolation(method, NVIDIA, str(not_a_cgroup))
    started = tmp_path / "started"
    with pytest.raises(LaunchError, match="cannot keep the job to its GPUs"):
        launcher.launch(LaunchRequest("j1", 1, ["touch", str(started)], {}, gpu_ids=[0]))
    assert not started.exists()
    assert list(spool.iterdir()) == []  # no spool files, no run record
    assert not not_a_cgroup.exists() or list(not_a_cgroup.iterdir()) == []
