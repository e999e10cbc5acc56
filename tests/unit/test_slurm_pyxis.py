"""NVIDIA pyxis's options (mgpu.slurm.pyxis): parsed as srun and sbatch take them, image
names as pyxis takes them, the container options the runtimes get, and refusals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgpu.agent import containers
from mgpu.agent.containers import Runtime
from mgpu.containeropts import ContainerOptions
from mgpu.protocol import Grant
from mgpu.slurm import jobopts, optable, opts, pyxis, srun
from mgpu.slurm.common import SlurmError

PODMAN = Runtime("podman", "/usr/bin/podman")
DOCKER = Runtime("docker", "/usr/bin/docker")
APPTAINER = Runtime("apptainer", "/usr/bin/apptainer")


def test_every_pyxis_option_is_a_row_of_srun_sbatch_and_salloc() -> None:
    names = [
        "container-image", "container-mounts", "container-workdir", "container-name",
        "container-save", "container-mount-home", "no-container-mount-home",
        "container-remap-root", "no-container-remap-root", "container-entrypoint",
        "no-container-entrypoint", "container-entrypoint-log", "container-writable",
        "container-readonly", "container-env",
    ]  # fmt: skip
    assert list(pyxis.NAMES) == names  # args.c's spank_opts[], in its order
    for prog in ("srun", "sbatch", "salloc"):
        assert set(names) <= {r.name for r in optable.rows(prog)}
    argv = ["--container-image=nvcr.io#nvidia/pytorch:24.01-py3", "--container-mounts",
            "/data:/data", "--container-workdir=/data", "--no-container-mount-home",
            "python", "train.py"]  # fmt: skip
    found, rest = opts.parse("srun", argv, srun.OPTIONS, in_order=True)
    assert dict(found) == {
        "container-image": "nvcr.io#nvidia/pytorch:24.01-py3",
        "container-mounts": "/data:/data",
        "container-workdir": "/data",
        "no-container-mount-home": "",
    }
    assert rest == ["python", "train.py"]
    # Slurm's own --container (OCI) is still itself, not a prefix of pyxis's.
    assert dict(opts.parse("srun", ["--container=/b", "x"], srun.OPTIONS, True)[0]) == {
        "container": "/b"
    }


@pytest.mark.parametrize(
    ("given", "runtime_name"),
    [
        ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io/nvidia/pytorch:24.01-py3"),
        ("docker://nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io/nvidia/pytorch:24.01-py3"),
        ("docker://ubuntu:22.04", "ubuntu:22.04"),
        ("dockerd://ubuntu", "ubuntu"),
        ("podman://localhost/x:1", "localhost/x:1"),
        ("me@nvcr.io#nvidia/x:1", "nvcr.io/nvidia/x:1"),  # a login: the node has the image
        ("ubuntu@sha256:0123", "ubuntu@sha256:0123"),  # a digest stays
        ("centos", "centos"),
        ("/images/pt.sqsh", "/images/pt.sqsh"),
        ("./pt.sqsh", "/home/al/pt.sqsh"),  # a file, made absolute
        ("../img/pt.sqsh", "/home/img/pt.sqsh"),
    ],
)
def test_image_names_as_pyxis_takes_them(given: str, runtime_name: str) -> None:
    assert pyxis.image_name("srun", given, "/home/al") == runtime_name


def test_mounts_workdir_and_flags() -> None:
    values = {
        "container-image": "x",
        "container-mounts": "/data:/in:ro+rprivate,tmpfs:/scratch,./ckpt,/etc/os-release:/host/os",
        "container-workdir": "/in",
        "container-readonly": "",
        "container-env": "PATH,WANDB_KEY",
    }
    image, options, notes = pyxis.request("srun", values, "/home/al")
    assert (image, notes) == ("x", [])
    assert options == {
        "mounts": [
            {"source": "/data", "target": "/in", "readonly": True},
            {"tmpfs": True, "target": "/scratch"},
            {"source": "/home/al/ckpt", "target": "/ckpt"},  # no target: the source's path
            {"source": "/etc/os-release", "target": "/host/os"},
        ],
        "workdir": "/in",
        "entrypoint": False,
        "readonly": True,
        "writable": False,
        "mount_home": False,
        "env": ["PATH", "WANDB_KEY"],
    }
    ContainerOptions.model_validate(options)  # as the master takes it


@pytest.mark.parametrize(
    ("values", "sentence"),
    [
        ({"container-name": "n"}, "pyxis: --container-name is not supported by mgpu: a "
         "container is not kept between steps (each starts from its image)"),
        ({"container-save": "/x.sqsh"}, "pyxis: --container-save is not supported by mgpu"),
        ({"container-remap-root": ""}, "pyxis: --container-remap-root is not supported by "
         "mgpu: a container runs as the job's user, never as root"),
        ({"container-writable": "", "container-readonly": ""},
         "pyxis: both --container-writable and --container-readonly were specified"),
        ({"container-mount-home": "", "no-container-mount-home": ""},
         "pyxis: both --container-mount-home and --no-container-mount-home were specified"),
        ({"container-mounts": "umount:/x"}, "umount is not supported by mgpu"),
        ({"container-mounts": "data:/x"}, "pyxis: mount source must be a relative path, an "
         'absolute path, "tmpfs" or "umount"'),
        ({"container-mounts": "/a:/b:noexec"}, "mount flag noexec is not supported"),
        ({"container-mounts": "/a:"}, "pyxis: --container-mounts: invalid format: /a:"),
        ({"container-env": "A,,B"}, "pyxis: --container-env: invalid format: A,,B"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_in_one_sentence(
    values: dict[str, str], sentence: str
) -> None:
    with pytest.raises(SlurmError) as e:
        pyxis.request("srun", {"container-image": "x", **values}, "/home/al")
    assert str(e.value).startswith("srun: error: ") and sentence in str(e.value)
    assert "\n" not in str(e.value)


def test_options_without_an_image_are_ignored_with_pyxis_warning() -> None:
    image, options, notes = pyxis.request("srun", {"container-workdir": "/x"}, "/")
    assert (image, options) == (None, None)
    assert notes == ["pyxis: ignoring --container-workdir because --container-image is not set"]
    # ... and are no job option of sbatch's (no warning of theirs, no field).
    fields, _, warnings = jobopts.submit_fields("sbatch", {"container-image": "x"}, {}, "/")
    assert warnings == [] and "image" not in fields


def test_srun_takes_what_its_sbatch_or_salloc_handed_down() -> None:
    env = pyxis.exported({"container-image": "x", "container-readonly": "", "nodes": "2"})
    assert env == {
        "_SLURM_SPANK_OPTION_pyxis_container_image": "x",
        "_SLURM_SPANK_OPTION_pyxis_container_readonly": "",
    }
    merged = srun.with_inherited({"container-writable": ""}, env)
    assert merged == {"container-image": "x", "container-writable": ""}
    assert srun.with_inherited({"container-image": "y"}, env)["container-image"] == "y"


def test_the_master_checks_paths_and_variables() -> None:
    for bad, why in [
        ({"mounts": [{"source": "/a:U", "target": "/b"}]}, "a ':', ',' or newline"),
        ({"mounts": [{"source": "/a", "target": "/"}]}, "cannot mount over the container's /"),
        ({"mounts": [{"source": "a", "target": "/b"}]}, "is not an absolute path"),
        ({"workdir": "rel"}, "is not an absolute path"),
        ({"env": ["CUDA_VISIBLE_DEVICES"]}, "the container sees the GPUs the job was granted"),
        ({"env": ["A-B"]}, "is not a variable name"),
        ({"readonly": True, "writable": True}, "both --container-writable and"),
        ({"user": "0"}, "Extra inputs are not permitted"),
    ]:
        with pytest.raises(ValidationError, match=why):
            ContainerOptions.model_validate(bad)


def _argv(rt: Runtime, options: ContainerOptions) -> list[str]:
    return containers.build_argv(
        rt,
        "img:1",
        ["python", "t.py"],
        grant=Grant(gpus=[]),
        cwd="/home/al/exp",
        uid_gid=(1001, 100),
        env_file="/spool/7.1.env",
        name="mgpu-7-1",
        source="/spool/7.1.cwd",
        options=options,
        binds=[("/spool/7.1.m0.cwd", "/data", True), ("/spool/7.1.m1.cwd", "/home/al", False)],
    )


OPTIONS = ContainerOptions.model_validate(
    {
        "mounts": [
            {"source": "/d", "target": "/data", "readonly": True},
            {"tmpfs": True, "target": "/scratch"},
        ],
        "workdir": "/data",
        "readonly": True,
        "mount_home": True,
    }
)


def test_podman_and_docker_command_lines_with_pyxis_options() -> None:
    for rt in (PODMAN, DOCKER):
        argv = _argv(rt, OPTIONS)
        tail = argv[argv.index("-v") :]
        assert tail[: tail.index("--env-file")] == [
            "-v", "/spool/7.1.cwd:/home/al/exp",
            "-v", "/spool/7.1.m0.cwd:/data:ro", "-v", "/spool/7.1.m1.cwd:/home/al",
            "--tmpfs", "/scratch", "--read-only", "--entrypoint=",
            "-w", "/data",
        ]  # fmt: skip
        assert argv[-3:] == ["img:1", "python", "t.py"] and argv.count("--user") == 1
    with_entrypoint = _argv(PODMAN, OPTIONS.model_copy(update={"entrypoint": True}))
    assert "--entrypoint=" not in with_entrypoint


def test_apptainer_command_line_with_pyxis_options() -> None:
    argv = _argv(APPTAINER, OPTIONS.model_copy(update={"readonly": False, "writable": True}))
    assert argv == [
        "/usr/bin/apptainer", "exec",
        "--bind", "/home/al/exp",
        "--bind", "/spool/7.1.m0.cwd:/data:ro", "--bind", "/spool/7.1.m1.cwd:/home/al",
        "--scratch", "/scratch", "--writable-tmpfs",
        "--pwd", "/data",
        "--env", "CUDA_VISIBLE_DEVICES=",
        "img:1", "python", "t.py",
    ]  # fmt: skip
    plain = _argv(APPTAINER, ContainerOptions(entrypoint=True))
    assert plain[1] == "run" and "--no-home" in plain  # its runscript; no home unless asked


def test_container_env_names_pass_what_the_host_only_would_keep() -> None:
    env = {"PATH": "/opt/bin", "HOME": "/h", "FOO": "1", "CUDA_VISIBLE_DEVICES": "3"}
    assert containers.passed_env(env) == ["FOO"]
    assert containers.passed_env(env, ["PATH"]) == ["FOO", "PATH"]
    assert containers.passed_env(env, ["CUDA_VISIBLE_DEVICES"]) == ["FOO"]  # never the GPUs


def test_sbatch_wraps_its_script_to_run_in_the_container() -> None:
    script = "#!/bin/bash\n#SBATCH --container-image=x\necho 'in image'\n"
    text = pyxis.batch_wrapper(
        script, "my job.sh", {"container-image": "nvcr.io#a/b:1", "container-mounts": "/d:/d"}
    )
    assert text.startswith("#!/bin/sh\n") and script in text  # the script, as it is
    line = text.splitlines()[-1]
    assert line.startswith(
        "srun --nodes=1 --ntasks=1 '--container-image=nvcr.io#a/b:1' "
        '--container-mounts=/d:/d,"$d:$d:ro" -- "$d/my_job.sh" "$@"'
    ), line
