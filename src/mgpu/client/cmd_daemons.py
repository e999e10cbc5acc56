"""`mgpu master`, `mgpu node` (and `node remove`), `mgpu up` and `mgpu down`: the commands
that run or manage the daemons, apart from the everyday client commands in cli.py."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu.client.console import fail
from mgpu.client.options import UsageError, make_client

__all__ = ["NO_JOIN_TOKEN", "add_daemon_parsers"]


def cmd_master(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mgpu.config import ConfigError
    from mgpu.dbaddress import AddressError, from_command_line
    from mgpu.master.server import default_state_dir, run_master
    from mgpu.master.store.base import StoreError

    state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()
    try:  # before the unit too: it would write the password into a world-readable file
        database = from_command_line(args.database, args.database_file)
    except AddressError as e:
        fail(str(e))
    if args.print_systemd_unit:
        from mgpu.deploy import master_unit

        print(master_unit(args, state_dir), end="")
        return 0
    try:
        run_master(
            args.host,
            args.port,
            state_dir,
            args.config,
            args.verbose,
            tls=True if args.tls else (False if args.insecure else None),
            database=database,
            cluster_secret_file=args.cluster_secret_file,
            advertise=args.advertise,
        )
    except (ConfigError, StoreError, AddressError) as e:
        fail(str(e))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    """`mgpu db import STATE_DIR --database URL`: a SQLite master's state into PostgreSQL."""
    from pathlib import Path

    from mgpu.dbaddress import AddressError, describe, from_command_line
    from mgpu.master.store.base import StoreError

    try:
        database = from_command_line(args.database, args.database_file)
    except AddressError as e:
        fail(str(e))
    if not database:
        raise UsageError(
            "mgpu db import needs --database postgresql://USER@HOST:PORT/DB (or --database-file)"
        )
    from mgpu.master.ha.identity import IdentityError, import_hook, read_secret
    from mgpu.master.store.dbimport import HOOKS, import_state

    try:
        # The cluster's identity (CA, join and admin tokens) goes too, sealed with the
        # secret the masters of the database will be given.
        hooks = [*HOOKS, _import_output, import_hook(read_secret(args.cluster_secret_file))]
        counts = import_state(Path(args.state_dir).expanduser(), database, hooks)
    except (StoreError, IdentityError) as e:
        fail(str(e))
    shown = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items())
    print(f"imported {args.state_dir} into {describe(database)}: {shown}")
    return 0


def _import_output(state_dir: Path, conn: Any) -> dict[str, int]:
    """`mgpu db import`'s step for job output: the state dir's output files into the
    output tables, so `mgpu logs` of an old job works on every master."""
    from mgpu.master.store.outputtables import import_output_files

    return {"job outputs": import_output_files(state_dir / "output", conn)}


def cmd_node_remove(args: argparse.Namespace) -> int:
    if not args.target:
        raise UsageError("mgpu node remove needs the node id: mgpu node remove ID")
    if args.join_token:
        args.token = args.join_token  # `mgpu node remove ID --token T`: T is the admin's
    if args.node_host or args.master_host:
        args.host = _node_master_host(args)  # `node remove ID --host H`, as for node
    res = make_client(args).remove_node(args.target)
    requeued = res.get("requeued") or []
    print(f"removed {res['removed']}" + (f"; requeued {', '.join(requeued)}" if requeued else ""))
    return 0


def _fake_mem(text: str | None) -> int | None:
    """`--fake-mem SIZE` in MiB (Slurm's units), or None."""
    if text is None:
        return None
    from mgpu.resources import SizeError, parse_size_mb

    try:
        mb = parse_size_mb(text)
    except SizeError as e:
        fail(f"--fake-mem: {e}")
    if mb <= 0:
        fail("--fake-mem must be more than 0")
    return mb


