"""`python src/mgpu_simple_client.py ARGS`: the seeds' client, now `mgpu ARGS`.

The seeds' README runs this file by path, so it stays: a thin door to the entry point of
the `mgpu_simple_client` console script.  It is not part of the installed package.
"""

from mgpu.client.cli import main

if __name__ == "__main__":
    main()
