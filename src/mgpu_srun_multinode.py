"""`python src/mgpu_srun_multinode.py ARGS`: the seeds' newer client, now `mgpu srun ARGS`.

The seeds' README runs this file by path, so it stays: a thin door to the entry point of
the `mgpu_srun_multinode` console script.  It is not part of the installed package.
"""

from mgpu.client.cli import main_srun

if __name__ == "__main__":
    main_srun()
