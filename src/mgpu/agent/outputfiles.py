"""A Slurm batch job's -o/-e files, written on the node by the job's own user.

The agent never opens a path a user names: a root agent that did could be pointed at
any file by a symbolic link.  Everything here happens in the job, as its user, in a small
POSIX sh wrapper put in front of the job's argv (after the shim and before the script):

1. it enters the job's working directory as Slurm does: one it cannot enter is an error
   line on stderr (Slurm's words), then /tmp, where the shim alone would fail the job;
2. it opens the -o and -e files there (truncated, or appended to with --open-mode=append);
   one it cannot open ends the job with Slurm's sentence on stderr, which `open_failure`
   finds so that the job fails with the path in its reason.  The directory may be one
   every account can write (a lab's scratch dir) and the job's number known ahead, so
   a name is opened once, onto a descriptor, and never walked again: nothing is created
   through a link (an existing name is opened for reading, a new one created with
   O_EXCL), then the descriptor is checked: the name's own lstat must be that file (a
   final symbolic link, or a swap, is refused), and it must be a character device
   (/dev/null) or a regular file the job's user owns.  Only then is it reopened through
   /proc/self/fd to append (and truncated), and the copies write to that descriptor;
3. it copies the run's spool files (what the agent streams to the master: `mgpu logs`)
   into those descriptors from the first byte, as they grow: one `tail -f` per stream, each
   reading its spool file through a descriptor of the wrapper's own stdout or stderr
   reopened by /proc (so the copy needs no path into the agent's private spool).  One
   file for both (the default) is one stream, as in Slurm: the job's stderr goes to its
   stdout, so that the file has the lines in the order they were written;
4. it runs the job in the foreground (SLURM_TASK_PID is its pid) and, once it ends, lets
   the copies catch up (a `tail --pid` reads to the end when the process it follows goes)
   and exits with the job's status.

Nothing of the job waits on the copies: the job writes to the spool files as every job
does, and a copy that falls behind costs the job nothing.  The copies and the process they
follow ignore SIGTERM, so that a cancelled job's last words (written during its grace
time) still reach its files; SIGKILL at the end of the grace time ends them with the rest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from mgpu import exits
from mgpu.exits import OPEN_FAILED, OPEN_FAILED_MARK

__all__ = ["OPEN_FAILED", "WRAPPER", "open_failure", "share_spool", "wrap"]


_LINES = [
    "trap : TERM INT HUP; dir=$1 out=$2 err=$3 mode=$4; shift 4",
    # 1. the working directory, as slurmstepd enters it
    'if ! cd -- "$dir" 2>/dev/null; then',
    '  if [ ! -e "$dir" ]; then why="No such file or directory"',
    '  elif [ ! -d "$dir" ]; then why="Not a directory"; else why="Permission denied"; fi',
    "  echo \"slurmstepd: error: couldn't chdir to \\`$dir': $why: going to /tmp instead\" >&2",
    "  cd /tmp || {",
    '    echo "slurmstepd: error: couldn\'t chdir to /tmp either. dying." >&2; exit 1; }',
    "fi",
    # 2. the files, relative to the working directory asked for (Slurm's fname_create),
    # each opened once, checked through its descriptor, and written through it only
    "case $out in /*) ;; *) out=$dir/$out ;; esac",
    "case $err in /*) ;; *) err=$dir/$err ;; esac",
    "refuse() {",
    "  why=${3:-was replaced while it was opened}; why=${why##*: }",
    '  case $why in "Directory nonexistent"|"No such file")',
    '    why="No such file or directory" ;; esac',
    f'  echo "{OPEN_FAILED_MARK}$2 file $1: $why" >&2; exit {OPEN_FAILED}',
    "}",
    # Onto descriptor 9, and nothing is created through a link: an existing name is opened
    # for reading (which never creates), a new one created exclusively (O_EXCL follows no
    # link).  The message comes from the same open tried in a subshell first.
    "opened() {",
    '  if [ -L "$1" ]; then refuse "$1" $2 "is a symbolic link"',
    # (a fifo's open would wait for a writer)
    '  elif [ -p "$1" ] || [ -S "$1" ]; then refuse "$1" $2 "not a regular file"',
    '  elif [ -e "$1" ]; then why=$( { : <"$1"; } 2>&1 ) &&',
    '    { command exec 9<"$1"; } 2>/dev/null || refuse "$1" $2 "$why"',
    '  else set -C; { command exec 9>"$1"; } 2>/dev/null || {',
    '    why=$( { : >"$1"; } 2>&1 ); refuse "$1" $2 "$why"; }; set +C; fi',
    # The name must still be that very file, itself (lstat: a link planted or swapped in
    # is another inode); then a character device (/dev/null: only root makes one) or a
    # regular file of the job's own user.
    '  at=$(stat -c %d:%i -- "$1" 2>/dev/null); it=$(stat -L -c %d:%i /proc/self/fd/0 <&9)',
    '  if [ -z "$it" ] || [ "$at" != "$it" ]; then',
    '    [ -L "$1" ] && refuse "$1" $2 "is a symbolic link" || refuse "$1" $2',
    "  elif [ -c /proc/self/fd/9 ]; then :",
    '  elif [ -d /proc/self/fd/9 ]; then refuse "$1" $2 "Is a directory"',
    '  elif [ ! -f /proc/self/fd/9 ]; then refuse "$1" $2 "not a regular file"',
    "  elif [ ! -O /proc/self/fd/9 ]; then",
    '    refuse "$1" $2 "not owned by $(id -un 2>/dev/null || id -u)"; fi',
    # Reopened (the same file: /proc follows no name) to append, then truncated unless
    # --open-mode=append
    "  why=$( { : >>/proc/self/fd/9; } 2>&1 ) &&",
    '    { command exec 9>>/proc/self/fd/9; } 2>/dev/null || refuse "$1" $2 "$why"',
    '  [ "$mode" = append ] || why=$( { : >/proc/self/fd/9; } 2>&1 ) || refuse "$1" $2 "$why"',
    "}",
    'opened "$out" stdout; exec 7>&9',
    '[ "$err" = "$out" ] || { opened "$err" stderr; exec 8>&9; }; exec 9>&-',
    # 3. the copies, to descriptors 7 and 8 (the files' names are never walked again): one
    # file for both streams is one stream, in the order written (as Slurm's); what the
    # wrapper said on stderr so far goes first
    "exec 5</proc/self/fd/1 6</proc/self/fd/2",
    "( trap '' TERM INT HUP; exec sleep 2147483647 ) & keep=$!",
    # (the descriptor is named inside: a job in the background reads /dev/null otherwise)
    "copy() { ( trap '' TERM INT HUP; exec tail -c +1 -s 0.2 --pid=$keep -f <&$1 >&$2 ) \\",
    "  2>/dev/null & }",
    'if [ "$err" = "$out" ]; then',
    "  cat <&6 >&7; exec 2>&1; copy 5 7; o=$! e=",
    "else copy 5 7; o=$!; copy 6 8; e=$!; fi",
    "exec 5<&- 6<&- 7>&- 8>&- 4>&1 5>&2",
    # 4. the job, in the foreground of a subshell whose stderr is read: the shell's line
    # for a death by signal (`Killed`) is not the job's output (Slurm's has none), and
    # the wrapper then dies of that signal itself, so that the shim tells it too.
    # (It outlives the SIGTERM of a cancel, as the wrapper does, to tell the script's end;
    # the script starts with the signals at their defaults all the same.)
    "said=$( trap : TERM INT HUP; { ( exec 1>&4 2>&5 4>&- 5>&-",
    '  exec /bin/sh -c \'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"\' batch "$@"',
    "); echo $?; } 2>&1 ); exec 4>&- 5>&-",
    "c=${said##*[!0-9]}",
    # Ignored from here: a trapped signal would cut `wait` short (the agent's SIGTERM comes
    # several times: to the group, the cgroup, each process), and the copies with it.
    "trap '' TERM INT HUP; kill -9 $keep 2>/dev/null; wait $o $e",
    'if [ "$c" != "$said" ] && [ "$c" -gt 128 ] && [ "$c" -lt 193 ]; then',
    "  ulimit -c 0; trap - TERM INT HUP; kill -$((c - 128)) $$; fi",
    "exit $c",
]
WRAPPER = "\n".join(_LINES)
MARK = "slurm-batch"
"""The wrapper's $0: how mgpu.agent.jobsignal knows it (its signals go to the script)."""
"""$1 the working directory, $2 the -o file, $3 the -e file (relative to $1 unless
absolute), $4 truncate or append; then the job's argv."""


def wrap(argv: Sequence[str], workdir: str, output: str, error: str, append: bool) -> list[str]:
    """The argv that runs `argv` with its output also written to `output` and `error`."""
    mode = "append" if append else "truncate"
    return ["/bin/sh", "-c", WRAPPER, MARK, workdir, output, error, mode, *argv]


def share_spool(fds: Sequence[int], ids: tuple[int, int, list[int]] | None) -> None:
    """Let the job's user reopen its own spool files (its stdout and stderr) for reading:
    they are its user's pool files anyway (mgpu.agent.recycle), reached only through the
    job's own descriptors, never by a path the user could walk."""
    if ids is not None:
        for fd in fds:
            os.fchown(fd, ids[0], ids[1])


def open_failure(exit_code: int | None, err_path: str) -> str | None:
    """Slurm's sentence of a batch job whose -o/-e file could not be opened (the
    wrapper's first words on stderr, in the agent's own spool file); else None."""
    if exit_code != OPEN_FAILED:
        return None
    try:
        with open(err_path, "rb") as f:
            head = f.read(8192).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    return exits.open_failure(exit_code, head)
