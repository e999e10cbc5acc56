"""NVIDIA pyxis's options (a SPANK plugin's rows in srun, sbatch and salloc): the image
and the container options mgpu's runtimes honour (mgpu.containeropts), and one sentence
for each option they cannot.

Image names are taken as pyxis (enroot) takes them: `[docker://][USER@][REGISTRY#]IMAGE[:TAG]`
becomes the runtime's `REGISTRY/IMAGE:TAG` (the user part is for a registry's login; mgpu
runs images the node has), and a path (`/x.sqsh`, `./x.sqsh`) a file, absolute, which
only apptainer runs (the agent says so where the node's runtime cannot).

sbatch and salloc hand their options to the job's steps as Slurm hands a SPANK plugin's:
`_SLURM_SPANK_OPTION_pyxis_NAME` variables, read by srun below its own command line.
"""

from __future__ import annotations

import os
import secrets
import shlex

from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ROWS = """
container-image          - = bra pyxis
container-mounts         - = bra pyxis
container-workdir        - = bra pyxis
container-name           - = bra pyxis
container-save           - = bra pyxis
container-mount-home     - - bra pyxis
no-container-mount-home  - - bra pyxis
container-remap-root     - - bra pyxis
no-container-remap-root  - - bra pyxis
container-entrypoint     - - bra pyxis
no-container-entrypoint  - - bra pyxis
container-entrypoint-log - - bra pyxis
container-writable       - - bra pyxis
container-readonly       - - bra pyxis
container-env            - = bra pyxis
"""
"""pyxis's `spank_opts[]` (args.c), in its order, in optable's columns."""

NAMES = tuple(line.split()[0] for line in ROWS.strip().splitlines())
FLAGS = frozenset(line.split()[0] for line in ROWS.strip().splitlines() if line.split()[2] == "-")
"""The options that take no value."""
ENV_PREFIX = "_SLURM_SPANK_OPTION_pyxis_"

REFUSED = {
    "container-name": (
        "--container-name is not supported by mgpu: a container is not kept between steps "
        "(each starts from its image)"
    ),
    "container-save": "--container-save is not supported by mgpu (it saves no container)",
    "container-remap-root": (
        "--container-remap-root is not supported by mgpu: a container runs as the job's "
        "user, never as root"
    ),
}
"""Each refused option's sentence, after `pyxis: `."""

PAIRS = (
    ("container-mount-home", "no-container-mount-home"),
    ("container-remap-root", "no-container-remap-root"),
    ("container-entrypoint", "no-container-entrypoint"),
    ("container-writable", "container-readonly"),
)
_MOUNT_FLAGS = {"ro": True, "rw": False}
_HARMLESS_FLAGS = frozenset(
    {"rbind", "bind", "rprivate", "private", "rslave", "slave", "x-create=auto", "x-create=dir"}
)
"""enroot's mount flags that change nothing a job sees: the runtimes' bind mounts are
recursive and private already, and a missing target is made."""


