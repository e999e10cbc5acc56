"""Submit the tier's cases to one system (Slurm or mgpu) and collect what they did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cases import Case

from helpers import BIN

RECORDER = Path(__file__).resolve().parent / "record.py"

SACCT_FIELDS = (
    "JobID,JobName,Partition,State,ExitCode,DerivedExitCode,NNodes,NodeList,User,Group,UID,"
    "WorkDir,Timelimit,ReqTRES,AllocTRES,Reason,Priority,Comment,Cluster,NTasks,AllocCPUS,"
    "ReqCPUS,ReqMem"
)


@dataclass
class System:
    """How to run Slurm's commands on one of the two systems."""

    name: str
    env: dict[str, str]
    root: Path
    prefix: tuple[str, ...] = ()
    """`mgpu` for mgpu's commands (`mgpu sbatch ...`), none for Slurm's own."""

    def run(
        self,
        *argv: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd or self.root,
            env={**self.env, **(env or {})},
            input=input,
        )

    def check(self, *argv: str, cwd: Path | None = None) -> str:
        res = self.run(*argv, cwd=cwd)
        assert res.returncode == 0, f"{self.name}: {' '.join(argv)}: {res.stderr}"
        return res.stdout


def slurm_system(env: dict[str, str], root: Path) -> System:
    return System("slurm", env, root)


def mgpu_system(env: dict[str, str], root: Path) -> System:
    return System("mgpu", env, root, (str(BIN / "mgpu"),))


@dataclass
class Outcome:
    """What one case did on one system."""

    workdir: Path
    ids: list[str] = field(default_factory=list)
    submits: list[tuple[int, str, str]] = field(default_factory=list)
    """Each submission's exit status, stdout and stderr."""
    records: dict[str, dict[str, object]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    sacct: list[dict[str, str]] = field(default_factory=list)
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)
    """`scontrol show job` of each submission, Key=Value parsed."""


def prepare(case: Case, workdir: Path) -> None:
    workdir.mkdir(parents=True)
    for rel, text in case.files.items():
        path = workdir / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        executable = text.startswith("x:")
        path.write_text(text[2:] if executable else text)
        if executable:
            path.chmod(0o755)


def submit_one(system: System, case: Case, index: int, out: Outcome) -> None:
    """The case's submission `index` (a later one may name an earlier one's id)."""
    sub = case.submits[index]
    rec = f"python3 {RECORDER}"
    ids = {f"J{i}": job_id for i, job_id in enumerate(out.ids)}
    options = [o.format(**ids).replace("@REC@", rec) for o in sub.options]
    argv = ["sbatch", "--parsable", *options]
    if sub.script is not None:
        (out.workdir / sub.name).write_text(sub.script.replace("@REC@", rec))
        argv += [sub.name, *sub.args]
    res = system.run(*argv, cwd=out.workdir, env={"SUBMIT_MARK": "from-shell", **sub.env})
    out.submits.append((res.returncode, res.stdout, res.stderr))
    if res.returncode == 0:
        out.ids.append(res.stdout.strip().split(";")[0])


TERMINAL = re.compile(r"^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|BOOT_FAIL|OUT_OF_MEMORY)")


def wait_ended(system: System, outcomes: list[Outcome], timeout: float = 150) -> None:
    """Until none of the jobs is queued or running, and the accounting has their ends."""
    ids = [job_id for o in outcomes for job_id in o.ids]
    if not ids:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = system.run("squeue", "-h", "-o", "%i %T", "-j", ",".join(ids))
        if res.returncode == 0 and not res.stdout.strip():
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"{system.name}: jobs still queued or running: {res.stdout}")
    while time.monotonic() < deadline:
        res = system.run("sacct", "-X", "-n", "-P", "-o", "State", "-j", ",".join(ids))
        states = res.stdout.split()
        if res.returncode != 0 or (states and all(TERMINAL.match(s) for s in states)):
            return
        time.sleep(0.5)
    raise AssertionError(f"{system.name}: the accounting lacks the jobs' ends")


def collect(system: System, case: Case, out: Outcome, accounting: bool) -> None:
    seen = out.workdir / "seen"
    if seen.is_dir():
        for path in sorted(seen.glob("*.json")):
            out.records[path.name] = json.loads(path.read_text())
    scripts = {s.name for s in case.submits if s.script is not None}
    for path in sorted(out.workdir.rglob("*")):
        rel = path.relative_to(out.workdir).as_posix()
        if path.is_file() and not rel.startswith("seen/") and rel not in scripts:
            out.files[rel] = path.read_text(errors="replace")
    if accounting and out.ids:
        res = system.run("sacct", "-P", "-o", SACCT_FIELDS, "-j", ",".join(out.ids))
        if res.returncode == 0 and res.stdout:
            header, *rows = res.stdout.splitlines()
            names = header.split("|")
            out.sacct = [dict(zip(names, row.split("|"), strict=True)) for row in rows]
    for job_id in out.ids:
        res = system.run("scontrol", "show", "job", job_id)
        if res.returncode == 0:
            out.jobs[job_id] = parse_keyvalues(res.stdout)


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=")


def parse_keyvalues(text: str) -> dict[str, str]:
    """`scontrol show` blocks: `Key=Value` pairs, a value running up to the next key
    (values may hold spaces: `Command=/x/job.sh a b`)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:  # the first record only (an array's tasks follow)
                break
            continue
        marks = list(_KEY.finditer(line))
        for m, nxt in zip(marks, [*marks[1:], None], strict=True):
            end = nxt.start() if nxt else len(line)
            fields[m.group(1)] = line[m.end() : end].strip()
    return fields


def run_both(
    slurm: System, mgpu: System, cases: tuple[Case, ...], accounting: bool
) -> dict[str, tuple[Outcome, Outcome]]:
    """Every case on both systems.  Submitted in lockstep, a submission to Slurm then the
    same to mgpu, so that both fresh clusters give each job the same id (an array's
    tasks take ids of their own on Slurm: arrays come last); then waited for together.
    A submission `after_end` first waits, on its cluster, for its case's jobs to end."""
    outcomes: dict[str, tuple[Outcome, Outcome]] = {}
    for case in cases:
        pair = (Outcome(slurm.root / case.name), Outcome(mgpu.root / case.name))
        for out in pair:
            prepare(case, out.workdir)
        for i, sub in enumerate(case.submits):
            for system, out in zip((slurm, mgpu), pair, strict=True):
                if sub.after_end:
                    wait_ended(system, [out])
                submit_one(system, case, i, out)
        outcomes[case.name] = pair
    with ThreadPoolExecutor(2) as pool:
        waits = [
            pool.submit(wait_ended, system, [o[k] for o in outcomes.values()])
            for k, system in enumerate((slurm, mgpu))
        ]
        for w in waits:
            w.result()
    for case in cases:
        for system, out in zip((slurm, mgpu), outcomes[case.name], strict=True):
            collect(system, case, out, accounting)
    return outcomes


def environment_for(system_env: dict[str, str]) -> dict[str, str]:
    """The submitting environment, the same on both sides: the test process's, less the
    variables a user's shell would not have."""
    env = dict(system_env)
    for key in list(env):
        if key.startswith(("PYTEST_", "SBATCH_", "SALLOC_")):
            del env[key]
    env["HOME"] = os.environ.get("HOME", "/root")
    return env
