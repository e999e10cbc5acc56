"""sbatch's options: Slurm's syntax, where each comes from (#SBATCH < SBATCH_* < the
command line), what each asks of mgpu, and Slurm's sentences for bad input."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from mgpu.slurm import jobopts, optable, opts
from mgpu.slurm.common import SlurmError
from mgpu.slurm.sbatch import Batch

SCRIPT = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH -N 2
#SBATCH --gres=gpu:a100:2  # per node
#SBATCH --ntasks-per-node=2 --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH -o logs/%x-%j.out
#SBATCH --time=1-00:00:00
#SBATCH --account=lab
srun python train.py
#SBATCH --partition=never-read
"""


def batch(tmp_path: Path, argv: list[str], script: str = SCRIPT, env: Any = None) -> Batch:
    path = tmp_path / "train.sh"
    path.write_text(script)
    return Batch([*argv, str(path), "arg1", "--lr=1"], env or {}, str(tmp_path))


def test_the_scripts_directives(tmp_path: Path) -> None:
    b = batch(tmp_path, [])
    assert b.fields == {
        "nodes": 2,
        "gpus_per_node": 2,
        "gpu_type": "a100",
        "name": "train",
        "time": "1-00:00:00",
        "cwd": str(tmp_path),
    }
    assert b.args == ["arg1", "--lr=1"]
    assert b.script_name == "train.sh"
    slurm = {k: v for k, v in b.slurm.items() if k != "submit_host"}
    assert slurm == {
        "batch": True,
        "job_name_default": "train.sh",
        "ntasks": None,
        "ntasks_per_node": 2,
        "cpus_per_task": 4,
        "mem_per_node_mb": 16384,
        "mem_per_cpu_mb": None,
        "gpus_per_task": None,
        "partition": None,  # the line after the script's first command is not read
        "output": "logs/%x-%j.out",
        "error": None,
        "open_mode": "truncate",
        "submit_dir": str(tmp_path),
        "script_path": str(tmp_path / "train.sh"),  # as sbatch found it (Command)
    }
    # CPUs and memory are scheduled: only the ignored options are warned of.
    assert b.warnings == ["ignored: --account"]


def test_the_command_line_beats_the_environment_beats_the_script(tmp_path: Path) -> None:
    env = {"SBATCH_JOB_NAME": "from-env", "SBATCH_TIMELIMIT": "30", "SBATCH_PARTITION": "gpu"}
    b = batch(tmp_path, ["-J", "from-cli"], env=env)
    assert (b.fields["name"], b.fields["time"], b.slurm["partition"]) == ("from-cli", "30", "gpu")
    # A GPU request replaces the one below it whole: no a100 type left from --gres.
    b = batch(tmp_path, ["--gpus-per-node=1"])
    assert (b.fields["gpus_per_node"], "gpu_type" in b.fields) == (1, False)
    b = batch(tmp_path, ["-N1"])
    assert (b.fields["gpus"], b.fields["gpu_type"], "nodes" in b.fields) == (2, "a100", False)


def test_a_later_line_beats_an_earlier_one(tmp_path: Path) -> None:
    b = batch(
        tmp_path,
        [],
        "#!/bin/sh\n#SBATCH -t 10\n#SBATCH --time=20\n#SBATCH --requeue\n"
        "#SBATCH --no-requeue\ntrue\n",
    )
    assert (b.fields["time"], b.fields["retries"]) == ("20", 0)
    b = batch(tmp_path, ["--requeue"], "#!/bin/sh\n#SBATCH --no-requeue\ntrue\n")
    assert "retries" not in b.fields


