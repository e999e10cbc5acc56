"""Table-driven tests of the job option parsers in mgpu.spec."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu.execspec import (
    MAX_ARG_BYTES,
    MAX_ARGV_BYTES,
    MAX_ARGV_ITEMS,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRY_BYTES,
    MAX_ENV_VARS,
    is_env_name,
    is_reserved_env_name,
    validate_argv,
    validate_cwd,
    validate_env,
    validate_image,
)
from mgpu.spec import (
    FIRST_JOB_ID,
    MAX_ARRAY_TASKS,
    MAX_COMMAND_BYTES,
    ArraySpec,
    Dependency,
    SpecError,
    array_task_id,
    format_array,
    format_job_id,
    format_time_limit,
    is_job_id,
    is_task_id,
    job_number,
    may_be_array_id,
    parse_array,
    parse_dependency,
    parse_gpu_count,
    parse_gpu_ids,
    parse_int_option,
    parse_node_count,
    parse_node_gpu_ids,
    parse_node_list,
    parse_time_limit,
    split_array_task_id,
    text_problem,
    validate_command,
    validate_job_id,
    validate_job_name,
    validate_node_id,
    validate_text,
)


def check_message(exc: pytest.ExceptionInfo[SpecError], *fragments: str) -> None:
    """Every error is one line, one sentence, names the problem, and is a ValueError."""
    msg = str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert "\n" not in msg
    assert "Traceback" not in msg
    assert msg.strip() == msg and msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


# --------------------------------------------------------------------------- --time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),
        ("1", 60),
        (" 10 ", 600),
        ("0.5", 30),
        ("1.25", 75),
        ("0:30", 30),
        ("5:00", 300),
        ("90:00", 5400),  # minutes are not capped in MM:SS
        ("00:00:01", 1),
        ("1:00:00", 3600),
        ("48:00:00", 48 * 3600),
        ("1-0", 86400),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-2:03", 86400 + 2 * 3600 + 3 * 60),
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
        ("0-0:0:1", 1),
        ("0-00:30", 1800),
    ],
)
def test_time_limit_ok(text: str, seconds: float) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "unlimited", "Infinite", "infinite", " inf "])
def test_time_limit_unlimited(text: str) -> None:
    assert parse_time_limit(text) == math.inf


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty", "MM:SS")),
        ("   ", ("empty",)),
        ("0", ("'0'", "zero", "UNLIMITED")),
        ("0:00", ("'0:00'", "zero")),
        ("0-0", ("zero",)),
        ("-5", ("'-5'", "negative")),
        ("-1:00", ("negative",)),
        ("abc", ("'abc'", "not understood", "HH:MM:SS")),
        ("1h", ("'1h'", "not understood")),
        ("1:2:3:4", ("'1:2:3:4'", "not understood")),
        ("1-2:3:4:5", ("not understood",)),
        ("1:", ("not understood",)),
        (":30", ("not understood",)),
        ("1-", ("not understood",)),
        ("1.5:00", ("not understood",)),
        ("1:60", ("60 seconds", "0-59")),
        ("1:60:00", ("60 minutes", "0-59")),
        ("1:00:75", ("75 seconds",)),
        ("1-24", ("24 hours", "0-23")),
        ("1-2:60", ("60 minutes",)),
        ("1e3", ("not understood",)),
        ("١٢", ("not understood",)),  # non-ASCII digits are not accepted
    ],
)
def test_time_limit_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_time_limit(text)
    check_message(exc, *fragments)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "00:00:30"),
        (5400, "01:30:00"),
        (90061, "1-01:01:01"),
        (0.2, "00:00:01"),
        (math.inf, "UNLIMITED"),
        (None, "UNLIMITED"),
    ],
)
def test_format_time_limit(seconds: float | None, text: str) -> None:
    assert format_time_limit(seconds) == text


@pytest.mark.parametrize("text", ["30", "0:45", "2:03:04", "3-04:05:06", "1-0"])
def test_format_time_limit_round_trips(text: str) -> None:
    seconds = parse_time_limit(text)
    assert parse_time_limit(format_time_limit(seconds)) == seconds


# --------------------------------------------------------------------------- integers


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (1, 1), ("8", 8), (" 2 ", 2), ("+3", 3), (65536, 65536)],
)
def test_gpu_count_ok(value: int | str, expected: int) -> None:
    assert parse_gpu_count(value) == expected


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (-1, ("--gpus", "negative", "-1")),
        ("-2", ("negative",)),
        ("x", ("--gpus", "whole number", "'x'")),
        ("1.5", ("whole number", "'1.5'")),
        ("", ("whole number",)),
        (True, ("whole number", "True")),
        (10**9, ("at most 65536",)),
    ],
)
def test_gpu_count_errors(value: Any, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_gpu_count(value)
    check_message(exc, *fragments)


def test_node_count_and_int_option() -> None:
    assert parse_node_count("4") == 4
    with pytest.raises(SpecError, match=r"--nodes must be at least 1 \(got 0\)"):
        parse_node_count(0)
    assert parse_int_option("-5", "--priority", minimum=-100, maximum=100) == -5
    with pytest.raises(SpecError, match="--retries must not be negative"):
        parse_int_option(-1, "--retries")
    with pytest.raises(SpecError, match=r"--priority must be at most 100 \(got 101\)"):
        parse_int_option(101, "--priority", minimum=-100, maximum=100)


# --------------------------------------------------------------------------- --gpu-ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", (0,)),
        ("0,1,3", (0, 1, 3)),
        ("3,1,0", (0, 1, 3)),
        ("1,1,1", (1,)),
        ("0-3", (0, 1, 2, 3)),
        ("2-2", (2,)),
        ("0-1,4,6-7", (0, 1, 4, 6, 7)),
        ("0-3,2", (0, 1, 2, 3)),
        (" 0 , 1 ", (0, 1)),
        ("0 - 2", (0, 1, 2)),
        ("007", (7,)),
        ("1023", (1023,)),
    ],
)
def test_gpu_ids_ok(text: str, expected: tuple[int, ...]) -> None:
    assert parse_gpu_ids(text) == expected


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty",)),
        ("  ", ("empty",)),
        ("a", ("'a'", "whole number")),
        ("0,x", ("'x'",)),
        ("1.5", ("'1.5'",)),
        ("-1", ("'-1'", "negative")),
        ("0,-1", ("negative",)),
        ("3-1", ("'3-1'", "backwards")),
        ("0,,1", ("empty entry", "'0,,1'")),
        ("0,", ("empty entry",)),
        ("1024", ("1024", "too large", "1023")),
        ("0-99999", ("too large",)),
        ("0-", ("'0-'",)),
        ("gpu0", ("'gpu0'",)),
    ],
)
def test_gpu_ids_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_gpu_ids(text)
    check_message(exc, *fragments)


# --------------------------------------------------------------------------- node ids


@pytest.mark.parametrize(
    "text",
    ["node001", "a", "gpu-01.cluster", "x_y", "_hidden", "N0DE", "a" * 64, "10.0.0.5"],
)
def test_node_id_ok(text: str) -> None:
    assert validate_node_id(text) == text


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty",)),
        ("a" * 65, ("65 characters", "at most 64")),
        (".hidden", ("'.hidden'", "not starting with '.'")),
        ("-x", ("'-x'",)),
        ("a b", ("'a b'", "letters, digits")),
        ("a/b", ("'a/b'",)),
        ("a:b", ("'a:b'",)),
        ("nöde", ("'nöde'",)),
        ("a\nb", ("'a\\nb'",)),
    ],
)
def test_node_id_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_node_id(text)
    check_message(exc, *fragments)


# --------------------------------------------------------------------------- --node-gpu-ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node001:0,1;node002:0", (("node001", (0, 1)), ("node002", (0,)))),
        ("node002:0;node001:1", (("node002", (0,)), ("node001", (1,)))),  # order kept
        (" node001 : 0 , 1 ; node002 : 3 ", (("node001", (0, 1)), ("node002", (3,)))),
        ("a:0-3;", (("a", (0, 1, 2, 3)),)),
        ("a:1,0,1", (("a", (0, 1)),)),
        ("a:0;;b:1", (("a", (0,)), ("b", (1,)))),
    ],
)
def test_node_gpu_ids_ok(text: str, expected: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
    assert parse_node_gpu_ids(text) == expected


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty", "node001:0,1;node002:0")),
        (";", ("names no node",)),
        ("node001", ("'node001'", "no GPU list")),
        ("node001:", ("'node001'", "no GPU list")),
        ("node001: ;node002:0", ("'node001'", "no GPU list")),
        ("a:0;b", ("'b'", "no GPU list")),
        (":0", ("empty",)),
        ("a:0;a:1", ("'a'", "named twice")),
        (".a:0", ("'.a'", "not valid")),
        ("a:x", ("'a:x'", "'x'", "whole number")),
        ("a:1-0", ("backwards",)),
        ("a:0:1", ("'0:1'",)),
    ],
)
def test_node_gpu_ids_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_node_gpu_ids(text)
    check_message(exc, *fragments)


# --------------------------------------------------------------------------- node lists


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a", ("a",)),
        ("a,b", ("a", "b")),
        (" a , b ", ("a", "b")),
        ("b,a,b", ("b", "a")),
        ("node[001-003,007]", ("node001", "node002", "node003", "node007")),
        ("node[1-3]", ("node1", "node2", "node3")),
        ("node[8-10]", ("node8", "node9", "node10")),
        ("node[08-10]", ("node08", "node09", "node10")),
        ("node[5]", ("node5",)),
        ("gpu[1-2].lab", ("gpu1.lab", "gpu2.lab")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("a,node[1-2],b", ("a", "node1", "node2", "b")),
        ("node[1-2],node[2-3]", ("node1", "node2", "node3")),
        ("node[ 1-2 , 4 ]", ("node1", "node2", "node4")),
    ],
)
def test_node_list_ok(text: str, expected: tuple[str, ...]) -> None:
    assert parse_node_list(text) == expected


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty",)),
        ("a,,b", ("empty entry",)),
        ("a,", ("empty entry",)),
        ("node[1-3", ("'['", "matching ']'")),
        ("node1-3]", ("']'", "matching '['")),
        ("node[[1]]", ("nested",)),
        ("node[3-1]", ("'3-1'", "backwards")),
        ("node[a-b]", ("'a-b'", "not understood")),
        ("node[]", ("''", "not understood")),
        ("node[1-100000]", ("too long",)),
        ("a[1-200]b[1-200]", ("too many",)),
        ("-bad", ("'-bad'", "not valid")),
        ("a b", ("'a b'",)),
        ("node 1", ("'node 1'",)),
    ],
)
def test_node_list_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_node_list(text)
    check_message(exc, *fragments)


def test_node_list_bare_numbers_are_node_ids() -> None:
    # "[1-2]" alone expands to "1", "2": valid (if odd) node ids.
    assert parse_node_list("[1-2]") == ("1", "2")


# --------------------------------------------------------------------------- --array


@pytest.mark.parametrize(
    ("text", "indices", "max_running"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-99", tuple(range(100)), None),
        ("1,3,5", (1, 3, 5), None),
        ("5,3,5,1", (1, 3, 5), None),
        ("7", (7,), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("1-10:3", (1, 4, 7, 10), None),
        ("0-99%8", tuple(range(100)), 8),
        ("0-3%1", (0, 1, 2, 3), 1),
        ("1,5-7,10-20:5%2", (1, 5, 6, 7, 10, 15, 20), 2),
    ],
)
def test_array_ok(text: str, indices: tuple[int, ...], max_running: int | None) -> None:
    assert parse_array(text) == ArraySpec(indices=indices, max_running=max_running)


def test_array_spaces_around_entries() -> None:
    assert parse_array(" 1 , 3 ") == ArraySpec((1, 3), None)
    assert parse_array("0-1 % 2") == ArraySpec((0, 1), 2)


def test_array_cap() -> None:
    assert len(parse_array(f"0-{MAX_ARRAY_TASKS - 1}").indices) == MAX_ARRAY_TASKS
    with pytest.raises(SpecError, match=f"more than {MAX_ARRAY_TASKS} tasks"):
        parse_array(f"0-{MAX_ARRAY_TASKS}")
    # a big range with a step is fine if the task count is small
    assert parse_array("0-1000000:100000").indices[-1] == 1000000


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty", "0-99%8")),
        ("%4", ("no indices",)),
        ("0-9%", ("'%' limit", "whole number")),
        ("0-9%0", ("'%' limit", "at least 1")),
        ("0-9%x", ("'%' limit",)),
        ("0-9%2%3", ("'%' limit",)),
        ("-1", ("'-1'", "negative")),
        ("9-0", ("'9-0'", "backwards")),
        ("0-15:0", ("step", "at least 1")),
        ("1:2", ("'1:2'", "not understood")),
        ("a-b", ("'a-b'",)),
        ("1,,2", ("''",)),
        ("0-200000", ("more than 100000 tasks",)),
        ("0-99999999", ("too large",)),
        ("0-60000,60000-120000", ("more than 100000 tasks",)),
        ("0 - 2", ("'0 - 2'", "not understood")),  # no spaces inside an entry, as in Slurm
    ],
)
def test_array_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_array(text)
    check_message(exc, *fragments)


# --------------------------------------------------------------------------- --dependency


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("afterok:a1b2c3d4", [("afterok", "a1b2c3d4")]),
        (
            "afterok:a1b2c3d4:e5f6a7b8",
            [("afterok", "a1b2c3d4"), ("afterok", "e5f6a7b8")],
        ),
        ("afterany:00000000", [("afterany", "00000000")]),
        ("afternotok:deadbeef_3", [("afternotok", "deadbeef_3")]),
        ("afterok:deadbeef_0", [("afterok", "deadbeef_0")]),
        (
            "afterok:a1b2c3d4,afterany:e5f6a7b8",
            [("afterok", "a1b2c3d4"), ("afterany", "e5f6a7b8")],
        ),
        ("AfterOK:A1B2C3D4", [("afterok", "a1b2c3d4")]),
        (" afterok : a1b2c3d4 ", [("afterok", "a1b2c3d4")]),
        ("afterok:a1b2c3d4,afterok:a1b2c3d4", [("afterok", "a1b2c3d4")]),
        (
            "afterok:a1b2c3d4,afternotok:a1b2c3d4",
            [("afterok", "a1b2c3d4"), ("afternotok", "a1b2c3d4")],
        ),
    ],
)
def test_dependency_ok(text: str, expected: list[tuple[str, str]]) -> None:
    deps = parse_dependency(text)
    assert [(d.kind, d.job_id) for d in deps] == expected
    assert all(isinstance(d, Dependency) for d in deps)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty", "afterok:")),
        ("afterok", ("'afterok'", "names no job")),
        ("afterok:", ("names no job",)),
        ("afterok::a1b2c3d4", ("empty job id",)),
        ("afterok:a1b2c3d4,", ("empty entry",)),
        ("after:a1b2c3d4", ("'after'", "not supported", "afterok, afterany or afternotok")),
        ("aftercorr:a1b2c3d4", ("'aftercorr'", "not supported")),
        ("singleton", ("'singleton'", "not supported")),
        ("a1b2c3d4", ("'a1b2c3d4'", "not supported")),
        ("afterok:xyz", ("'xyz'", "not a job id", "numbers such as 1234")),
        ("afterok:a1b2c3d", ("'a1b2c3d'", "not a job id")),
        ("afterok:a1b2c3d4e", ("not a job id",)),
        ("afterok:g1b2c3d4", ("not a job id",)),
        ("afterok:a1b2c3d4_", ("not a job id",)),
        ("afterok:a1b2c3d4_x", ("not a job id",)),
        ("afterok:a1b2c3d4_01", ("not a job id",)),
        ("afterok:a1b2c3d4_-1", ("not a job id",)),
        ("afterok:01234", ("'01234'", "not a job id")),
        ("afterok:a1b2c3d4?afterany:e5f6a7b8", ("'?'", "not supported", "','")),
    ],
)
def test_dependency_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_dependency(text)
    check_message(exc, *fragments)


# --------------------------------------------------------------------------- job ids


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("1", True),
        ("1234", True),
        ("1234_0", True),
        ("1234_99999", True),
        ("0", False),
        ("0123", False),
        ("12a", False),
        ("1234_", False),
        ("1234_01", False),
        ("1234.s1", False),
        # ids an older mgpu stored: 8 lowercase hex characters
        ("a1b2c3d4", True),
        ("a1b2c3d4_0", True),
        ("a1b2c3d4_99999", True),
        ("0a1b2c3d", True),
        ("A1B2C3D4", False),
        ("a1b2c3d4_", False),
        ("a1b2c3d4_01", False),
        ("a1b2c3", False),
        ("", False),
    ],
)
def test_is_job_id(text: str, ok: bool) -> None:
    assert is_job_id(text) is ok


@pytest.mark.parametrize(
    ("text", "array", "task"),
    [
        ("1234", True, False),
        ("1234_7", False, True),
        ("a1b2c3d4", True, False),
        ("a1b2c3d4_7", False, True),
        ("12345678", True, False),  # old or new: either way a job or an array
        ("1234.s2", False, False),  # a step
    ],
)
def test_one_rule_for_array_and_task_ids(text: str, array: bool, task: bool) -> None:
    assert may_be_array_id(text) is array
    assert is_task_id(text) is task


def test_job_numbers() -> None:
    assert format_job_id(FIRST_JOB_ID) == "1"
    assert job_number("1234") == 1234
    assert job_number("1234_7") is None
    assert job_number("a1b2c3d4") is None
    assert job_number("12345678") == 12345678  # an old id made of digits: still a number


def test_validate_job_id() -> None:
    assert validate_job_id(" 1234 ") == "1234"
    assert validate_job_id(" A1B2C3D4 ") == "a1b2c3d4"
    assert validate_job_id("a1b2c3d4_7") == "a1b2c3d4_7"
    with pytest.raises(SpecError) as exc:
        validate_job_id("nope")
    check_message(exc, "'nope'", "not a job id", "1234")


def test_array_task_ids() -> None:
    assert array_task_id("1234", 7) == "1234_7"
    assert split_array_task_id("1234_7") == ("1234", 7)
    assert split_array_task_id("a1b2c3d4_7") == ("a1b2c3d4", 7)
    assert split_array_task_id("a1b2c3d4") == ("a1b2c3d4", None)
    assert is_job_id(array_task_id("1234", 12))


# --------------------------------------------------------------------------- names, commands


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train", "train"),
        ("  train  ", "train"),
        ("resnet-50 lr=0.1 (run 3)", "resnet-50 lr=0.1 (run 3)"),
        ("训练", "训练"),
        ("x" * 128, "x" * 128),
    ],
)
def test_job_name_ok(text: str, expected: str) -> None:
    assert validate_job_name(text) == expected


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty",)),
        ("   ", ("empty",)),
        ("x" * 129, ("129 characters", "at most 128")),
        ("a\tb", ("control",)),
        ("a\nb", ("control",)),
        ("a\x1b[31mred", ("control",)),
        ("a\x00b", ("control",)),
        ("bidi\u202eevil", ("non-printable",)),
    ],
)
def test_job_name_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_job_name(text)
    check_message(exc, *fragments)


@pytest.mark.parametrize(
    "text",
    [
        "python train.py",
        "  echo hi  ",
        "for i in 1 2; do\n  echo $i\ndone\n",
        "x" * MAX_COMMAND_BYTES,
        "echo 'ü'",
    ],
)
def test_command_ok(text: str) -> None:
    assert validate_command(text) == text  # returned unchanged


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ("empty",)),
        ("  \n\t", ("empty",)),
        ("echo a\x00b", ("NUL",)),
        ("echo \udcff", ("not valid UTF-8", "character 6", "'\\udcff'")),
        ("x" * (MAX_COMMAND_BYTES + 1), ("65537 bytes", "64 KiB")),
        ("ü" * (MAX_COMMAND_BYTES // 2 + 1), ("65538 bytes",)),  # counted in UTF-8 bytes
    ],
)
def test_command_errors(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_command(text)
    check_message(exc, *fragments)


def test_long_values_are_shortened_in_messages() -> None:
    with pytest.raises(SpecError) as exc:
        parse_time_limit("x" * 500)
    assert len(str(exc.value)) < 200
    assert "..." in str(exc.value)


# --------------------------------------------------------------------------- arrays, printed


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("0-99%8", "0-99%8"),
        ("1,3,5", "1,3,5"),
        ("0-15:4", "0,4,8,12"),
        ("7", "7"),
        ("5,0-2,3", "0-3,5"),
        ("0-99999", "0-99999"),
    ],
)
def test_format_array_round_trips(text: str, printed: str) -> None:
    assert format_array(parse_array(text)) == printed
    assert parse_array(format_array(parse_array(text))) == parse_array(text)


# --------------------------------------------------------------------------- what reaches a program


@pytest.mark.parametrize("text", ["", "plain", "ü 训练 🚀", "tab\tand\nnewline", "\x7f\x01"])
def test_text_that_a_program_can_be_given(text: str) -> None:
    assert text_problem(text) is None
    assert validate_text(text, "--x") == text


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("a\x00b", ("--x contains a NUL byte", "character 2")),
        ("\ud800", ("--x is not valid UTF-8", "character 1", "'\\ud800'")),
        ("caf\udce9", ("character 4", "'\\udce9'", "not UTF-8")),  # b"caf\xe9" from Latin-1
        ("ok\udfff", ("character 3",)),
    ],
)
def test_text_that_cannot_travel(text: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_text(text, "--x")
    check_message(exc, *fragments)
    str(exc.value).encode("utf-8")  # the message itself can travel


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("PATH", True),
        ("_", True),
        ("_private9", True),
        ("lower_case", True),
        ("BASH_FUNC_module%%", True),  # an exported bash function (Lmod, modules)
        ("BASH_FUNC_ml%%", True),
        ("", False),
        ("1ABC", False),
        ("A=B", False),
        ("A B", False),
        ("A-B", False),
        ("A.B", False),
        ("ÄRGER", False),
        ("A\x00", False),
        ("BASH_FUNC_%%", False),
        ("BASH_FUNC_f%", False),
        ("BASH_FUNC_f=%%", False),
    ],
)
def test_env_names(name: str, ok: bool) -> None:
    assert is_env_name(name) is ok


def test_reserved_env_names() -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "MGPU_JOB_ID", "MGPU_ANYTHING", "PET_NNODES"):
        assert is_reserved_env_name(name)
    for name in ("SLURM_JOB_ID", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        assert is_reserved_env_name(name)
    for name in ("CUDA_HOME", "PATH", "MGPU", "HOME", "NCCL_DEBUG"):
        assert not is_reserved_env_name(name)


def test_env_ok_at_its_limits() -> None:
    assert validate_env({}) == {}
    assert validate_env({"A": "ü\n", "B": ""}) == {"A": "ü\n", "B": ""}
    big = "x" * (MAX_ENV_ENTRY_BYTES - len("BIG="))
    assert validate_env({"BIG": big})["BIG"] == big
    many = {f"V{i}": "" for i in range(MAX_ENV_VARS)}
    assert len(validate_env(many)) == MAX_ENV_VARS
    each = MAX_ENV_ENTRY_BYTES // 2
    fits = {f"V{i}": "x" * (each - 4) for i in range(MAX_ENV_BYTES // each - 1)}
    assert validate_env(fits) == fits


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"": "x"}, ("--env name ''", "not a variable name")),
        ({"A=B": "x"}, ("--env name 'A=B'", "not a variable name")),
        ({"1A": "x"}, ("'1A'", "not starting with a digit")),
        ({"A\x00": "x"}, ("--env name 'A\\x00' contains a NUL byte",)),
        ({"\udcff": "x"}, ("--env name '\\udcff' is not valid UTF-8",)),
        ({"HOME": "a\x00b"}, ("--env[HOME] contains a NUL byte",)),
        ({"LANG": "\udcc3"}, ("--env[LANG] is not valid UTF-8",)),
        ({"BIG": "x" * MAX_ENV_ENTRY_BYTES}, ("--env[BIG] is 65540 bytes long", "64 KiB")),
        ({f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}, ("4097 variables", "at most 4096")),
        (
            {f"V{i}": "x" * 60000 for i in range(5)},
            ("--env is 300020 bytes in all", "256 KiB"),
        ),
    ],
)
def test_env_errors(env: dict[str, str], fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_env(env)
    check_message(exc, *fragments)


ENV_NAMES = st.one_of(
    st.sampled_from(["A", "_b9", "BASH_FUNC_f%%", "A\nB", "A=B", "", "1A", "\ud800", "A\x00"]),
    st.text(max_size=4),
)
ENV_VALUES = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["\x00", "\udcff", "ü", "x" * 40_000, "é" * 30_000]),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(ENV_NAMES, ENV_VALUES, max_size=8))
def test_env_fast_path_agrees_with_the_rules(env: dict[str, str]) -> None:
    """`validate_env` decides plain environments in one pass: same answer as the rules
    applied variable by variable."""
    sizes = [len(k) + 1 + len(v.encode("utf-8", "surrogatepass")) for k, v in env.items()]
    ok = (
        all(is_env_name(k) and text_problem(v) is None for k, v in env.items())
        and all(size <= MAX_ENV_ENTRY_BYTES for size in sizes)
        and sum(size + 1 for size in sizes) <= MAX_ENV_BYTES
    )
    if ok:
        assert validate_env(env) == env
    else:
        with pytest.raises(SpecError):
            validate_env(env)


def test_argv_ok_at_its_limits() -> None:
    assert validate_argv(("python", "-c", "print('ü')")) == ["python", "-c", "print('ü')"]
    assert len(validate_argv(["x"] * MAX_ARGV_ITEMS)) == MAX_ARGV_ITEMS
    assert validate_argv(["echo", "a" * MAX_ARG_BYTES])[1] == "a" * MAX_ARG_BYTES
    per = MAX_ARGV_BYTES // 4 - 1  # four arguments that fill the total exactly
    assert len(validate_argv(["a" * per] * 4)) == 4


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ([], ("the command is empty",)),
        (["  ", "x"], ("the command is empty", "first argument")),
        (["echo", "a\x00b"], ("--argv[1] contains a NUL byte",)),
        (["echo", "x", "\udcff"], ("--argv[2] is not valid UTF-8",)),
        (["x"] * (MAX_ARGV_ITEMS + 1), ("4097 arguments", "at most 4096")),
        (["echo", "a" * (MAX_ARG_BYTES + 1)], ("--argv[1] is 65537 bytes long", "64 KiB")),
        (["echo", "ü" * (MAX_ARG_BYTES // 2 + 1)], ("--argv[1] is 65538 bytes",)),
        (["a" * MAX_ARG_BYTES] * 4, ("--argv is 262148 bytes in all", "256 KiB")),
    ],
)
def test_argv_errors(argv: list[str], fragments: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as exc:
        validate_argv(argv)
    check_message(exc, *fragments)


def test_cwd() -> None:
    assert validate_cwd("/home/al/exp ü") == "/home/al/exp ü"
    for bad, fragment in [
        ("relative/dir", "--cwd 'relative/dir' is not an absolute path"),
        ("/tmp/\udcff", "--cwd is not valid UTF-8"),
        ("/tmp/a\x00", "--cwd contains a NUL byte"),
        ("/" + "d" * 4095, "--cwd is 4096 bytes long; at most 4095"),
    ]:
        with pytest.raises(SpecError) as exc:
            validate_cwd(bad)
        check_message(exc, fragment)


@pytest.mark.parametrize(
    "image", ["busybox", "docker.io/library/ubuntu:24.04", "/images/torch.sif", "a@sha256:ab"]
)
def test_image_ok(image: str) -> None:
    assert validate_image(image) == image


@pytest.mark.parametrize("image", ["--privileged", "-v", "a b", "x;rm", "", "é", "x" * 513])
def test_image_errors(image: str) -> None:
    with pytest.raises(SpecError) as exc:
        validate_image(image)
    check_message(exc, "--image", "not a valid image name")
