#!/usr/bin/env bash
# `make dist`: standalone executables for machines without mgpu's Python environment.
#
#   dist/mgpu          one PyInstaller --onefile binary (Python and every dependency inside)
#   dist/mgpu_master   hard links to it; the name it is started under picks the command:
#   dist/mgpu_node       mgpu_master = `mgpu master`, mgpu_node = `mgpu node`,
#   dist/mgpu_client     mgpu_client = mgpu, ... (scripts/frozen_entry.py)
#   dist/mgpu_srun, dist/mgpu_queue, dist/mgpu_cancel
#   (a link named srun, sbatch, squeue, ... is that Slurm command: a Pod's steps.bin)
#
# Cached: nothing is rebuilt while the sources, pyproject.toml and this script are
# unchanged (a hash in dist/.build-hash); PyInstaller's own analysis cache is in
# build/pyinstaller.  Needs PyInstaller in the build Python (installed when missing).
#
#   PYTHON=.venv/bin/python  the Python to build with (its site-packages are bundled)
#   MGPU_DIST_DIR=dist       where the executables go
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
out=${MGPU_DIST_DIR:-$root/dist}
work=$root/build/pyinstaller
names=(mgpu_master mgpu_node mgpu_client mgpu_srun mgpu_queue mgpu_cancel)

log() { printf 'build-dist: %s\n' "$*" >&2; }

hash=$(
    cd "$root"
    {
        "$py" -c 'import sys, platform; print(sys.version, platform.machine())'
        find src/mgpu -type f \( -name '*.py' -o -path '*/web/*' \) -print0 | sort -z |
            xargs -0 sha256sum
        sha256sum pyproject.toml scripts/frozen_entry.py scripts/build-dist.sh
    } | sha256sum | cut -c1-16
)
if [[ -x "$out/mgpu" && "$(cat "$out/.build-hash" 2>/dev/null)" == "$hash" ]]; then
    log "up to date: $out"
    exit 0
fi

if ! "$py" -c 'import PyInstaller' 2>/dev/null; then
    log "installing PyInstaller into $py's environment"
    "$py" -m pip install -q 'pyinstaller>=6.0'
fi

log "building $out/mgpu (PyInstaller, a minute or two the first time)"
mkdir -p "$work" "$out"
stage=$(mktemp -d "$work/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# Dev and optional packages that would come along from the build environment (mgpu
# imports them lazily for plots and tests) are left out: the binary stays ~30 MB.
"$py" -m PyInstaller --onefile --noconfirm --log-level WARN --name mgpu \
    --distpath "$stage" --workpath "$work" --specpath "$work" \
    --paths "$root/src" \
    --collect-submodules mgpu --collect-data mgpu --collect-submodules uvicorn \
    --exclude-module matplotlib --exclude-module numpy --exclude-module PIL \
    --exclude-module pytest --exclude-module _pytest --exclude-module hypothesis \
    --exclude-module mypy --exclude-module IPython --exclude-module tkinter \
    --exclude-module mgpu.testing \
    "$root/scripts/frozen_entry.py"
mv -f "$stage/mgpu" "$out/mgpu"
for n in "${names[@]}"; do
    ln -f "$out/mgpu" "$out/$n"
done
echo "$hash" >"$out/.build-hash"
log "done: $out/mgpu and ${names[*]}"
