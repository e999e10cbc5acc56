"""Slurm 22.05's option table (mgpu.slurm.optable), read by sbatch, salloc and srun: every
option of every command parses in each of Slurm's forms (`--name=value`, `--name value`,
`-xVALUE`, `-x value`, the aliases and deprecated spellings), and each has one use in
mgpu: honoured, ignored with a warning, or refused in one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu.slurm import jobopts, optable, opts, srun
from mgpu.slurm.common import SlurmError
from mgpu.slurm.sbatch import Batch

CASES = [(command, row) for command in optable.COMMANDS for row in optable.rows(command)]


def _forms(row: optable.Row) -> list[list[str]]:
    """The ways Slurm's getopt_long takes the option, with the value "7"."""
    name = row.name
    if row.arg == "no":
        forms = [[f"--{name}"]]
        return forms + ([[f"-{row.short}"]] if row.short else [])
    if row.arg == "optional":
        forms = [[f"--{name}=7"], [f"--{name}"]]
        return forms + ([[f"-{row.short}7"], [f"-{row.short}"]] if row.short else [])
    forms = [[f"--{name}=7"], [f"--{name}", "7"]]
    return forms + ([[f"-{row.short}7"], [f"-{row.short}", "7"]] if row.short else [])


@pytest.mark.parametrize(
    ("command", "row"),
    CASES,
    ids=[f"{c}--{r.name}{'/' + r.short if r.short else ''}" for c, r in CASES],
)
def test_every_option_of_slurm_2205_parses_in_each_form(command: str, row: optable.Row) -> None:
    table = optable.options(command)
    for form in _forms(row):
        found, rest = opts.parse(command, [*form, "script.sh", "-x"], table, in_order=True)
        expected = "" if row.arg == "no" or (len(form) == 1 and "7" not in form[0]) else "7"
        assert found == [(row.canonical, expected)], form
        assert rest == ["script.sh", "-x"]


def test_the_table_is_slurms_whole_table() -> None:
    # slurm_opt.c of slurm-22-05-11-1 has 147 named entries that a command takes; pyxis's
    # 15 (a SPANK plugin's) follow them, in each of the three commands.
    slurms = [r for r in optable.ROWS if r.use != "pyxis"]
    assert len(slurms) == 147 and len(optable.ROWS) == 147 + 15
    assert optable.ROWS[:147] == slurms
    assert (
        len(optable.rows("sbatch")) - 15,
        len(optable.rows("srun")) - 15,
        len(optable.rows("salloc")) - 15,
    ) == (
        106,
        131,
        95,
    )
    for command in optable.COMMANDS:
        canon = {r.name for r in optable.rows(command) if not r.use.startswith("=")}
        for row in optable.rows(command):
            assert row.use in ("job", "gpu", "cpu", "cli", "step", "warn", "refuse", "pyxis") or (
                row.use.startswith("job:") or row.use[1:] in canon
            ), (command, row.name)
        assert optable.names(command, "refuse") <= optable.REFUSED.keys()


@pytest.mark.parametrize(
    ("spelling", "canonical", "command"),
    [
        ("--tasks-per-node=2", "ntasks-per-node", "sbatch"),
        ("--tasks-per-node=2", "ntasks-per-node", "srun"),
        ("--cpu_bind=cores", "cpu-bind", "srun"),
        ("--pack-group=0", "het-group", "srun"),
        ("--cluster=c", "clusters", "salloc"),
    ],
)
def test_aliases_and_deprecated_spellings(spelling: str, canonical: str, command: str) -> None:
    found, _ = opts.parse(command, [spelling], optable.options(command))
    assert [name for name, _ in found] == [canonical]


def test_tasks_per_node_in_a_script_is_ntasks_per_node(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 2 --tasks-per-node=4\nhostname\n")
    b = Batch([str(script)], {}, str(tmp_path))
    assert (b.slurm["ntasks_per_node"], b.warnings) == (4, [])


def test_srun_cpu_bind_underscore_is_warned_not_refused() -> None:
    values, command = opts.command_line(
        "srun", ["--cpu_bind=cores", "-n2", "hostname"], srun.OPTIONS, "", in_order=True
    )
    assert command == ["hostname"]
    _, _, warnings = jobopts.submit_fields("srun", values, {}, "/")
    assert warnings == ["ignored: --cpu-bind"]


@pytest.mark.parametrize(
    ("command", "option", "sentence"),
    [
        ("srun", "multi-prog", "--multi-prog is not supported by mgpu"),
        ("srun", "task-prolog", "--task-prolog is not supported by mgpu"),
        ("salloc", "no-shell", "--no-shell is not supported by mgpu"),
        ("sbatch", "test-only", "--test-only is not supported by mgpu"),
    ],
)
def test_options_that_would_change_what_runs_are_refused(
    command: str, option: str, sentence: str
) -> None:
    with pytest.raises(SlurmError) as e:
        jobopts.submit_fields(command, {option: "x"}, {}, "/")
    assert str(e.value).startswith(f"{command}: error: {sentence}")


def test_options_mgpu_ignores_are_said_in_a_warning(tmp_path: Path) -> None:
    b = Batch(["--gres-flags=enforce-binding", "--wait-all-nodes=1", "--wrap=x"], {}, "/")
    assert b.warnings == ["ignored: --gres-flags --wait-all-nodes"]


def test_input_variables_of_slurms_table(tmp_path: Path) -> None:
    env = {"SBATCH_OUTPUT": "o-%j.txt", "SBATCH_GPUS_PER_TASK": "1", "SALLOC_PARTITION": "x"}
    b = Batch(["--wrap=x"], env, "/")
    assert (b.slurm["output"], b.slurm["gpus_per_task"], b.slurm["partition"]) == (
        "o-%j.txt",
        1,
        None,  # salloc's variable: not sbatch's
    )
    assert optable.variables("salloc")["SALLOC_PARTITION"] == "partition"
    assert "SLURM_NTASKS" in optable.variables("srun")  # declared, not read by mgpu's srun


def test_srun_refuses_inside_a_job_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGPU_JOB_ID", "7")
    with pytest.raises(SlurmError) as e:
        srun.main(["--multi-prog", "-n2", "tasks.conf"])
    assert str(e.value).startswith("srun: error: --multi-prog is not supported by mgpu")
