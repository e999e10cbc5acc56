"""`sbatch [OPTIONS] [SCRIPT [ARGS...]]`: queue a batch script (or `--wrap CMD`, or a
script on stdin) with the `slurm` block, and print `Submitted batch job ID`."""

from __future__ import annotations

import os
import sys

from mgpu import exits
from mgpu.slurm import common, jobopts, opts, output, pyxis
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from mgpu.client.api import Client

PROG = "sbatch"
MAX_SCRIPT_BYTES = 1 << 20
USAGE = (
    "Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n"
    "mgpu's sbatch: Slurm's options (the README's section 'Your Slurm scripts, unchanged' "
    "says what each does here)."
)
NO_MAIL = "this cluster sends no e-mail"
"""The master's refusal of a mailto: notification (master/control/notifytargets.py)."""
NOTIFY_REFUSED = "--notify"
"""How each of the master's refusals of a notification target begins."""


class Batch:
    """What `sbatch ARGV` submits: the script and its arguments, the options' values
    (merged), the submit fields, the `slurm` block and the warnings."""

    def __init__(
        self, argv: list[str], environ: Mapping[str, str], cwd: str, stdin: Any = None
    ) -> None:
        found, rest = opts.parse(PROG, argv, jobopts.JOB_OPTIONS, in_order=True)
        given = dict(found)
        self.help = "help" in given or "usage" in given
        self.version = "version" in given
        if self.help or self.version:
            return
        wrap = given.get("wrap")
        if wrap is not None:
            if rest:
                raise fail(PROG, "Script arguments not permitted with --wrap option")
            self.script = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{wrap}\n"
            self.script_name, self.name_default, self.args = "wrap", "wrap", []
        elif rest:
            path, self.args = rest[0], rest[1:]
            self.script = read_script(path)
            self.script_name = os.path.basename(path) or "script"
            self.name_default = self.script_name
            self.script_path = path
        else:
            self.script = _decode((stdin or sys.stdin.buffer).read(MAX_SCRIPT_BYTES + 1), "stdin")
            self.script_name, self.name_default, self.args = "sbatch", "sbatch", []
        check_script(self.script)
        self._options(found, environ, cwd)

    @classmethod
    def of_script(
        cls, path: str, text: str, args: list[str], environ: Mapping[str, str], cwd: str
    ) -> Batch:
        """`mgpu submit FILE ARGS` of a script with `#SBATCH` lines: what sbatch would
        submit for it (its `#SBATCH` lines and the SBATCH_* variables; mgpu's own options
        are laid over these by the caller).  No `#!` needed: mgpu runs it with /bin/sh."""
        self = cls.__new__(cls)
        self.help = self.version = False
        self.script, self.args = text, list(args)
        self.script_name = self.name_default = os.path.basename(path) or "script"
        self._options([], environ, cwd)
        return self

    script_path: str | None = None
    """The script as named on the command line (None: --wrap, stdin)."""

    def _options(self, found: list[tuple[str, str]], environ: Mapping[str, str], cwd: str) -> None:
        self.values = jobopts.merged(PROG, self.script, found, environ)
        self.fields, self.slurm, self.warnings = jobopts.submit_fields(
            PROG, self.values, environ, cwd
        )
        self.slurm.update(
            batch=True,
            job_name_default=self.name_default,
            submit_host=os.uname().nodename,
            submit_dir=cwd,
        )
        self.fields.setdefault("cwd", cwd)
        if self.script_path is not None:  # scontrol's Command, only when given
            self.slurm["script_path"] = command_path(
                self.script_path, self.fields["cwd"], environ.get("PATH", "")
            )
        if pyxis.given(self.values):
            image, _, notes = pyxis.request(PROG, self.values, self.fields["cwd"])
            self.warnings += notes
            if image is not None:
                self.script = pyxis.batch_wrapper(self.script, self.script_name, self.values)
        self.parsable = "parsable" in self.values
        self.quiet = "quiet" in self.values
        self.wait = "wait" in self.values
        mail_type = (self.values.get("mail-type") or "").upper()
        self.mail = None
        if mail_type != "NONE" and ("mail-user" in self.values or mail_type):
            self.mail = self.values.get("mail-user") or ""


