"""Job scripts' directives: which lines count, Slurm's options in mgpu's words, and the
order in which the script and the command line decide (mgpu.client.directives and
mgpu.client.cmd_jobctl.script_options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mgpu.client import directives
from mgpu.client.cli import UsageError, build_parser, job_options
from mgpu.client.cmd_jobctl import _directive_parser, read_script, script_options
from mgpu.signalspec import format_signal, parse_signal
from mgpu.slurm.mgpusubmit import slurm_batch
from mgpu.spec import SpecError

KNOWN = {opt: a.nargs != 0 for a in _directive_parser()._actions for opt in a.option_strings}

# ---- which lines are directives -----------------------------------------------------


def test_directives_are_read_from_the_leading_comment_block_only() -> None:
    text = (
        "#!/bin/bash\n"
        "\n"
        "#SBATCH --time=10 # a comment after it\n"
        "# just a comment\n"
        "#MGPU --gpus 2\n"
        " #SBATCH --ignored-indented\n"
        "#SBATCHX --not-a-directive\n"
        "#MGPU\n"
        "echo hi\n"
        "#SBATCH --after-the-first-command\n"
    )
    found = directives.scan(text)
    assert found.error is None
    assert [(d.source, d.line, d.words) for d in found.directives] == [
        ("#SBATCH", 3, ["--time=10"]),
        ("#MGPU", 5, ["--gpus", "2"]),
        ("#MGPU", 8, []),
    ]


def test_an_unclosed_quote_is_named_with_its_line() -> None:
    found = directives.scan('#!/bin/sh\n#MGPU --name "oops\n')
    assert found.error is not None and found.error.startswith("line 2: #MGPU --name")


# ---- Slurm's options in mgpu's words -----------------------------------------------


def test_a_script_asking_for_mps_gets_a_gpu_share() -> None:
    assert batch("#SBATCH --gres=mps:50\n")[0]["gpu_share"] == 0.5


# ---- the script and the command line -------------------------------------------------


def given(*argv: str) -> dict[str, Any]:
    """The job options the command line gives, as cli.job_options reads them."""
    return job_options(build_parser().parse_args(["submit", *argv, "job.sh"]))


def options(text: str, *argv: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    return script_options("dir/job.sh", text, given(*argv))


def batch(text: str, *argv: str) -> tuple[dict[str, Any], dict[str, str], Any]:
    """What `mgpu submit [argv] dir/job.sh` of a script with #SBATCH lines sends: (its
    submit fields, where each came from, sbatch's Batch)."""
    b, sources = slurm_batch("dir/job.sh", text, ["arg"], given(*argv))
    return b.fields, sources, b


def test_sbatch_lines_make_a_slurm_batch_job() -> None:
    text = "#!/bin/sh\n#SBATCH -n 4 --output=o-%j.txt --mem=8G\n#SBATCH -t 5\n"
    fields, sources, b = batch(text)
    assert (fields["gpus"], fields["time"]) == (0, "5")  # no GPU unless asked, as Slurm
    assert b.slurm["batch"] and b.slurm["job_name_default"] == "job.sh"
    assert (b.slurm["ntasks"], b.slurm["output"], b.slurm["mem_per_node_mb"]) == (
        4,
        "o-%j.txt",
        8192,
    )
    assert b.args == ["arg"] and b.script == text
    assert sources == {"time": "#SBATCH"}
    assert b.warnings == []  # --mem is scheduled: no warning
    assert "slurm" not in script_options("dir/job.sh", "#MGPU --gpus 2\n", {})[0]


def test_the_command_line_beats_mgpu_lines_which_beat_sbatch_lines() -> None:
    text = (
        "#!/bin/sh\n"
        "#SBATCH -J from-sbatch -t 10 --priority 1\n"
        "#MGPU --name from-mgpu --priority 2\n"
        "#MGPU --priority 3\n"  # a later line of the same kind wins
    )
    fields, sources, _ = batch(text, "--time", "20")
    assert (fields["name"], fields["time"], fields["priority"]) == ("from-mgpu", "20", 3)
    assert sources == {"name": "#MGPU", "time": "command line", "priority": "#MGPU"}


