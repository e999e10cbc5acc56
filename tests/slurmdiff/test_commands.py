"""squeue, scontrol, scancel, sacct and sinfo on a real Slurm and on mgpu, the same jobs
in the same states: pending for each reason mgpu can be in, running, cancelled; their
output parsed field by field.  A difference fails unless intended.py names it (the
pseudo-case `commands`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest
from compare import Difference, Normaliser
from intended import explain
from runner import Outcome, System, parse_keyvalues

PENDING = (
    ("held", ("-H", "-c", "2", "--mem=1000")),
    ("later", ("--begin=now+1hour", "--gpus=1", "--cpus-per-gpu=2", "--mem-per-gpu=500")),
    ("big", ("-N", "2", "--gpus-per-node=4", "--mem-per-cpu=100")),
)
"""Jobs that wait: on a hold, a begin time, and the GPUs `runner` holds; each asking
CPUs and memory in one of Slurm's ways."""


def _until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _sbatch(side: Side, name: str, *options: str, wrap: str = "true") -> str:
    out = side.system.check(
        "sbatch", "--parsable", "-J", name, *options, "--wrap", wrap, cwd=side.dir
    )
    return out.strip()


class Side:
    """One system's jobs of this module, by name."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.ids: dict[str, str] = {}
        self.dir = system.root / "commands"
        self.dir.mkdir(exist_ok=True)
        self.norm = Normaliser(Outcome(self.dir))

    def state(self, name: str) -> str:
        res = self.system.run("squeue", "-h", "-o", "%T", "-j", self.ids[name])
        return res.stdout.strip()

    def squeue(self, *argv: str) -> list[str]:
        return self.system.check("squeue", *argv, cwd=self.dir).splitlines()

    def by_name(self, text: str, column: int = 0, sep: str = "|") -> dict[str, str]:
        """Lines keyed by one column (the job's name), job ids written as the name's."""
        lines = {}
        for line in text.splitlines():
            fields = line.split(sep)
            lines[fields[column].strip()] = self.named(line)
        return lines

    def named(self, text: str) -> str:
        """Job ids replaced by `<name>` (the two clusters number these jobs differently):
        a whole word, or after `:` in a dependency."""
        by_id = {job_id: name for name, job_id in self.ids.items()}
        text = re.sub(
            r"(?<![\w/.:-])(\d+)(?![\w/.:-])|(?<=ok:)(\d+)",
            lambda m: f"<{by_id[m.group(0)]}>" if m.group(0) in by_id else m.group(0),
            text,
        )
        return self.norm.text(text)


@pytest.fixture(scope="module")
def sides(systems: tuple[System, System]) -> Iterator[tuple[Side, Side]]:
    pair = (Side(systems[0]), Side(systems[1]))
    for side in pair:  # runner holds all of node001's GPUs: big waits for them
        side.ids["runner"] = _sbatch(
            side, "runner", "-w", "node001", "--gres=gpu:4", wrap="sleep 300"
        )
    for side in pair:
        _until(lambda side=side: side.state("runner") == "RUNNING", "runner to start")
    for side in pair:
        for name, options in PENDING:
            side.ids[name] = _sbatch(side, name, *options)
        side.ids["dep"] = _sbatch(side, "dep", "-d", f"afterok:{side.ids['held']}")
    for side in pair:  # until each scheduler has looked at them (Slurm's reason: None)
        _until(
            lambda side=side: "None" not in side.squeue("-h", "-o", "%r", "-t", "PD"), "the reasons"
        )
    try:
        yield pair
    finally:
        for side in pair:
            side.system.run("scancel", *side.ids.values())


def _check(diffs: list[Difference], racy: tuple[str, ...] = ()) -> None:
    """Fail on a difference neither intended nor known; `racy`: keys whose value depends
    on timing on Slurm's side, not compared."""
    unexplained, known = [], []
    for diff in diffs:
        if diff.key in racy:
            continue
        kind, entry = explain("commands", diff.key, diff.slurm, diff.mgpu)
        if kind == "known" and entry is not None:
            known.append(f"{entry.name}: {diff}")
        elif not kind:
            unexplained.append(str(diff))
    assert not unexplained, "differs from Slurm:\n  " + "\n  ".join(unexplained)
    if known:
        pytest.xfail("known differences:\n  " + "\n  ".join(known))


def _compare_dicts(what: str, a: dict[str, str], b: dict[str, str]) -> list[Difference]:
    return [
        Difference(f"{what}:{key}", a.get(key), b.get(key))
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]


def test_squeue_states_and_reasons(sides: tuple[Side, Side]) -> None:
    s, m = sides
    fmt = ["-h", "-o", "%j|%t|%T|%r|%D|%b|%P|%u|%l|%C|%m", "-u", "root"]
    _check(
        _compare_dicts(
            "squeue", s.by_name("\n".join(s.squeue(*fmt))), m.by_name("\n".join(m.squeue(*fmt)))
        )
    )


def test_squeue_default_columns(sides: tuple[Side, Side]) -> None:
    s, m = sides
    diffs = []
    a, b = s.squeue("-u", "root"), m.squeue("-u", "root")
    if a[0].split() != b[0].split():
        diffs.append(Difference("squeue-default:header", a[0], b[0]))
    rows_a = {
        row.split()[2]: s.named(" ".join(row.split()[1:2] + row.split()[3:5] + row.split()[6:]))
        for row in a[1:]
    }
    rows_b = {
        row.split()[2]: m.named(" ".join(row.split()[1:2] + row.split()[3:5] + row.split()[6:]))
        for row in b[1:]
    }
    diffs += _compare_dicts("squeue-default", rows_a, rows_b)
    _check(diffs)


@pytest.mark.parametrize("name", ["held", "later", "big", "runner", "dep"])
def test_scontrol_show_job(sides: tuple[Side, Side], name: str) -> None:
    fields = []
    for side in sides:
        shown = parse_keyvalues(side.system.check("scontrol", "show", "job", side.ids[name]))
        fields.append({k: side.norm.field(side.named(v)) for k, v in shown.items()})
    _check(_compare_dicts("scontrol", fields[0], fields[1]))


def _cancelled_ids(side: Side) -> str:
    """The jobs the next test cancels (runner, held), as sacct's `-j` takes them."""
    return f"{side.ids['runner']},{side.ids['held']}"


def _cancelled_jobs(side: Side, field: str) -> list[str] | None:
    """One sacct field of the jobs the next test cancels, a line each; None where sacct
    failed."""
    res = side.system.run("sacct", "-X", "-n", "-P", "-o", field, "-j", _cancelled_ids(side))
    return res.stdout.splitlines() if res.returncode == 0 else None


def test_scancel_then_sacct_with_field_prefixes(sides: tuple[Side, Side]) -> None:
    """sacct matches field names by prefix in any case (`time` is Timelimit)."""
    for side in sides:
        # Slurm's controller sends a pending job to its accounting store in the background;
        # one cancelled before that is stored from the cancel alone (named "allocation", no
        # partition, no time limit: seen once in a run).  Compared once each has both.
        _until(
            lambda side=side: sorted(_cancelled_jobs(side, "JobName") or []) == ["held", "runner"],
            "the accounting store to have both jobs",
        )
    for side in sides:
        side.system.check("scancel", side.ids["runner"], side.ids["held"])
    for side in sides:
        _until(
            lambda side=side: not side.state("runner") and not side.state("held"),
            "the cancelled jobs to end",
        )
    fmt = "--format=User%20,JobID,Jobname%40,partition,state,time,start,nodelist,exitcode"
    outputs = []
    for side in sides:
        ids = _cancelled_ids(side)

        def accounted(side: Side = side) -> bool:
            states = _cancelled_jobs(side, "State")
            return (
                states is not None
                and len(states) == 2
                and all(t.startswith("CANCELLED") for t in states)
            )

        _until(accounted, "the accounting of the cancelled jobs")
        found: dict[str, tuple[list[str], str, dict[str, str]]] = {}

        def both_rows(
            side: Side = side,
            ids: str = ids,
            found: dict[str, tuple[list[str], str, dict[str, str]]] = found,
        ) -> bool:
            # Rows are found by their job id (the second column), not by a word's place
            # in the row; the formatted listing is asked again until it has both.
            header, rule, *rows = side.system.check("sacct", "-X", "-j", ids, fmt).splitlines()
            by_name = {side.named(row.split()[1]).strip("<>"): row for row in rows if row.split()}
            found["last"] = (header.split(), rule, {k: side.named(v) for k, v in by_name.items()})
            return {"runner", "held"} <= by_name.keys()

        try:
            _until(both_rows, "both cancelled jobs in the formatted sacct")
        except AssertionError:
            pass  # compared below as they are: the difference shows the rows
        outputs.append(found["last"])
    diffs = []
    if outputs[0][0] != outputs[1][0]:
        diffs.append(Difference("sacct:header", outputs[0][0], outputs[1][0]))
    if outputs[0][1] != outputs[1][1]:
        diffs.append(Difference("sacct:rule", outputs[0][1], outputs[1][1]))
    for name in ("runner", "held"):
        if name not in outputs[0][2] or name not in outputs[1][2]:
            diffs.append(Difference(f"sacct-{name}:row", outputs[0][2], outputs[1][2]))
            continue
        a, b = outputs[0][2][name], outputs[1][2][name]
        for i, (va, vb) in enumerate(zip(a.split(), b.split(), strict=False)):
            va, vb = sides[0].norm.field(va), sides[1].norm.field(vb)
            if va != vb:
                diffs.append(Difference(f"sacct-{name}:{outputs[0][0][i]}", va, vb))
        if len(a.split()) != len(b.split()):
            diffs.append(Difference(f"sacct-{name}:columns", a, b))
    # The held job never starts: mgpu shows Start None.  Slurm shows None too, or, once in
    # a clean-clone run (a rerun passed), a time: what its controller had set by the
    # cancel.  A race on Slurm's side.
    _check(diffs, racy=("sacct-held:Start",))


def test_sinfo(sides: tuple[Side, Side]) -> None:
    """Both clusters' nodes: node001 busy (runner, then idle once cancelled), node002 idle."""
    s, m = sides
    for side in sides:
        side.system.run("scancel", *side.ids.values())
    for side in sides:
        _until(lambda side=side: not side.squeue("-h", "-u", "root"), "no job left")
    diffs = []
    for argv in (["sinfo"], ["sinfo", "-N", "-h", "-o", "%N|%t|%P|%G"]):
        a = s.system.check(*argv).splitlines()
        b = m.system.check(*argv).splitlines()
        if [line.split() for line in a] != [line.split() for line in b]:
            diffs.append(Difference(f"{argv[-1] if len(argv) > 1 else 'sinfo'}:lines", a, b))
    _check(diffs)
