"""A Slurm batch job's -o/-e files in its Pod: written by the job's own user, in the job's
working directory (a template volume mounts it: the site's NAS), as on mgpu's own nodes
(mgpu.agent.outputfiles), while every byte still goes to the Pod's log (`mgpu logs`, the
master's copy).

The batch script's runner, a POSIX sh (busybox's will do), opens the files first
(truncated, or appended to with --open-mode=append); one it cannot open ends the job with
Slurm's sentence on stderr and status 53, as slurmstepd: the master, seeing both (the
sentence is the first line of the Pod's log), fails the job with it as a launch error, as
mgpu's own agent does.  It then runs the script with its
stdout and stderr through `tee -a`: each chunk the script writes goes to the file and to
the log alike, so neither loses or repeats a line.  One file for both (the default) is one
stream, as in Slurm; a separate -e file gets stderr.  The script's exit status is the
Pod's; `MGPU_BATCH_TOP=1` in its environment marks it and its children as the job's
processes for the pod agent's signals (mgpu.podagent.jobsignal).  The runner needs no
privilege: it is the job's user, as the script is."""

from __future__ import annotations

from mgpu.exits import OPEN_FAILED, OPEN_FAILED_MARK

__all__ = ["OPEN_FAILED", "runner"]

_WRITE_SCRIPT = (
    'f=$(mktemp) && printf "%s" "$MGPU_BATCH_SCRIPT" > "$f" && chmod 700 "$f" '
    "&& unset MGPU_BATCH_SCRIPT || exit 1"
)
_LINES = [
    "out=$1 err=$2 mode=$3; shift 3",
    # Named from the working directory in the sentence, as Slurm names them (fname_create).
    "case $out in /*) ;; *) out=$PWD/$out ;; esac",
    "case $err in /*) ;; *) err=$PWD/$err ;; esac",
    _WRITE_SCRIPT,
    "opened() {",
    '  if [ "$mode" = append ]; then why=$( { : >>"$1"; } 2>&1 )',
    '  else why=$( { : >"$1"; } 2>&1 ); fi && return',
    # dash's and busybox's words for a missing directory are the C library's in Slurm's.
    '  why=${why##*: }; case $why in "Directory nonexistent"|"nonexistent directory")',
    '    why="No such file or directory" ;; esac',
    f'  echo "{OPEN_FAILED_MARK}$2 file $1: $why" >&2',
    f"  exit {OPEN_FAILED}",
    "}",
    'opened "$out" stdout',
    '[ "$err" = "$out" ] || opened "$err" stderr',
    # Descriptor 3 is the Pod's stdout (its log); 4 carries what the script's shell said
    # out of the pipeline (sh has no pipefail); 6 and 7 are the script's stdout and stderr.
    # The script runs in the foreground of a command substitution whose stderr is read:
    # the shell's line for a death by signal (`Killed`) is not the job's output (Slurm's
    # has none), and the runner then dies of that signal itself, so that `mgpu pod-init`
    # (mgpu.podagent.init) tells it.
    'run() { said=$( { ( MGPU_BATCH_TOP=1 exec "$f" "$@" >&6 2>&7 3>&- 4>&- 6>&- 7>&- )',
    '  echo $?; } 2>&1 ); echo "$said" >&4; }',
    "exec 3>&1",
    'if [ "$err" = "$out" ]; then',
    '  c=$( { run "$@" 6>&1 7>&1 | tee -a "$out" >&3 4>&-; } 4>&1 )',
    "else",
    '  c=$( { { run "$@" 6>&5 7>&1 5>&- | tee -a "$err" >&2 4>&- 5>&-; } 5>&1 |',
    '    tee -a "$out" >&3 4>&-; } 4>&1 )',
    "fi",
    "code=${c##*[!0-9]}",
    'if [ "$code" != "$c" ] && [ "$code" -gt 128 ] && [ "$code" -lt 193 ]; then',
    "  ulimit -c 0; kill -$((code - 128)) $$; fi",
    'exit "${code:-1}"',
]
RUNNER = "\n".join(_LINES)


def runner(name: str, output: str, error: str, append: bool, argv: list[str]) -> list[str]:
    """The container's command: the batch script (in MGPU_BATCH_SCRIPT) run with `argv`,
    its output also written to `output` and `error` (relative to the working directory)."""
    mode = "append" if append else "truncate"
    return ["/bin/sh", "-c", RUNNER, name, output, error, mode, *argv]
