"""Entry point of the standalone executables that `make dist` builds (PyInstaller).

One binary serves every name, chosen by the name it is started under (as busybox):
`mgpu_master` = `mgpu master`, `mgpu_node` = `mgpu node`, `mgpu_client` and `mgpu` =
`mgpu`, and the seeds' names (`mgpu_simple_master`, `mgpu_simple_node`,
`mgpu_simple_client`, `mgpu_master_server`, `mgpu_srun_multinode`) as pyproject's scripts.
`EXE -m mgpu ARGS` (how mgpu re-executes itself: `sys.executable -m mgpu`) is
`mgpu ARGS` whatever the name.  A link named as one of Slurm's commands (`srun`, `sbatch`,
`squeue`, ...) is that command (mgpu.slurm): a directory of such links beside `mgpu` is
what a Kubernetes partition's `kubernetes.steps.bin` needs in a Pod.
"""

import os
import sys


def _run() -> None:
    from mgpu.client import cli

    argv = sys.argv[1:]
    if argv[:2] == ["-m", "mgpu"]:
        sys.argv = [sys.argv[0], *argv[2:]]
        cli.main()
        return
    name = os.path.basename(sys.argv[0]).lower()
    from mgpu.slurm import COMMANDS

    if name in COMMANDS:
        from mgpu.slurm.main import main as slurm_main

        slurm_main(name)
    for prefix, entry in (
        ("mgpu_simple_master", cli.main_master),  # the seeds' names (pyproject's scripts)
        ("mgpu_simple_node", cli.main_node),
        ("mgpu_simple_client", cli.main),
        ("mgpu_master", cli.main_master),  # also mgpu_master_server
        ("mgpu_node", cli.main_node),
        ("mgpu_srun", cli.main_srun),
        ("mgpu_queue", cli.main_queue),
        ("mgpu_cancel", cli.main_cancel),
    ):
        if name.startswith(prefix):
            entry()
            return
    cli.main()


if __name__ == "__main__":
    _run()