def cmd_node(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.action == "remove":
        return cmd_node_remove(args)
    if args.node_id is None:
        raise UsageError("the following arguments are required: --node-id")
    from mgpu.agent.agent import AgentRefused, run_agent
    from mgpu.agent.identity import NodeIdentityError
    from mgpu.agent.options import AgentOptions
    from mgpu.master.server import default_state_dir, setup_logging
    from mgpu.spec import SpecError, validate_node_id

    try:
        validate_node_id(args.node_id)
    except SpecError as e:
        fail(str(e))
    if args.fake_gpus is not None and args.fake_gpus < 0:
        fail("--fake-gpus must not be negative")
    if args.gpu_count is not None and args.gpu_count < 0:
        fail("--gpu-count must not be negative")
    fake_mem_mb = _fake_mem(args.fake_mem)
    if args.fake_cpus is not None and not 1 <= args.fake_cpus <= 4096:
        fail("--fake-cpus must be from 1 to 4096")
    args.master_host = _node_master_host(args)
    from mgpu.addresses import AddressError, parse_addresses

    try:
        scheme, masters = parse_addresses(args.master_host, args.master_port, "--master-host")
    except AddressError as e:
        raise UsageError(f"{e} (give HOST[:PORT], or several: HOST[:PORT],HOST[:PORT])") from None
    if not os.path.isdir(args.gpu_device_dir):
        fail(f"--gpu-device-dir {args.gpu_device_dir} is not a directory")
    state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()
    if args.print_systemd_unit:
        from mgpu.deploy import node_unit

        print(node_unit(args, state_dir), end="")
        return 0
    options = AgentOptions(
        node_id=args.node_id,
        master_host=masters[0][0],
        master_port=masters[0][1],
        masters=tuple(masters) if len(masters) > 1 else (),
        state_dir=state_dir,
        fake_gpus=args.fake_gpus,
        fake_cpus=args.fake_cpus,
        fake_mem_mb=fake_mem_mb,
        advertise_ip=args.advertise_ip,
        token=args.join_token,
        insecure=args.insecure,
        scheme=scheme,
        container_runtime=args.container_runtime,
        gpu_device_dir=Path(args.gpu_device_dir),
        gpu_count=args.gpu_count,
    )
    if args.health:
        from mgpu.agent.health import run_health

        return run_health(options)
    if args.fake_foreign:
        from mgpu.agent.telemetry import parse_gpu_values

        try:
            parse_gpu_values(args.fake_foreign, "--fake-foreign")
        except ValueError as e:
            fail(str(e))
        os.environ["MGPU_FAKE_FOREIGN"] = args.fake_foreign  # read by the telemetry sampler
    if args.advertise_ip:
        import ipaddress

        try:
            ipaddress.ip_address(args.advertise_ip)
        except ValueError:  # the master would refuse the hello for it
            raise UsageError(f"--advertise-ip {args.advertise_ip!r} is not an IP address") from None
    import socket

    from mgpu.protocol import check_hostname

    try:
        check_hostname(socket.gethostname())
    except ValueError as e:  # the master would refuse every hello: say so once, not retry
        raise UsageError(f"this machine's hostname cannot join: {e}") from None
    setup_logging(args.verbose)
    from mgpu.agent.gpus import GpuCountError

    try:
        run_agent(options)
    except AgentRefused as e:
        from mgpu.credentials import find_join_token

        if find_join_token(args.join_token, state_dir) is None:
            fail(NO_JOIN_TOKEN)
        fail(f"the master refused this node: {e}")
    except (NodeIdentityError, GpuCountError) as e:
        fail(str(e))
    return 0


NO_JOIN_TOKEN = (
    "this node has no join token: copy it from the file join-token in the master's state dir "
    "(on the master's machine ~/.local/state/mgpu/join-token of the account running "
    "`mgpu master`, unless it was given --state-dir or $MGPU_STATE_DIR; its log names the "
    "file) and give it to this node with --token TOKEN or $MGPU_JOIN_TOKEN"
)


def _node_master_host(args: argparse.Namespace) -> str:
    """`--master-host` (repeatable, each `HOST[:PORT],...`), or the original node agent's
    `--host` for the same thing: the masters as one comma-separated list."""
    given = ",".join(args.master_host or [])
    seed = ",".join(args.node_host or [])
    if given and seed and given != seed:
        fail(
            f"--host {seed} and --master-host {given} name different masters; give only "
            "--master-host"
        )
    return given or seed or "127.0.0.1"


def cmd_up(args: argparse.Namespace) -> int:
    from mgpu.client.local import cluster_up

    return cluster_up(args.port, args.fake_gpus, args.state_dir)


def cmd_down(args: argparse.Namespace) -> int:
    from mgpu.client.local import cluster_down

    return cluster_down(args.state_dir)


DATABASE_FILE_HELP = (
    "instead of --database: a file only you may read (chmod 600) holding the address, "
    "password and all"
)


def add_daemon_parsers(add: Callable[..., Any]) -> None:
    """Register the daemons' commands (`add(name, fn, help)` is build_parser's)."""
    s = add("master", cmd_master, "run the control plane (foreground)")
    s.add_argument("--host", dest="host", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", dest="port", type=int, help="port (default 8080)")
    s.add_argument("--config", help="cluster_config.yaml")
    s.add_argument("--state-dir", help="state directory (default $MGPU_STATE_DIR)")
    s.add_argument(
        "--database",
        metavar="URL",
        help="keep the state in PostgreSQL (postgresql://USER@HOST:PORT/DB, no password: "
        "~/.pgpass; default: SQLite in the state dir; also `database:` in the config)",
    )
    s.add_argument("--database-file", metavar="FILE", help=DATABASE_FILE_HELP)
    s.add_argument("--tls", action="store_true", help="serve TLS on loopback too")
    s.add_argument("--insecure", action="store_true", help="no TLS even on a public address")
    s.add_argument("--verbose", "-v", action="store_true")
    s.add_argument(
        "--print-systemd-unit", action="store_true", help="print a systemd unit for this command"
    )
    s.add_argument(
        "--cluster-secret-file",
        metavar="FILE",
        help="with --database: the secret every master shares (or $MGPU_CLUSTER_SECRET)",
    )
    s.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="with --database: where clients reach this master (default: its bind address)",
    )

    s = add("db", cmd_db, "the master's database: `db import STATE_DIR --database URL`")
    s.add_argument("action", choices=["import"], help="import: a SQLite state dir into PostgreSQL")
    s.add_argument("state_dir", metavar="STATE_DIR", help="the state dir of a master on SQLite")
    s.add_argument(
        "--database", metavar="URL", help="an empty PostgreSQL database: postgresql://USER@HOST/DB"
    )
    s.add_argument("--database-file", metavar="FILE", help=DATABASE_FILE_HELP)
    s.add_argument(
        "--cluster-secret-file",
        metavar="FILE",
        help="the secret the masters will share (or $MGPU_CLUSTER_SECRET): seals the identity",
    )

    s = add("node", cmd_node, "run a node agent (foreground); `node remove ID` forgets a node")
    s.add_argument("action", nargs="?", choices=["remove"], help="remove ID (admin)")
    s.add_argument("target", nargs="?", metavar="ID", help="(remove) the node to forget")
    s.add_argument("--node-id")
    s.add_argument(
        "--master-host",
        action="append",
        metavar="HOST[:PORT][,HOST[:PORT]]",
        help="the master's address (default 127.0.0.1); several masters (one leads): a "
        "comma-separated list or the option repeated",
    )
    s.add_argument(
        "--host",
        dest="node_host",
        action="append",
        metavar="MASTER_HOST",
        help="the same (the original name)",
    )
    s.add_argument("--master-port", type=int, default=8080)
    s.add_argument("--fake-gpus", type=int, help="simulate N GPUs")
    s.add_argument("--gpu-count", type=int, help="manage only the node's first N GPUs")
    s.add_argument("--fake-cpus", type=int, metavar="N", help="offer N CPUs (ids 0..N-1)")
    s.add_argument("--fake-mem", metavar="SIZE", help="offer this much memory (8G, 512M)")
    s.add_argument(
        "--fake-foreign",
        metavar="GPU:MB[,GPU:MB]",
        help="simulate use outside mgpu of fake GPUs (also $MGPU_FAKE_FOREIGN)",
    )
    s.add_argument("--health", action="store_true", help="run the node's checks and exit")
    s.add_argument("--advertise-ip", help="the IP other nodes reach this one at")
    s.add_argument(
        "--token", dest="join_token", help="join token (default $MGPU_JOIN_TOKEN; remove: yours)"
    )
    s.add_argument("--insecure", action="store_true", help="plain ws:// to a non-loopback master")
    s.add_argument("--state-dir", help="state directory (default $MGPU_STATE_DIR)")
    s.add_argument("--verbose", "-v", action="store_true")
    s.add_argument(
        "--container-runtime",
        choices=["auto", "podman", "docker", "apptainer", "none"],
        default="auto",
        help="runtime for --image jobs (default: the first of podman, docker, apptainer)",
    )
    s.add_argument("--gpu-device-dir", default="/dev", help="where the GPUs' nvidiaN files are")
    s.add_argument(
        "--print-systemd-unit", action="store_true", help="print a systemd unit for this command"
    )

    s = add("up", cmd_up, "start a local cluster (master + one node) in the background")
    s.add_argument("--fake-gpus", type=int, help="simulate N GPUs (default: 4 if none found)")
    s.add_argument("--port", dest="port", type=int, default=8080)
    s.add_argument("--state-dir")

    s = add("down", cmd_down, "stop the local cluster started by mgpu up")
    s.add_argument("--state-dir")
