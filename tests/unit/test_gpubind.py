"""`--gpu-bind` read and applied as Slurm 22.05's (mgpu.gpubind), and srun's `--export`
(mgpu.client.submitenv.step_environment)."""

from __future__ import annotations

import pytest

from mgpu import gpubind
from mgpu.client.submitenv import step_environment


@pytest.mark.parametrize(
    ("text", "kind", "verbose", "number"),
    [
        ("none", "none", False, 0),
        ("NONE", "none", False, 0),
        ("closest", "closest", False, 0),
        ("verbose,closest", "closest", True, 0),
        ("c", "other", False, 0),  # tres_bind.c takes any word that starts with c or n
        ("single:3", "single", False, 3),
        ("single:x", "single", False, 1),  # valid to Slurm; gres.c then takes 1
        ("per_task:2", "per_task", False, 2),
        ("map_gpu:0,1*2", "map", False, 0),
        ("mask_gpu:0x3*2,c", "mask", False, 0),
        ("map_gpu:0;gpu:closest", "map", False, 0),  # ';' parts: each must be gpu's
    ],
)
def test_what_slurm_accepts(text: str, kind: str, verbose: bool, number: int) -> None:
    bind = gpubind.parse(text)
    assert (bind.kind, bind.verbose, bind.number) == (kind, verbose, number)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sideways",
        "map_gpu:a",
        "map_gpu:0x1",
        "mask_gpu:0xg",
        "map_gpu:1*x",
        "single:-2",
        "verbose,",
        "none;nic:closest",
        "per_task:-1",
    ],
)
def test_what_slurm_refuses_in_its_words(text: str) -> None:
    with pytest.raises(ValueError) as e:
        gpubind.parse(text)
    assert str(e.value) == f"Invalid --gpu-bind argument: gpu:{text}"


def gpus(text: str | None, step: list[int], tasks: int = 4, size: int = 4) -> list[list[int]]:
    bind = None if text is None else gpubind.parse(text)
    return [gpubind.task_gpus(bind, step, t, size) for t in range(tasks)]


def test_binding_as_gres_c_computes_it() -> None:
    assert gpus(None, [0, 1]) == [[0, 1]] * 4
    assert gpus("none", [1, 3]) == [[1, 3]] * 4
    assert gpus("single:1", [1, 3]) == [[1], [3], [1], [3]]
    assert gpus("single:3", [0, 1], tasks=6) == [[0], [0], [0], [1], [1], [1]]
    assert gpus("single:1", [2]) == [[2]] * 4
    assert gpus("map_gpu:3,1", [1, 3]) == [[3], [1], [3], [1]]
    assert gpus("map_gpu:0", [1, 3]) == [[1]] * 4  # not the step's: its first
    assert gpus("map_gpu:010", [8], size=9) == [[8]] * 4  # strtol base 0: octal
    assert gpus("mask_gpu:0xf", [1, 3]) == [[1, 3]] * 4
    assert gpus("mask_gpu:0x10", [0, 1]) == [[0]] * 4  # over the node's 4 GPUs: first
    assert gpus("map_gpu:", [0, 1]) == [[0, 1]] * 4  # an empty list binds nothing
    assert gpus("per_task:1", []) == [[]] * 4  # a step without GPUs


def test_the_verbose_line_is_slurms() -> None:
    assert gpubind.verbose_line([1], [0, 1]) == (
        "gpu-bind: usable_gres=0x2; bit_alloc=0x3; local_inx=0; global_list=1; local_list=1"
    )


ENV = {"A": "1", "B": "2", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "PATH": "/bin"}


@pytest.mark.parametrize(
    ("export", "expected"),
    [
        (None, ENV),
        ("ALL", ENV),
        ("all", ENV),
        ("NONE", {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}),
        ("NIL", {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}),  # a name, not set
        ("A,C=3", {"A": "1", "C": "3", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}),
        ("ALL,A=9,C=3", {**ENV, "C": "3"}),  # the caller's own over the list's
        ("C=3,NONE,B", {"C": "3", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}),
        ("'D=x,y'", {"D": "x,y", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}),
    ],
)
def test_srun_export_as_slurm_builds_the_tasks_environment(
    export: str | None, expected: dict[str, str]
) -> None:
    assert step_environment(ENV, export) == expected