def test_no_gpu_option_means_no_gpu(tmp_path: Path) -> None:
    b = batch(tmp_path, [], "#!/bin/sh\ntrue\n")
    assert b.fields == {"gpus": 0, "cwd": str(tmp_path)}
    b = batch(tmp_path, ["-N", "3"], "#!/bin/sh\ntrue\n")
    assert (b.fields["nodes"], b.fields["gpus_per_node"]) == (3, 0)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpus=4"], {"gpus": 4}),
        (["-G", "a100:2"], {"gpus": 2, "gpu_type": "a100"}),
        (["--gres=gpu"], {"gpus": 1}),
        (["--gres=gpu:3"], {"gpus": 3}),
        (["--gres=gpu:h100:8,shard:2"], {"gpus": 8, "gpu_type": "h100"}),
        (["-N2", "--gpus=8"], {"nodes": 2, "gpus_per_node": 4}),
        (["-N2", "--gpus-per-node=4"], {"nodes": 2, "gpus_per_node": 4}),
        (["-N", "2-4", "--gres=gpu:1"], {"nodes": 2, "gpus_per_node": 1}),
        (["-n4", "--gpus-per-task=1"], {"gpus": 4}),
        (["-N2", "--ntasks-per-node=4", "--gpus-per-task=1"], {"nodes": 2, "gpus_per_node": 4}),
        (["-N2", "-n3", "--gpus-per-task=2"], {"nodes": 2, "gpus_per_node": 4}),
    ],
)
def test_gpu_requests(argv: list[str], expected: dict[str, Any]) -> None:
    values = dict(opts.parse("sbatch", argv, jobopts.JOB_OPTIONS)[0])
    ignored: list[str] = []
    got = jobopts.gpu_request("sbatch", values, ignored)
    assert {k: v for k, v in got.items() if v is not None} == expected


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["-a", "0-9%2"], "array", "0-9%2"),
        (["--array=1,3,5"], "array", "1,3,5"),
        (["-H"], "hold", True),
        (["--hold"], "hold", True),
        (["--signal=B:USR1@90"], "signal", "B:USR1@90"),
        (["-w", "node[1-2]"], "nodelist", "node[1-2]"),
        (["--exclude=node3"], "exclude", "node3"),
        (["--reservation=maint"], "reservation", "maint"),
        (["--priority=5"], "priority", 5),
        (["-t", "2-12"], "time", "2-12"),
        (["--no-requeue"], "retries", 0),
        (["-D", "sub"], "cwd", "{tmp}/sub"),
        (["--chdir=/abs"], "cwd", "/abs"),
        (["--export=NONE"], "env", {}),
        (["--export=A,B=2"], "env", {"A": "1", "B": "2"}),
    ],
)
def test_each_option_reaches_its_field(
    tmp_path: Path, argv: list[str], field: str, value: Any
) -> None:
    values = dict(opts.parse("sbatch", argv, jobopts.JOB_OPTIONS)[0])
    fields, _, _ = jobopts.submit_fields("sbatch", values, {"A": "1", "C": "3"}, str(tmp_path))
    if isinstance(value, str):
        value = value.format(tmp=tmp_path)
    assert fields[field] == value


def test_export_all_with_extra_variables() -> None:
    env = jobopts.export_env("sbatch", "ALL,EXTRA=1", {"HOME": "/h"})
    assert env == {"HOME": "/h", "EXTRA": "1"}
    assert jobopts.export_env("sbatch", "ALL", {"HOME": "/h"}) is None  # the client's default


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["-n", "8"], "ntasks", 8),
        (["--ntasks-per-node=4"], "ntasks_per_node", 4),
        (["-c2"], "cpus_per_task", 2),
        (["--mem=500M"], "mem_per_node_mb", 500),
        (["--mem=2000"], "mem_per_node_mb", 2000),
        (["--mem=1T"], "mem_per_node_mb", 1024 * 1024),
        (["--mem-per-cpu=4G"], "mem_per_cpu_mb", 4096),
        (["--gpus-per-task=a100:2"], "gpus_per_task", 2),
        (["-p", "debug"], "partition", "debug"),
        (["-o", "out-%A_%a.log"], "output", "out-%A_%a.log"),
        (["-e", "err.log"], "error", "err.log"),
        (["--open-mode=append"], "open_mode", "append"),
    ],
)
def test_each_option_reaches_the_slurm_block(argv: list[str], key: str, value: Any) -> None:
    values = dict(opts.parse("sbatch", argv, jobopts.JOB_OPTIONS)[0])
    _, block, _ = jobopts.submit_fields("sbatch", values, {}, "/")
    assert block[key] == value


def test_behaviour_options(tmp_path: Path) -> None:
    b = batch(tmp_path, ["--parsable", "-Q", "-W", "--mail-user=a@b.c", "--mail-type=END"])
    assert (b.parsable, b.quiet, b.wait, b.mail) == (True, True, True, "a@b.c")
    b = batch(tmp_path, ["--mail-user=a@b.c", "--mail-type=NONE"])
    assert b.mail is None
    b = batch(tmp_path, ["--mail-type=ALL"])
    assert b.mail == ""  # the submitting user


def test_wrap_and_stdin(tmp_path: Path) -> None:
    b = Batch(["--wrap", "echo hi; hostname"], {}, str(tmp_path))
    assert b.script.startswith("#!/bin/sh\n") and b.script.endswith("echo hi; hostname\n")
    assert (b.script_name, b.slurm["job_name_default"], b.args) == ("wrap", "wrap", [])
    stdin = io.BytesIO(b"#!/bin/bash\n#SBATCH -J piped\necho $1\n")
    b = Batch(["-t", "5"], {}, str(tmp_path), stdin=stdin)
    assert (b.fields["name"], b.fields["time"], b.slurm["job_name_default"]) == (
        "piped",
        "5",
        "sbatch",
    )


