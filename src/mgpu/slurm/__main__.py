"""`python -m mgpu.slurm COMMAND ARGS...`."""

from mgpu.slurm.main import main

main()
