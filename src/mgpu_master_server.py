"""`python src/mgpu_master_server.py ARGS`: the seeds' newer master, now `mgpu master ARGS`.

The seeds' README runs this file by path, so it stays: a thin door to the entry point of
the `mgpu_master_server` console script.  It is not part of the installed package.
"""

from mgpu.client.cli import main_master

if __name__ == "__main__":
    main_master()
