"""`python src/mgpu_simple_node.py ARGS`: the seeds' node agent, now `mgpu node ARGS`.

The seeds' README runs this file by path, so it stays: a thin door to the entry point of
the `mgpu_simple_node` console script.  It is not part of the installed package.
"""

from mgpu.client.cli import main_node

if __name__ == "__main__":
    main_node()
