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
from mgpu.spec import SpecError

KNOWN = _directive_parser()[1]

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

SBATCH = [
    (["-J", "train"], ["--name", "train"]),
    (["--job-name=train"], ["--name", "train"]),
    (["-Jtrain"], ["--name", "train"]),
    (["-t", "1:00:00"], ["--time", "1:00:00"]),
    (["--time=90"], ["--time", "90"]),
    (["-N2"], ["--nodes", "2"]),
    (["--nodes=2"], ["--nodes", "2"]),
    (["-w", "node[1-2]"], ["--nodelist", "node[1-2]"]),
    (["-x", "node3"], ["--exclude", "node3"]),
    (["-d", "afterok:a1b2c3d4"], ["--dependency", "afterok:a1b2c3d4"]),
    (["--array=0-9%2"], ["--array", "0-9%2"]),
    (["-H"], ["--hold"]),
    (["--gpus=a100:4"], ["--gpu-type", "a100", "--gpus", "4"]),
    (["-G", "2"], ["--gpus", "2"]),
    (["--gpus-per-node=2"], ["--gpus-per-node", "2"]),
    (["--signal=B:USR1@30"], ["--signal", "B:USR1@30"]),
    (["--mail-user=a@example.org"], ["--notify", "mailto:a@example.org"]),
    (["--preemptible", "--priority", "5"], ["--preemptible", "--priority", "5"]),
]


@pytest.mark.parametrize(("words", "mgpu"), SBATCH, ids=[" ".join(w) for w, _ in SBATCH])
def test_sbatch_options_become_mgpu_options(words: list[str], mgpu: list[str]) -> None:
    out = directives.translate_sbatch(words, KNOWN)
    assert (out.words, out.ignored) == (mgpu, [])


GRES = [
    ("gpu:2", [], 2),
    ("gpu", [], 1),
    ("gpu:a100:4", ["--gpu-type", "a100"], 4),
    ("gpu:a100", ["--gpu-type", "a100"], 1),
]


@pytest.mark.parametrize(("gres", "words", "count"), GRES)
def test_gres_is_a_gpu_count_per_node(gres: str, words: list[str], count: int) -> None:
    out = directives.translate_sbatch([f"--gres={gres}"], KNOWN)
    assert (out.words, out.gres_per_node, out.ignored) == (words, count, [])


def test_options_mgpu_lacks_are_collected_with_their_values_skipped() -> None:
    words = ["--ntasks=4", "-c", "8", "--mem", "16G", "--exclusive", "-o", "out.%j", "-t", "5"]
    out = directives.translate_sbatch(words, KNOWN)
    assert out.ignored == ["--ntasks", "-c", "--mem", "--exclusive", "-o"]
    assert out.words == ["--time", "5"]  # --exclusive takes no value: -o's is skipped


def test_other_gres_and_mail_type_none() -> None:
    out = directives.translate_sbatch(["--gres=gpu:1,nvme:2", "--mail-type=NONE"], KNOWN)
    assert (out.gres_per_node, out.ignored, out.no_mail) == (1, ["--gres=nvme:2"], True)


@pytest.mark.parametrize(
    ("gres", "words", "ignored"),
    [
        ("mps:25", ["--gpu-share", "0.25"], []),
        ("mps:5", ["--gpu-share", "0.05"], []),
        ("mps:100", [], ["--gres=mps:100"]),  # a whole GPU's MPS: not a share mgpu knows
        ("mps:0", [], ["--gres=mps:0"]),
        ("mps", [], ["--gres=mps"]),
    ],
)
def test_gres_mps_is_a_share_of_one_gpu(gres: str, words: list[str], ignored: list[str]) -> None:
    out = directives.translate_sbatch([f"--gres={gres}"], KNOWN)
    assert (out.words, out.gres_per_node, out.ignored) == (words, None, ignored)


def test_a_script_asking_for_mps_gets_a_gpu_share() -> None:
    assert options("#SBATCH --gres=mps:50\n")[0] == {"gpu_share": 0.5}


# ---- the script and the command line -------------------------------------------------


def given(*argv: str) -> dict[str, Any]:
    """The job options the command line gives, as cli.job_options reads them."""
    return job_options(build_parser().parse_args(["submit", *argv, "job.sh"]))


def options(text: str, *argv: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    return script_options("dir/job.sh", text, given(*argv))


def test_the_command_line_beats_mgpu_lines_which_beat_sbatch_lines() -> None:
    text = (
        "#!/bin/sh\n"
        "#SBATCH -J from-sbatch -t 10 --priority 1\n"
        "#MGPU --name from-mgpu --priority 2\n"
        "#MGPU --priority 3\n"  # a later line of the same kind wins
    )
    opts, sources, warnings = options(text, "--time", "20")
    assert opts == {"name": "from-mgpu", "time": "20", "priority": 3}
    assert sources == {"name": "#MGPU", "time": "command line", "priority": "#MGPU"}
    assert warnings == []


def test_the_gpu_request_is_replaced_whole() -> None:
    text = "#!/bin/sh\n#SBATCH --gres=gpu:2\n#MGPU --gpu-ids 0,1\n"
    assert options(text)[0] == {"gpu_ids": "0,1"}
    assert options(text, "--gpus", "4")[0] == {"gpus": 4}  # no clash with --gpu-ids
    opts, sources, _ = options("#SBATCH --gpus-per-node 2\n", "--gpus", "1")
    assert (opts, sources) == ({"gpus": 1}, {"gpus": "command line"})


def test_gres_counts_per_node_when_the_job_spans_nodes() -> None:
    assert options("#SBATCH --gres=gpu:4\n")[0] == {"gpus": 4}
    opts, sources, _ = options("#SBATCH -N 2 --gres=gpu:4\n")
    assert opts == {"nodes": 2, "gpus_per_node": 4}
    assert sources == {"nodes": "#SBATCH", "gpus_per_node": "#SBATCH"}
    assert options("#SBATCH --gres=gpu:4\n", "--nodes", "3")[0] == {"nodes": 3, "gpus_per_node": 4}


def test_what_mgpu_lacks_is_named_in_one_warning_line() -> None:
    text = "#SBATCH --mem=4G -n 4\n#SBATCH --output=o.txt --mem 8G\n#SBATCH -t 5\n"
    opts, _, warnings = options(text)
    assert opts == {"time": "5"}
    assert warnings == [
        "job.sh: #SBATCH options mgpu does not have, ignored: --mem, -n, --output "
        "(mgpu keeps the job's output itself: mgpu logs JOB)"
    ]


def test_mail_type_none_keeps_the_mail_user_from_sending() -> None:
    text = "#SBATCH --mail-user=a@example.org --mail-type=NONE\n"
    assert options(text)[0] == {}
    assert options("#SBATCH --mail-user=a@example.org\n")[0] == {"notify": "mailto:a@example.org"}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("#MGPU --gpus two", "dir/job.sh line 1: #MGPU --gpus two: argument --gpus: invalid int"),
        ("#MGPU --no-such-option", "dir/job.sh line 1: #MGPU --no-such-option: unrecognized"),
        ("#SBATCH -N 2-4", "dir/job.sh line 1: #SBATCH -N 2-4: argument --nodes/-N: invalid int"),
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