def inherited(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The pyxis options of the enclosing sbatch/salloc (its `_SLURM_SPANK_OPTION_pyxis_*`)."""
    out = []
    for name in NAMES:
        var = ENV_PREFIX + name.replace("-", "_")
        if var in environ:
            out.append((name, environ[var]))
    return out


def exported(values: Mapping[str, str]) -> dict[str, str]:
    """The variables that hand `values`' pyxis options to a job's steps."""
    return {ENV_PREFIX + n.replace("-", "_"): values[n] for n in NAMES if n in values}


def given(values: Mapping[str, str]) -> bool:
    return any(n in values for n in NAMES)


def image_name(prog: str, text: str, cwd: str) -> str:
    """The runtime's name (or file) for pyxis's image `text` (see the module docstring)."""
    image = text.strip()
    if not image:
        raise fail(prog, "pyxis: --container-image: argument required")
    for scheme in ("docker://", "dockerd://", "podman://"):
        if image.startswith(scheme):
            image = image[len(scheme) :]
            break
    if image.startswith((".", "/")):
        return os.path.normpath(os.path.join(cwd, image))
    if "#" in image:
        registry, _, rest = image.partition("#")
        registry = registry.rpartition("@")[2]  # USER@REGISTRY: the login is the registry's
        if not registry or not rest:
            raise fail(prog, f"pyxis: --container-image: invalid image name: {text}")
        return f"{registry}/{rest}"
    _, at, rest = image.partition("@")
    if at and not rest.startswith("sha256:"):  # USER@IMAGE, not IMAGE@sha256:DIGEST
        return rest
    return image


def _mounts(prog: str, text: str, cwd: str) -> list[dict[str, Any]]:
    """`SRC:DST[:FLAGS][,SRC:DST...]`, flags joined by `+` (args.c's parse_mount_option)."""
    out: list[dict[str, Any]] = []
    for entry in text.split(","):
        src, colon, rest = entry.partition(":")
        dst, _, flags = rest.partition(":")
        if not src or (colon and not dst):
            raise fail(prog, f"pyxis: --container-mounts: invalid format: {entry}")
        dst = dst or src
        mount: dict[str, Any] = {}
        if src == "tmpfs":
            mount["tmpfs"] = True
        elif src == "umount":
            raise fail(prog, "pyxis: --container-mounts: umount is not supported by mgpu")
        elif src.startswith((".", "/")):
            mount["source"] = os.path.normpath(os.path.join(cwd, src))
        else:
            raise fail(
                prog,
                'pyxis: mount source must be a relative path, an absolute path, "tmpfs" or '
                '"umount"',
            )
        if not dst.startswith((".", "/")):
            raise fail(prog, "pyxis: mount target must be a relative path or an absolute path")
        mount["target"] = os.path.normpath(os.path.join("/", dst))
        for flag in filter(None, flags.split("+")):
            if flag in _MOUNT_FLAGS:
                mount["readonly"] = _MOUNT_FLAGS[flag]
            elif flag not in _HARMLESS_FLAGS:
                raise fail(prog, f"pyxis: --container-mounts: mount flag {flag} is not supported")
        out.append(mount)
    return out


def request(
    prog: str, values: Mapping[str, str], cwd: str
) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """(the image, the container options for mgpu.containeropts, warnings) of the pyxis
    options in `values`; (None, None, warnings) when they name no image."""
    for first, second in PAIRS:
        if first in values and second in values:
            raise fail(prog, f"pyxis: both --{first} and --{second} were specified")
    for name, why in REFUSED.items():
        if name in values:
            raise fail(prog, f"pyxis: {why}")
    if "container-image" not in values:
        ignored = [f"--{n}" for n in NAMES if n in values]
        warnings = [f"pyxis: ignoring {' '.join(ignored)} because --container-image is not set"]
        return None, None, warnings if ignored else []
    image = image_name(prog, values["container-image"], cwd)
    options: dict[str, Any] = {
        "mounts": _mounts(prog, values["container-mounts"], cwd)
        if values.get("container-mounts")
        else [],
        "entrypoint": "container-entrypoint" in values,
        "readonly": "container-readonly" in values,
        "writable": "container-writable" in values,
        "mount_home": "container-mount-home" in values,
    }
    if "container-workdir" in values:
        workdir = values["container-workdir"]
        if not workdir:
            raise fail(prog, "pyxis: --container-workdir: argument required")
        options["workdir"] = os.path.normpath(os.path.join("/", workdir))
    if "container-env" in values:
        names = values["container-env"].split(",")
        if not all(names):
            raise fail(prog, f"pyxis: --container-env: invalid format: {values['container-env']}")
        options["env"] = names
    return image, options, []


def words(values: Mapping[str, str]) -> list[str]:
    """`values`' pyxis options as srun's words (`--container-image=X`, a flag bare)."""
    out = []
    for name in NAMES:
        if name in values:
            out.append(f"--{name}" if name in FLAGS else f"--{name}={values[name]}")
    return out


WRAPPER = """#!/bin/sh
# Written by mgpu's sbatch: pyxis runs a batch script in its --container-image, and so
# does this, as a step of the job on its first node; its output reaches the job's -o/-e
# files through srun, written on the node as the job's user (docs/SECURITY.md).
d=$(mktemp -d /tmp/mgpu-batch.XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
cat > "$d/{name}" <<'{end}'
{script}{end}
chmod 0500 "$d/{name}"
srun --nodes=1 --ntasks=1 {words} --container-mounts={mounts}"$d:$d:ro" -- "$d/{name}" "$@"
"""


def batch_wrapper(script: str, name: str, values: Mapping[str, str]) -> str:
    """The batch script that runs `script` in the container of `values`' pyxis options
    (see WRAPPER): its text, in a private directory of the user's mounted read-only."""
    end = f"MGPU_BATCH_SCRIPT_{secrets.token_hex(8)}"
    mounts = values.get("container-mounts")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "script"
    given = {k: v for k, v in values.items() if k != "container-mounts"}
    return WRAPPER.format(
        name=safe,
        end=end,
        script=script if script.endswith("\n") else script + "\n",
        words=" ".join(shlex.quote(w) for w in words(given)),
        mounts=shlex.quote(mounts + ",") if mounts else "",
    )