def _decode(data: bytes, where: str) -> str:
    if len(data) > MAX_SCRIPT_BYTES:
        raise fail(
            PROG, f"Batch script from {where} is over 1 MiB; mgpu sends a script with its job"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(
            PROG, f"Batch script from {where} is not UTF-8 text (byte {e.start + 1})"
        ) from None


def command_path(name: str, workdir: str, path: str) -> str:
    """The script's path as Slurm's sbatch records it (`search_path`, the working
    directory last): a name with no leading `.` or `/` found readable on PATH or in the
    job's working directory is that file's path; anything else stays as given."""
    if name.startswith((".", "/")):
        return name
    for directory in [*(d for d in path.split(":") if d), workdir]:
        if not directory.startswith("/"):
            directory = os.path.join(workdir, directory)
        full = os.path.join(directory, name)
        if os.path.isfile(full) and os.access(full, os.R_OK):
            return full
    return name


def read_script(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as e:
        raise fail(PROG, f"Unable to open file {path}: {e.strerror}") from None
    return _decode(data, path)


def check_script(text: str) -> None:
    """Slurm's own refusals of a script."""
    if not text:
        raise fail(PROG, "Batch script is empty!")
    if not text.strip():
        raise fail(PROG, "Batch script contains only whitespace!")
    if not text.startswith("#!"):
        raise common.SlurmError(
            "sbatch: error: This does not look like a batch script.  The first\n"
            "sbatch: error: line must start with #! followed by the path to an interpreter.\n"
            "sbatch: error: For instance: #!/bin/sh"
        )
    if "\r\n" in text:
        raise common.SlurmError(
            "sbatch: error: Batch script contains DOS line breaks (\\r\\n)\n"
            "sbatch: error: instead of expected UNIX line breaks (\\n)."
        )


def _singleton(client: Client, name: str) -> list[str]:
    """This user's queued and running jobs called `name`: what `singleton` waits for."""
    user = client.whoami()["user"]
    jobs = client.queue()["jobs"]
    return [
        str(j["id"])
        for j in jobs
        if j.get("user") == user
        and common.job_name(j) == name
        and j.get("state") in ("queued", "running")
    ]


def submit(client: Client, batch: Batch) -> Any:
    """Queue it; a mail request the cluster cannot honour is one warning, as Slurm
    without a mailer (the job is queued)."""
    fields = dict(batch.fields)
    deps = batch.values.get("dependency")
    singleton = []
    if deps and "singleton" in deps.lower():
        singleton = _singleton(client, fields.get("name") or batch.name_default)
    dependency = jobopts.dependency(PROG, deps, singleton)
    if dependency:
        fields["dependency"] = dependency
    warnings = list(batch.warnings)
    if batch.mail is not None:
        fields["notify"] = f"mailto:{batch.mail or common.me()}"
    from mgpu.client.api import RequestError

    def send() -> Any:
        return client.submit(
            list(batch.args),
            script=batch.script,
            script_name=batch.script_name,
            slurm=batch.slurm,
            **fields,
        )

    try:
        try:
            job = send()
        except RequestError as e:
            if "notify" not in fields or NOTIFY_REFUSED not in str(e):
                raise
            # Mail never refuses a job (Slurm queues it whatever --mail-user says): a
            # cluster without SMTP, or a template's placeholder address, is one warning.
            del fields["notify"]
            warnings.append(mail_ignored(str(e)))
            job = send()
    except RequestError as e:
        raise refused(e) from None
    return job, warnings + list(job.warnings)


def mail_ignored(reason: str) -> str:
    """The warning for a mail request the master refused (the job is queued without it)."""
    if NO_MAIL in reason:
        return "--mail-user/--mail-type ignored: this cluster sends no e-mail"
    return f"--mail-user/--mail-type ignored: {reason}"


def refused(e: Exception) -> common.SlurmError:
    """The master's refusal in Slurm's words: `Batch job submission failed: ...` (`Job
    dependency problem` for a dependency), the master's reason after it."""
    reason = str(e)
    if "dependency" in reason.lower():
        reason = f"Job dependency problem ({reason})"
    return fail(PROG, f"Batch job submission failed: {reason}")


def wait_for(client: Client, job: Any) -> int:
    """`--wait`: the job's exit code (an array's highest)."""
    ids = job.task_ids or [job.id]
    ended = client.wait_all(list(ids))
    codes = []
    for j in ended:
        code = j.get("exit_code")
        if j.get("state") == "completed":
            codes.append(0)
        else:
            codes.append(exits.shell_status(code) if isinstance(code, int) and code else 1)
    return max(codes or [0])


def main(argv: list[str]) -> int:
    batch = Batch(argv, os.environ, _cwd())
    if batch.help:
        output.out(USAGE)
        return 0
    if batch.version:
        output.out("slurm 22.05 (mgpu)")
        return 0
    client = common.make_client()
    job, warnings = submit(client, batch)
    if not batch.quiet:
        for warning in warnings:
            common.warn(PROG, warning)
        output.out(job.id if batch.parsable else f"Submitted batch job {job.id}", flush=True)
    if batch.wait:
        return wait_for(client, job)
    return 0


def _cwd() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise fail(PROG, "the current directory no longer exists") from None