def test_the_gpu_request_is_replaced_whole() -> None:
    text = "#!/bin/sh\n#SBATCH --gres=gpu:2\n#MGPU --gpu-ids 0,1\n"
    fields, sources, _ = batch(text)
    assert (fields["gpu_ids"], "gpus" in fields, sources["gpu_ids"]) == ("0,1", False, "#MGPU")
    fields, sources, _ = batch(text, "--gpus", "4")
    assert (fields["gpus"], "gpu_ids" in fields, sources["gpus"]) == (4, False, "command line")
    fields, sources, _ = batch("#SBATCH -N 2 --gpus-per-node 2\n", "--gpus", "1", "--nodes", "1")
    assert (fields["gpus"], fields["nodes"], "gpus_per_node" in fields) == (1, 1, False)


def test_gres_counts_per_node_when_the_job_spans_nodes() -> None:
    assert batch("#SBATCH --gres=gpu:4\n")[0]["gpus"] == 4
    fields, sources, _ = batch("#SBATCH -N 2 --gres=gpu:4\n")
    assert (fields["nodes"], fields["gpus_per_node"]) == (2, 4)
    assert sources == {"nodes": "#SBATCH", "gpus_per_node": "#SBATCH"}


def test_mail_type_none_keeps_the_mail_user_from_sending() -> None:
    assert batch("#SBATCH --mail-user=a@example.org --mail-type=NONE\n")[2].mail is None
    assert batch("#SBATCH --mail-user=a@example.org\n")[2].mail == "a@example.org"
    assert batch("#SBATCH --mail-user=a@b.org\n", "--notify", "mailto:c@d.org")[2].mail is None


def test_a_bad_sbatch_line_is_one_sentence_naming_the_script() -> None:
    with pytest.raises(UsageError) as e:
        batch("#SBATCH --bogus\n")
    assert str(e.value) == "dir/job.sh: unrecognized option '--bogus'"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("#MGPU --gpus two", "dir/job.sh line 1: #MGPU --gpus two: argument --gpus: invalid int"),
        ("#MGPU --no-such-option", "dir/job.sh line 1: #MGPU --no-such-option: unrecognized"),
    ],
)
def test_a_directive_that_is_not_understood_names_its_line(line: str, error: str) -> None:
    with pytest.raises(UsageError) as e:
        options(f"{line}\n")
    assert str(e.value).startswith(error)
    assert "\n" not in str(e.value)


def test_read_script_tells_scripts_from_programs(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    assert read_script(str(script)) == "#!/bin/sh\necho hi\n"
    program = tmp_path / "a.out"
    program.write_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64)
    assert read_script(str(program)) is None  # run as a command, as before
    latin1 = tmp_path / "old.sh"
    latin1.write_bytes(b"#!/bin/sh\necho caf\xe9\n")
    with pytest.raises(UsageError, match=r"old.sh is not UTF-8 text \(byte 19\)"):
        read_script(str(latin1))
    big = tmp_path / "big.sh"
    big.write_text("#" * ((1 << 20) + 1))
    with pytest.raises(UsageError, match="is over 1 MiB"):
        read_script(str(big))


# ---- --signal ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown", "number", "seconds", "top"),
    [
        ("USR1@5", "USR1@5", 10, 5, False),
        ("SIGUSR2@30", "USR2@30", 12, 30, False),
        ("B:usr1@60", "B:USR1@60", 10, 60, True),
        ("10", "USR1@60", 10, 60, False),  # Slurm's default lead: 60 s
        ("34@1", "34@1", 34, 1, False),  # a real-time signal keeps its number
    ],
)
def test_signal_specs(text: str, shown: str, number: int, seconds: int, top: bool) -> None:
    sig = parse_signal(text)
    assert (format_signal(sig), sig.number, sig.seconds, sig.batch_only) == (
        shown,
        number,
        seconds,
        top,
    )
    assert parse_signal(format_signal(sig)) == sig


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("KILL@5", "SIGKILL cannot be caught"),
        ("STOP", "SIGSTOP cannot be caught"),
        ("FOO@1", "'FOO' is not a signal name"),
        ("USR1@70000", "70000 s is too long a lead; at most 65535 s"),
        ("X:USR1", "is not a signal spec"),
        ("99@1", "signal number 99 does not exist"),
        ("", "is not a signal spec"),
    ],
)
def test_bad_signal_specs_are_one_sentence(text: str, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse_signal(text)
