#!/usr/bin/env bash
# Install the Debian packages mgpu's test suite needs, only when missing.
#
#   iproute2, util-linux, hostname  network/UTS namespaces for multi-node tests (tests/netns.py)
#   openmpi-bin, libopenmpi-dev     MPI runtime + headers (to build mpi4py in the venv)
#   chromium                        headless browser tests of the web UI
#   nodejs                          the dashboard's scripts run beside their Python twins
#                                   (tests/unit/test_resume_js.py)
#   podman, runc, busybox-static    a real --image job (tests/e2e/test_site.py: rootful podman,
#                                   runc for hybrid-cgroup VMs, a busybox image built locally)
#   zsh                             the zsh completion script, typed into a real zsh
#                                   (tests/unit/test_completion.py)
#   postgresql                      a real PostgreSQL for the store's tests and the HA tests
#                                   (tests/pgserver.py runs it as the postgres account)
#   slurm-wlm, slurm-client, munge  a real Slurm 22.05 beside mgpu for the differential tier
#   slurmdbd, mariadb-server        (tests/slurmdiff: its own munged, MariaDB, slurmdbd for
#                                   sacct, slurmctld and slurmd, config in a temp dir; the
#                                   packages' own services are not started: see below)
#
# Idempotent and fast when everything is present (one dpkg-query, no apt-get).
# Skips with a message (exit 0) when not root or when apt-get is unavailable, so
# `make test` still runs elsewhere; the tests needing these packages then skip.
set -euo pipefail

PACKAGES=(iproute2 util-linux hostname openmpi-bin libopenmpi-dev chromium nodejs podman runc busybox-static zsh postgresql slurm-wlm slurm-client munge slurmdbd mariadb-server)

log() { printf 'install-system-deps: %s\n' "$*" >&2; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    log "no dpkg/apt-get on this machine; skipping (tests needing system packages will skip)"
    exit 0
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    # "ii " = desired install, currently installed.
    [[ "$status" == ii* ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
    log "not root; cannot install missing packages: ${missing[*]} (skipping)"
    exit 0
fi

log "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
logfile=$(mktemp /tmp/install-system-deps.XXXXXX.log)
trap 'rm -f "$logfile"' EXIT

run() {
    if ! "$@" >>"$logfile" 2>&1; then
        log "command failed: $*"
        tail -n 40 "$logfile" >&2
        exit 1
    fi
}

# The Slurm, munge and MariaDB packages start their services on install where they can:
# a test machine runs none of them (the tier starts its own, from its own config).  A
# policy-rc.d that says no keeps them stopped, unless the machine has one of its own.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# install-system-deps.sh: no service starts while it installs\nexit 101\n' \
        >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f "$logfile" /usr/sbin/policy-rc.d' EXIT
fi

run apt-get update -qq
# Another apt run (a parallel installer) holds the lock for a while: wait for it.
run apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
log "done"
