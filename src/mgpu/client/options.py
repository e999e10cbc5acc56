"""The options many commands share, and what they become: the master's address (a
`Client`), the job options (keyword arguments of `Client.submit`), and `UsageError`.

Kept below `cli.py` and the `cmd_*` modules, which all use them; cheap to import (`mgpu
queue` loads it): argparse is only named here, never imported.
"""

from __future__ import annotations

from mgpu.client.api import Client

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any


class UsageError(Exception):
    """A command line that cannot be run: said in one line, exit status 2."""


# ---- job options ------------------------------------------------------------


def add_job_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job options")
    g.add_argument("--gpus", type=int, help="GPUs in total (default 1; 0 for a CPU job)")
    g.add_argument("--gpu-ids", help="these GPU indices on the chosen node, e.g. 0,1")
    g.add_argument("--node-gpu-ids", help='exactly these GPUs, e.g. "node001:0,1;node002:0"')
    g.add_argument("--nodes", "-N", type=int, help="gang: this many nodes")
    g.add_argument("--gpus-per-node", type=int, help="gang: GPUs on each node")
    g.add_argument("--nodelist", "-w", help="only these nodes (a,b or node[001-004])")
    g.add_argument("--exclude", "-x", help="never these nodes")
    g.add_argument("--gpu-type", help="only nodes with this GPU type (e.g. A100)")
    g.add_argument("--policy", choices=["fill_first", "spread"], help="placement policy")
    g.add_argument("--distributed", action="store_true", help="torchrun environment per node")
    g.add_argument("--mpi", action="store_true", help="mpirun on the first node, hostfile set")
    g.add_argument("--time", "-t", help="time limit: MIN, MM:SS, HH:MM:SS or D-HH:MM:SS")
    g.add_argument("--name", "-J", help="job name")
    g.add_argument("--priority", type=int, help="user priority (higher first; default 0)")
    g.add_argument("--retries", type=int, help="requeues allowed after node failures")
    g.add_argument("--dependency", "-d", help="afterok:ID[:ID], afterany:ID, afternotok:ID")
    g.add_argument("--array", "-a", help="job array, e.g. 0-99%%8")
    g.add_argument("--preemptible", action="store_true", help="may be requeued for others")
    g.add_argument("--image", help="run inside this container image (the node's runtime)")
    # pyxis's container options as Slurm's srun gives them (mgpu.slurm.pyxis), as JSON.
    g.add_argument("--container-options", dest="container", type=_json, help="==SUPPRESS==")
    g.add_argument("--signal", help="[B:]SIG@SECONDS before the time limit or a preemption")
    g.add_argument("--hold", "-H", action="store_true", help="queue it held (mgpu release)")
    g.add_argument("--notify", help="when it ends: POST to this URL, or mailto:ADDRESS")
    g.add_argument("--mail-user", dest="notify", help="when it ends: mail this address")
    g.add_argument("--gpu-share", type=float, metavar="F", help="a fraction of one GPU (0<F<1)")
    g.add_argument("--reservation", help="run inside this reservation (mgpu reserve)")
    g.add_argument("--cpus", type=int, metavar="N", help="CPUs held on each of its nodes")
    g.add_argument(
        "--mem", metavar="SIZE", help="memory held on each of its nodes (8G, 512M; 0: all)"
    )
    g.add_argument(
        "--exclusive",
        action="store_true",
        help="whole nodes: every GPU, CPU and all memory of each; nothing else runs beside it",
    )
    g.add_argument("--json", action="store_true", help="machine-readable output")
    t = p.add_argument_group("client waiting limits (from the original tool)")
    t.add_argument("--session-timeout", type=float, help="stop following after S seconds")
    t.add_argument("--connection-timeout", type=float, help="seconds to reach the master")
    t.add_argument("--max-wait-time", type=float, help="seconds without word from the master")
    t.add_argument("--max-consecutive-timeouts", type=int, help="silent periods before giving up")
    t.add_argument(
        "--verbose", "-v", action="store_true", help="print queue position and reason changes"
    )


JOB_FIELDS = (
    "gpus",
    "gpu_ids",
    "node_gpu_ids",
    "nodes",
    "gpus_per_node",
    "nodelist",
    "exclude",
    "gpu_type",
    "policy",
    "distributed",
    "mpi",
    "time",
    "name",
    "priority",
    "retries",
    "dependency",
    "array",
    "preemptible",
    "image",
    "container",
    "signal",
    "hold",
    "notify",
    "gpu_share",
    "reservation",
    "cpus",
    "mem",
    "exclusive",
)


def _json(text: str) -> Any:
    """A JSON value (argparse says "invalid _json value" for one that is not)."""
    import json

    return json.loads(text)


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    # `is`, not `in`: 0 == False, and --gpus 0 / --retries 0 / --priority 0 are real values.
    values = {k: getattr(args, k, None) for k in JOB_FIELDS}
    out = {k: v for k, v in values.items() if v is not None and v is not False}
    return out


# ---- the master's address -----------------------------------------------------


def add_address_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        help="master HOST[:PORT], or several: HOST[:PORT],HOST[:PORT] (the leader is found; "
        "default $MGPU_MASTER or 127.0.0.1)",
    )
    p.add_argument("--port", type=int, help="master port (default 8080)")
    p.add_argument("--token", help="your token (default $MGPU_TOKEN or ~/.config/mgpu/token)")


def make_client(args: argparse.Namespace) -> Client:
    connect_timeout = getattr(args, "connection_timeout", None) or 10.0
    return Client(host=args.host, port=args.port, connect_timeout=connect_timeout, token=args.token)
