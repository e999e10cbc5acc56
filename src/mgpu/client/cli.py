"""The `mgpu` command line: a thin skin over `mgpu.Client` (and the server entry points).

`mgpu queue` and `mgpu show` start in a few milliseconds: they import only what they use
(no argparse, typing, json, pathlib, socket: see `_quick_args` and the client modules; a
test keeps it so); the server stacks load only for `mgpu master` / `mgpu node`.
"""

from __future__ import annotations

import os
import sys

from mgpu.client import jsonlite as json  # json's loads/dumps, without its import cost
from mgpu.client.api import MgpuError, RequestError
from mgpu.client.console import fail, print_error, warn
from mgpu.client.options import (
    JOB_FIELDS,
    UsageError,
    add_address_options,
    add_job_options,
    job_options,
    make_client,
)
from mgpu.client.submitting import follow_job, submitted
from mgpu.safetext import escape_controls

__all__ = ["JOB_FIELDS", "UsageError", "add_job_options", "build_parser", "job_options", "main"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn


# ---- commands ---------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    if args.pty:
        raise UsageError(
            "--pty is for srun (mgpu srun --pty -- ARGV): a queued job has no terminal"
        )
    if args.command and os.path.isfile(args.command[0]):  # a job script
        from mgpu.client.cmd_jobctl import is_slurm_script, read_script, submit_script

        path = args.command[0]
        text = read_script(path)  # None: a program, run as a command
        if text is not None and is_slurm_script(text):
            from mgpu.slurm.mgpusubmit import submit_batch

            return submit_batch(args, path, text, list(args.command[1:]))
        if text is not None:
            return submit_script(args, text)
    command = " ".join(args.command) if len(args.command) > 1 else "".join(args.command)
    if not command.strip():
        raise UsageError("the command is empty")
    client = make_client(args)
    opts = job_options(args)
    if args.interactive:
        opts["interactive"] = True
    return submitted(client, client.submit(command, **opts), args)


def cmd_srun(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or not argv[0].strip():
        raise UsageError("srun needs a command after --")
    client = make_client(args)
    from mgpu.client.cmd_alloc import srun_special

    code = srun_special(client, args, argv)  # --pty, or a step inside mgpu alloc
    if code is not None:
        return code
    opts = job_options(args)
    opts["interactive"] = True
    job = client.submit(argv, **opts)
    warn(job.warnings)
    return follow_job(client, job.id, args)


def cmd_queue(args: argparse.Namespace) -> int:
    client = make_client(args)
    # The table folds an array's queued tasks into one line: the master does it, so that
    # 100,000 of them are not sent to be folded here.
    data = client.queue(all=args.all, fold=not args.json)
    if args.json:
        print(json.dumps(data))
        return 0
    from mgpu.client.render import render_queue

    print(render_queue(data))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    client = make_client(args)
    job = client.show(args.job, all=bool(getattr(args, "all", False)))
    if args.json:
        print(json.dumps(job))
        return 0
    from mgpu.client.render import render_array, render_job

    if "tasks" in job:  # an array: its tasks by state, and the first ones as `queue` shows
        print(render_array(job))
        return 0
    print(render_job(job))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from mgpu.client.stream import print_logs

    client = make_client(args)
    return print_logs(client, args.job, follow=args.follow, raw=args.raw)


def cmd_cancel(args: argparse.Namespace) -> int:
    if args.signal is not None:
        from mgpu.client.cmd_jobctl import cmd_signal

        return cmd_signal(args)
    client = make_client(args)
    status = 0
    for job_id in args.jobs:
        try:
            res = client.cancel(job_id)
        except RequestError as e:
            print_error(str(e))
            status = 1
            continue
        for j in res["cancelled"]:
            print(f"cancelled {j}")
        for j in res["already_ended"]:
            print(f"{j} had already ended", file=sys.stderr)
    return status


def cmd_nodes(args: argparse.Namespace) -> int:
    client = make_client(args)
    nodes = client.nodes()
    if args.json:
        print(json.dumps({"nodes": nodes}))
        return 0
    from mgpu.client.render import render_nodes

    print(render_nodes(nodes))
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    node = make_client(args).drain(args.node, args.reason)
    reason = f" ({node['reason']})" if node["reason"] else ""
    print(escape_controls(f"{node['node_id']}: {node['state']}{reason}"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    node = make_client(args).resume(args.node)
    print(f"{node['node_id']}: {node['state']}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    data = make_client(args).history(
        user=args.user, state=args.state, since=args.since, limit=args.limit
    )
    if args.json:
        print(json.dumps(data))
        return 0
    from mgpu.client.accounting import render_history

    print(render_history(data))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if args.json and args.csv:
        raise UsageError("use either --json or --csv")
    data = make_client(args).report(by=args.by, since=args.since)
    if args.json:
        print(json.dumps(data))
        return 0
    from mgpu.client.accounting import render_report, report_csv

    if args.csv:
        sys.stdout.write(report_csv(data))
    else:
        print(render_report(data))
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from mgpu.client.top import run_top

    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    return run_top(make_client(args), once=args.once, interval=args.interval)


def cmd_completion(args: argparse.Namespace) -> int:
    from mgpu.client.completion import completion_script

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return 0


def cmd_rsh(args: argparse.Namespace) -> int:
    """`mgpu rsh HOST CMD...`: the remote launcher mpirun uses inside an --mpi job."""
    from mgpu.client.stream import run_step

    words = list(args.words)
    # Accept ssh-style options before the host (-x, -l USER, -p PORT), as launchers pass them.
    while words and words[0].startswith("-"):
        flag = words.pop(0)
        if flag in ("-l", "-p", "-o", "-i") and words:
            words.pop(0)
    if len(words) < 2:
        raise UsageError("rsh needs a host and a command")
    job_id = os.environ.get("MGPU_JOB_ID")
    if not job_id:
        raise UsageError("rsh runs inside an mgpu job ($MGPU_JOB_ID is not set)")
    return run_step(make_client(args), job_id, words[0], words[1:])


def cmd_token(args: argparse.Namespace) -> int:
    client = make_client(args)
    if args.action == "create":
        if not args.user:
            raise UsageError("token create needs a USER")
        out = client.create_token(args.user, admin=args.admin, allow_root=args.allow_root)
        print(
            json.dumps({"user": out["user"], "token": out["token"]}) if args.json else out["token"]
        )
    elif args.action == "list":
        tokens = client.tokens()
        if args.json:
            print(json.dumps({"tokens": tokens}))
        else:
            from mgpu.client.render import render_tokens

            print(render_tokens(tokens))
    else:
        if not args.user:
            raise UsageError("token revoke needs a token ID (see mgpu token list)")
        print(f"revoked {client.revoke_token(args.user)['revoked']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from mgpu.client.render import parse_since, render_events

    since = parse_since(args.since) if args.since else 0.0
    events = make_client(args).audit(since)
    print(json.dumps({"events": events}) if args.json else render_events(events))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from mgpu.config import ConfigError, load_config

    try:
        cfg = load_config(args.file)
    except ConfigError as e:
        fail(str(e))
    print(f"{args.file}: OK ({len(cfg.nodes)} nodes, policy {cfg.scheduling.default_policy})")
    return 0


# ---- parser -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    import argparse

    class Parser(argparse.ArgumentParser):
        """argparse, but a usage error is one line: `mgpu: error: ...`."""

        def error(self, message: str) -> NoReturn:
            raise UsageError(message)

    p = Parser(prog="mgpu", description="mgpu: a multi-node GPU job scheduler")
    add_address_options(p)
    p.add_argument("--version", action="version", version="mgpu 0.1.0")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Parser:
        sp: Parser = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        return sp

    s = add("submit", cmd_submit, "queue a job; prints its id")
    add_job_options(s)
    s.add_argument("--interactive", "-i", action="store_true", help="stream output, wait")
    s.add_argument("--pty", action="store_true", help=argparse.SUPPRESS)  # refused: srun's
    s.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command (run with /bin/sh -c), or FILE ARGS"
    )

    s = add("srun", cmd_srun, "run a job in the foreground with live output")
    add_job_options(s)
    s.add_argument("--pty", action="store_true", help="on a pseudo-terminal (a shell, an editor)")
    s.add_argument("argv", nargs=argparse.REMAINDER, help="-- ARGV...")

    from mgpu.client.cmd_jobctl import add_jobctl_parsers

    add_jobctl_parsers(add)
    from mgpu.client.cmd_alloc import add_alloc_parser

    add_alloc_parser(sub)

    s = add("queue", cmd_queue, "pending and running jobs, and nodes")
    s.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    s.add_argument("--json", action="store_true")

    s = add("show", cmd_show, "one job in full")
    s.add_argument("job")
    s.add_argument("--json", action="store_true")
    s.add_argument("--all", "-a", action="store_true", help="an array: list every task")

    s = add("logs", cmd_logs, "a job's output")
    s.add_argument("job")
    s.add_argument("--follow", "-f", action="store_true", help="follow until the job ends")
    s.add_argument(
        "--raw", action="store_true", help="control characters as they are, on a terminal too"
    )

    s = add("cancel", cmd_cancel, "cancel queued or running jobs")
    s.add_argument("jobs", nargs="+", metavar="JOB")
    s.add_argument(
        "--signal", "-s", metavar="SIG", help="send SIG (USR1, 10 ...) to running jobs instead"
    )

    s = add("nodes", cmd_nodes, "nodes and their GPUs")
    s.add_argument("--json", action="store_true")

    s = add("drain", cmd_drain, "stop new work on a node; running jobs finish")
    s.add_argument("node")
    s.add_argument("--reason", help="why (shown in mgpu nodes)")

    s = add("resume", cmd_resume, "reopen a drained node")
    s.add_argument("node")

    s = add("top", cmd_top, "live view of nodes, GPUs and the queue")
    s.add_argument("--once", action="store_true", help="print one frame and exit")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")

    s = add("history", cmd_history, "finished jobs with runtime and GPU-hours")
    s.add_argument("--user", "-u", help="only this user's jobs")
    s.add_argument("--state", help="only these final states (completed,failed,...)")
    s.add_argument("--since", default="7d", help="7d, 12h, 30m or a date (default 7d)")
    s.add_argument("--limit", type=int, default=1000, help="at most this many jobs")
    s.add_argument("--json", action="store_true")

    s = add("report", cmd_report, "GPU-hours, jobs, success rate and waits per user or node")
    s.add_argument("--by", choices=["user", "node"], default="user")
    s.add_argument("--since", default="7d", help="7d, 12h, 30m or a date (default 7d)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--csv", action="store_true")

    s = add("completion", cmd_completion, "print a shell completion script")
    s.add_argument("shell", choices=["bash", "zsh"])

    from mgpu.client.cmd_daemons import add_daemon_parsers

    add_daemon_parsers(add)

    from mgpu.client.cmd_simulate import add_simulate_parser

    add_simulate_parser(sub)

    s = add("token", cmd_token, "manage user tokens (admin)")
    s.add_argument("action", choices=["create", "list", "revoke"])
    s.add_argument("user", nargs="?", metavar="USER|ID")
    s.add_argument("--admin", action="store_true", help="(create) an admin token")
    s.add_argument(
        "--allow-root",
        action="store_true",
        help="(create) its jobs may run as uid 0 (owner only; needs security.allow_root_jobs)",
    )
    s.add_argument("--json", action="store_true")

    s = add("audit", cmd_audit, "who did what, when, from where (admin)")
    s.add_argument("--since", help="e.g. 1h, 7d, 30m")
    s.add_argument("--json", action="store_true")

    s = add("rsh", cmd_rsh, "start a process on a node of the current job (for mpirun)")
    s.add_argument("words", nargs=argparse.REMAINDER, metavar="[-x] HOST COMMAND...")

    s = add("config", cmd_config_check, "check a cluster config file")
    s.add_argument("action", choices=["check"])
    s.add_argument("file")
    from mgpu.client.cmd_reserve import add_reserve_parser

    add_reserve_parser(sub, make_client)
    return p


if TYPE_CHECKING:
    from argparse import Namespace as _Args
else:

    class _Args:
        """What argparse.Namespace is to the commands, for `_quick_args`."""

        def __init__(self, **values: Any) -> None:
            self.__dict__.update(values)


_QUICK_FLAGS = {
    "queue": {"--all": "all", "-a": "all", "--json": "json"},
    "show": {"--json": "json", "--all": "all", "-a": "all"},
}


def _quick_args(words: list[str]) -> argparse.Namespace | None:
    """`[--host H] [--port P] [--token T] queue [--all] [--json]`, `... show JOB [--json] [--all]`
    (the commands people run in loops) parsed without argparse, which costs them ~5 ms of
    imports and parser building.  Only these plain forms: anything else (help, a typo, an
    abbreviation, `--opt=value`) gives None, and argparse parses it or says what is wrong."""
    values: dict[str, Any] = {"host": None, "port": None, "token": None}
    i = 0
    while i < len(words) and words[i] in ("--host", "--port", "--token"):
        if i + 1 == len(words) or words[i + 1].startswith("-"):
            return None
        values[words[i][2:]] = words[i + 1]
        i += 2
    if values["port"] is not None:
        if not (values["port"].isascii() and values["port"].isdigit()):
            return None
        values["port"] = int(values["port"])
    if i == len(words) or words[i] not in _QUICK_FLAGS:
        return None
    cmd, flags = words[i], _QUICK_FLAGS[words[i]]
    values.update({name: False for name in flags.values()}, cmd=cmd)
    positional: list[str] = []
    for word in words[i + 1 :]:
        if word in flags:
            values[flags[word]] = True
        elif word.startswith("-"):
            return None
        else:
            positional.append(word)
    if cmd == "queue" and not positional:
        return _Args(fn=cmd_queue, **values)
    if cmd == "show" and len(positional) == 1:
        return _Args(fn=cmd_show, job=positional[0], **values)
    return None


SLURM_COMMANDS = (
    "sbatch",
    "salloc",
    "squeue",
    "scancel",
    "scontrol",
    "sinfo",
    "sacct",
    "slurm-bin",
)
"""Slurm's commands as `mgpu sbatch ...` (mgpu.slurm); `mgpu srun` stays mgpu's own."""


def main(argv: Sequence[str] | None = None, prefix: Sequence[str] = ()) -> None:
    args_list = [*prefix, *(sys.argv[1:] if argv is None else argv)]
    at = 0  # `mgpu [--host H] [--port P] [--token T] sbatch ...`, `mgpu slurm-bin`
    while at + 1 < len(args_list) and args_list[at] in ("--host", "--port", "--token"):
        at += 2
    if args_list[at : at + 1] == ["pod-agent"]:  # in a job's Pod (mgpu.podagent)
        from mgpu.podagent import main as pod_agent

        raise SystemExit(pod_agent())
    if args_list[at : at + 1] == ["pod-init"]:  # a job's first process in its Pod
        from mgpu.podagent.init import main as pod_init

        raise SystemExit(pod_init(args_list[at + 1 :]))
    if at < len(args_list) and args_list[at] in SLURM_COMMANDS:
        from mgpu.slurm.main import main as slurm_main

        slurm_main(args_list[at], args_list[at + 1 :], args_list[:at])
    try:
        args = _quick_args(args_list)
        if args is None:
            parser = build_parser()
            args = parser.parse_args(args_list)
            if getattr(args, "fn", None) is None:
                parser.print_help()
                raise SystemExit(2)
        code = args.fn(args)
    except UsageError as e:
        fail(str(e), 2)
    except MgpuError as e:
        fail(str(e))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        # `mgpu logs X | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None
    raise SystemExit(code)


def _alias(subcommand: str) -> Callable[[], None]:
    """Legacy names: `mgpu_srun --host H ARGS` = `mgpu --host H srun ARGS`."""

    def entry() -> None:
        argv = sys.argv[1:]
        front: list[str] = []
        # Client address options may come first, as with mgpu_client; master and node
        # take --host/--port as their own options.
        movable = subcommand not in ("master", "node")
        while movable and argv and argv[0] in ("--host", "--port") and len(argv) > 1:
            front += argv[:2]
            argv = argv[2:]
        main([*front, subcommand, *argv])

    return entry


main_master = _alias("master")
main_node = _alias("node")
main_srun = _alias("srun")
main_queue = _alias("queue")
main_cancel = _alias("cancel")
