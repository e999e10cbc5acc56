"""What one task saw, written by the task itself: `python3 record.py LABEL [ARGS...]`.

Run inside the jobs of the differential tier, under Slurm and under mgpu alike; writes
`$SLURM_SUBMIT_DIR/seen/LABEL.PROCID.json` (the batch script's own record has PROCID `b`
when the caller passes `--batch`) with the environment the tier compares, argv, the
working directory and the node.  Standard library only: a job's python3 is the system's.
"""

import json
import os
import sys

WATCHED = (
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "SUBMIT_MARK",
    "MY_VAR",
    "HOME",
    "USER",
    "LOGNAME",
)
"""Besides every SLURM* variable: the devices, the rendezvous variables mgpu also knows,
the variables the scripts and the submitting shell export, the account's."""


def main() -> None:
    args = sys.argv[1:]
    label = args.pop(0)
    batch = bool(args) and args[0] == "--batch"
    if batch:
        args.pop(0)
    env = {k: v for k, v in os.environ.items() if k.startswith("SLURM") or k in WATCHED}
    procid = "b" if batch else os.environ.get("SLURM_PROCID", "x")
    where = os.path.join(os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd(), "seen")
    os.makedirs(where, exist_ok=True)
    seen = {"label": label, "argv": args, "cwd": os.getcwd(), "env": env}
    tmp = os.path.join(where, f".{label}.{procid}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(seen, f, sort_keys=True)
    os.replace(tmp, os.path.join(where, f"{label}.{procid}.json"))


if __name__ == "__main__":
    main()
