"""A few CUDA driver calls through ctypes (libcuda.so.1), so that the GPU tier's jobs need
no PyTorch: run as `python cuda.py uuids | hold MB | over-limit | open-device`.

* `uuids`: one line `count=N uuids=GPU-...,GPU-...`: the GPUs this process can use
  (CUDA_VISIBLE_DEVICES and the device files it may open decide).
* `hold MB`: allocate MB MiB on device 0 and keep it, printing `holding MB pid=PID`, until
  killed.
* `over-limit`: try to allocate 1 GiB more than `MGPU_GPU_MEMORY_LIMIT_MB` (a share's
  limit); prints `over-limit refused` (CUDA_ERROR_OUT_OF_MEMORY: MPS held the job to its
  share) or `over-limit allocated`.
* `open-device`: open /dev/nvidia0 and print `open ok` or `open errno=N`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CUDA_ERROR_OUT_OF_MEMORY = 2
MIB = 1024 * 1024


def _cuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} failed: CUDA error {rc}")


def uuids() -> list[str]:
    """The UUIDs (NVML's `GPU-...` form) of the devices CUDA shows this process."""
    try:
        cu = _cuda()
    except OSError:
        return []
    if cu.cuInit(0) != 0:  # CUDA_ERROR_NO_DEVICE (100) and the like: no GPU to use
        return []
    count = ctypes.c_int()
    _check(cu.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    found = []
    for i in range(count.value):
        dev = ctypes.c_int()
        _check(cu.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
        raw = (ctypes.c_ubyte * 16)()
        _check(cu.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
        h = bytes(raw).hex()
        found.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return found


def allocate(mb: int) -> int:
    """Allocate `mb` MiB on device 0 in its primary context: 0, or the CUDA error."""
    cu = _cuda()
    _check(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_ulonglong()
    rc: int = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mb * MIB))
    return rc


def main(argv: list[str]) -> None:
    what = argv[1] if len(argv) > 1 else ""
    if what == "uuids":
        found = uuids()
        print(f"count={len(found)} uuids={','.join(found)}", flush=True)
    elif what == "hold":
        mb = int(argv[2])
        _check(allocate(mb), f"allocating {mb} MiB")
        print(f"holding {mb} pid={os.getpid()}", flush=True)
        while True:
            signal.pause()
    elif what == "over-limit":
        limit = int(os.environ["MGPU_GPU_MEMORY_LIMIT_MB"])
        rc = allocate(limit + 1024)
        verdict = "refused" if rc == CUDA_ERROR_OUT_OF_MEMORY else f"allocated (rc {rc})"
        print(f"over-limit {verdict}", flush=True)
    elif what == "open-device":
        try:
            os.close(os.open("/dev/nvidia0", os.O_RDWR))
            print("open ok", flush=True)
        except OSError as e:
            print(f"open errno={e.errno}", flush=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