def test_getopt_syntax() -> None:
    table = jobopts.JOB_OPTIONS
    found, rest = opts.parse(
        "sbatch",
        ["-N2", "-n", "4", "--job-name", "x", "--parti=gpu", "-HJy", "script.sh", "-N", "9"],
        table,
        in_order=True,
    )
    assert found == [
        ("nodes", "2"),
        ("ntasks", "4"),
        ("job-name", "x"),
        ("partition", "gpu"),
        ("hold", ""),
        ("job-name", "y"),
    ]
    assert rest == ["script.sh", "-N", "9"]  # the script's own arguments
    found, rest = opts.parse("squeue", ["a", "-h", "--", "-x"], opts.table("noheader/h"))
    assert (found, rest) == ([("noheader", "")], ["a", "-x"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "sbatch: unrecognized option '--bogus'"),
        (["-y"], "sbatch: invalid option -- 'y'"),
        (["--time"], "sbatch: option '--time' requires an argument"),
        (["--hold=1"], "sbatch: option '--hold' doesn't allow an argument"),
        (["--mem-"], "sbatch: option '--mem-' is ambiguous"),
        (
            ["--wrap", "x", "s.sh"],
            "sbatch: error: Script arguments not permitted with --wrap option",
        ),
        (["--open-mode=x", "--wrap=x"], "sbatch: error: Invalid --open-mode specification"),
        (["--mem=lots", "--wrap=x"], "sbatch: error: Invalid --mem specification"),
        (["-N", "zero", "--wrap=x"], 'sbatch: error: "zero" is not a valid node count'),
        (["--gpus=x", "--wrap=x"], "sbatch: error: Invalid --gpus specification: x"),
        (
            ["--gres=gpu:a:b:c", "--wrap=x"],
            "sbatch: error: Invalid generic resource (gres) specification: gpu:a:b:c",
        ),
        (
            ["-N2", "--gpus=3", "--wrap=x"],
            "sbatch: error: --gpus=3 cannot be shared evenly by 2 nodes: mgpu gives every node of "
            "a job the same GPUs (use --gpus-per-node)",
        ),
        (["--test-only", "--wrap=x"], "sbatch: error: --test-only is not supported by mgpu"),
        (
            ["/nonexistent/job.sh"],
            "sbatch: error: Unable to open file /nonexistent/job.sh: No such file or directory",
        ),
    ],
)
def test_bad_input_is_slurms_sentence(argv: list[str], message: str) -> None:
    with pytest.raises(SlurmError) as e:
        Batch(argv, {}, "/")
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("", "sbatch: error: Batch script is empty!"),
        ("\n \n", "sbatch: error: Batch script contains only whitespace!"),
        ("echo hi\n", "sbatch: error: This does not look like a batch script.  The first"),
        ("#!/bin/sh\r\necho\r\n", "sbatch: error: Batch script contains DOS line breaks (\\r\\n)"),
        ("#!/bin/sh\n#SBATCH --nope\n", "sbatch: unrecognized option '--nope'"),
        (
            "#!/bin/sh\n#SBATCH -J 'open\n",
            "sbatch: error: batch script line 2: #SBATCH -J 'open: No closing quotation",
        ),
        (
            "#!/bin/sh\n#SBATCH stray\n",
            "sbatch: error: Invalid directive found in batch script: #SBATCH stray",
        ),
    ],
)
def test_bad_scripts(tmp_path: Path, script: str, message: str) -> None:
    with pytest.raises(SlurmError) as e:
        batch(tmp_path, [], script)
    assert str(e.value).splitlines()[0] == message


@pytest.mark.parametrize(
    ("text", "singleton", "expected"),
    [
        ("afterok:12:13", [], "afterok:12:13"),
        ("afterany:12,afternotok:14_3", [], "afterany:12,afternotok:14_3"),
        ("singleton", ["7", "9"], "afterany:7:9"),
        ("singleton", [], None),
        ("afterok:5,singleton", ["7"], "afterok:5,afterany:7"),
    ],
)
def test_dependencies(text: str, singleton: list[str], expected: str | None) -> None:
    assert jobopts.dependency("sbatch", text, singleton) == expected


@pytest.mark.parametrize(
    "text",
    ["after:12", "aftercorr:12", "afterok:12+5", "afterok:1?afterany:2", "expand:3", "afterok"],
)
def test_dependencies_mgpu_lacks_are_refused(text: str) -> None:
    with pytest.raises(SlurmError) as e:
        jobopts.dependency("sbatch", text, [])
    assert str(e.value).startswith(
        "sbatch: error: Batch job submission failed: Job dependency problem"
    )


def test_every_input_variable_names_an_option_and_short_letters_are_unique() -> None:
    for command in optable.COMMANDS:
        longs = {o.long for o in optable.options(command)}
        assert set(optable.variables(command).values()) <= longs, command
        shorts = [o.short for o in optable.options(command) if o.short]
        assert len(shorts) == len(set(shorts)), command
