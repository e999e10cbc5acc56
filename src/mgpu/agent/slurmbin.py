"""The bin dir of Slurm's commands (sbatch, srun, squeue, ... and `mgpu`) that every job
finds first on its PATH (`$MGPU_SLURM_BIN`), and that `mgpu slurm-bin` prints for a
terminal (`export PATH=$(mgpu slurm-bin):$PATH`).

It must work for every account, also where mgpu's own Python cannot be read by it (a venv
whose interpreter lives under a private /root).  So the dir holds a copy of the `mgpu`
package's source (the commands need only its standard-library client), compiled, and
shell shims that run it with the first Python the account can execute: the system's
python3 (3.11 or newer) before this process's own.  Everything is root's (or the
agent's) and world-readable; a dir is built once per mgpu version (its name is a hash of
the sources), into a temporary name renamed into place, so that agents sharing a
machine never see half of one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SLURM_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "scontrol", "sinfo", "sacct")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
MIN_PYTHON = (3, 11)
KEEP_OLD_SECONDS = 7 * 86400
"""How long another version's dir is kept after it was built."""
RUN_ROOT = Path("/run/mgpu/slurm-bin")
"""Root's dirs: on a tmpfs, so that an upgrade leaves no old copy after a reboot."""

SHIM = """#!/bin/sh
# mgpu's {name}: Slurm's command, talking to mgpu (made by mgpu.agent.slurmbin).
for py in {pythons}; do
    if [ -x "$py" ]; then
        exec "$py" -I -c {code} {lib} "$@"
    fi
done
echo "{name}: error: no Python {version} this account may run (tried {pythons})" >&2
exit 127
"""

_built: dict[Path, Path] = {}
_failed = False
log = logging.getLogger("mgpu.agent")


def _source() -> Path:
    """The `mgpu` package this process runs."""
    return Path(__file__).resolve().parents[1]


def _files(package: Path) -> list[Path]:
    return sorted(
        p
        for p in package.rglob("*")
        if p.is_file()
        and (p.suffix == ".py" or p.name == "py.typed")
        and "__pycache__" not in p.parts
    )


def _usable(python: str) -> bool:
    """A Python new enough for mgpu."""
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return False
    check = f"import sys; sys.exit(sys.version_info < {MIN_PYTHON!r})"
    try:
        return subprocess.run([python, "-I", "-S", "-c", check], timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pythons() -> list[str]:
    """The Pythons the shims try, in order: the system's, then this process's own."""
    found: list[str] = []
    for candidate in (*SYSTEM_PYTHONS, sys.executable):
        real = os.path.realpath(candidate)
        if real not in (os.path.realpath(p) for p in found) and _usable(candidate):
            found.append(candidate)
    return found


def _shim(name: str, lib: Path, interpreters: list[str]) -> str:
    if name == "mgpu":
        # mgpu's own Python first where the account may run it: `mgpu master` and the
        # like need its packages; the Slurm commands need the standard library only.
        interpreters = [*interpreters[-1:], *interpreters[:-1]]
        call = "from mgpu.client.cli import main; main()"
    else:
        call = f"from mgpu.slurm.main import main; main({name!r})"
    code = f"import sys; sys.path.insert(0, sys.argv.pop(1)); {call}"
    return SHIM.format(
        name=name,
        pythons=" ".join(shlex.quote(p) for p in interpreters),
        code=shlex.quote(code),
        lib=shlex.quote(str(lib)),
        version=".".join(map(str, MIN_PYTHON)),
    )


def default_root() -> Path:
    """Root's under /run; another account's in its cache dir."""
    if os.geteuid() == 0:
        return RUN_ROOT
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "mgpu" / "slurm-bin"


def _make_dirs(path: Path) -> None:
    """`path` and its parents, each 0755; an existing one must be ours and writable by
    no one else (under a shared /tmp, another account could have made it first)."""
    for parent in reversed([path, *path.parents]):
        if parent.exists():
            continue
        parent.mkdir(mode=0o755)
        parent.chmod(0o755)
    st = path.lstat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{path} is not this account's alone; refusing to build the bin dir there")


def ensure(root: Path | None = None) -> Path:
    """The bin dir for this mgpu, built if need be (once per process)."""
    root = root or default_root()
    if root in _built:
        return _built[root]
    package = _source()
    files = _files(package)
    interpreters = pythons()
    digest = hashlib.sha256(repr(interpreters).encode())
    for path in files:
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    home = root / digest.hexdigest()[:16]
    if not (home / "bin" / "mgpu").exists():
        _make_dirs(root)
        _prune(root)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            _build(tmp, package, files, interpreters, home)
            try:
                tmp.rename(home)
            except OSError:  # another agent on this machine was first: use its copy
                if not (home / "bin" / "mgpu").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _built[root] = home / "bin"
    return home / "bin"


def _prune(root: Path, now: float | None = None) -> None:
    """Other versions' dirs a week old, and builds cut short: an upgraded machine's jobs
    have long moved on to the new one."""
    import time

    now = time.time() if now is None else now
    for entry in root.iterdir():
        try:
            age = now - entry.lstat().st_mtime
        except OSError:
            continue
        if age > (3600 if entry.name.startswith(".build-") else KEEP_OLD_SECONDS):
            shutil.rmtree(entry, ignore_errors=True)


def _build(
    tmp: Path, package: Path, files: list[Path], interpreters: list[str], home: Path
) -> None:
    lib = tmp / "lib"
    for path in files:
        dest = lib / "mgpu" / path.relative_to(package)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    for python in interpreters:  # compiled now: the accounts that run them cannot write there
        subprocess.run(
            [python, "-I", "-m", "compileall", "-q", "-d", str(home / "lib"), str(lib)],
            check=False,
            timeout=300,
            stdout=subprocess.DEVNULL,
        )
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in (*SLURM_COMMANDS, "mgpu"):
        shim = bin_dir / name
        shim.write_text(_shim(name, home / "lib", interpreters))
    for dirpath, _, filenames in os.walk(tmp):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o755 if dirpath == str(bin_dir) else 0o644)


def job_path(path: str) -> tuple[str, str] | None:
    """(PATH with the bin dir first, the bin dir) for a job; None when it cannot be built
    (said once in the log: the jobs run without Slurm's commands rather than not at all)."""
    global _failed
    if _failed:
        return None
    try:
        bin_dir = str(ensure())
    except (OSError, subprocess.SubprocessError) as e:
        _failed = True
        log.warning("no Slurm commands on jobs' PATH: cannot build their bin dir (%s)", e)
        return None
    return f"{bin_dir}:{path}" if path else bin_dir, bin_dir
