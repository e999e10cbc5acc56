from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pgserver
from helpers import LocalCluster, local_cluster
from netns_fixtures import virtual_cluster  # noqa: F401
from pgserver import PgServer

REPO = Path(__file__).resolve().parent.parent


def _untracked() -> set[str] | None:
    """The files in the checkout git does not know and does not ignore (None: not a git
    checkout, or no git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "--others", "--exclude-standard", "-z"],
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {name for name in out.decode(errors="replace").split("\0") if name}


def _login_wrappers() -> set[Path]:
    """mgpu's Slurm login wrappers in the machine's /usr/local/bin (mgpu.agent.loginbin)."""
    from mgpu.agent import loginbin

    where = loginbin.LOGIN_BIN
    return {where / name for name in loginbin.SLURM_COMMANDS if loginbin.is_ours(where / name)}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller only, under xdist
        session.config.stash[_UNTRACKED] = _untracked()
        session.config.stash[_WRAPPERS] = _login_wrappers()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every test writes under its own temp dir: a file a test run left in the checkout (a
    job's `slurm-N.out` from a submit whose directory was the checkout) fails the run."""
    if hasattr(session.config, "workerinput"):
        return
    # A test whose agent ran with an environment of its own (MGPU_* stripped) may have
    # written login wrappers: the machine is left as the run found it.
    for path in _login_wrappers() - session.config.stash.get(_WRAPPERS, set()):
        path.unlink(missing_ok=True)
    before = session.config.stash.get(_UNTRACKED, None)
    if before is None:
        return
    after = _untracked() or set()
    stray = sorted(after - before)
    if stray:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"tests left files in the checkout: {', '.join(stray[:10])}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_UNTRACKED = pytest.StashKey[set[str] | None]()
_WRAPPERS = pytest.StashKey[set[Path]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, items sharing a node id (schemathesis gives its operations one)
    would run once between them, silently: refuse (the Makefile runs those apart)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    seen: set[str] = set()
    twice = {item.nodeid for item in items if item.nodeid in seen or seen.add(item.nodeid)}
    if twice:
        raise pytest.UsageError(f"items share a node id under xdist: {sorted(twice)[:3]}")


@pytest.fixture(scope="session", autouse=True)
def _signals_as_at_a_terminal() -> None:
    """A suite started in the background by a script (`make test &`, CI runners) inherits
    SIGINT and SIGQUIT ignored, and so would every client it starts: `mgpu srun` would
    not see the ^C a test types.  The tests' processes start as a user's shell starts them."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session", autouse=True)
def _no_login_wrappers_in_the_machines_bin() -> None:
    """A root agent writes Slurm's login-shell wrappers into /usr/local/bin
    (mgpu.agent.loginbin): the suite's agents do so only where a test asks for it."""
    from mgpu.agent import loginbin

    os.environ[loginbin.LOGIN_BIN_VAR] = ""


@pytest.fixture(scope="session", autouse=True)
def _a_directory_every_account_can_enter() -> Iterator[None]:
    """Jobs run in the submitting directory, as their owner; a clone in a private directory
    (`mktemp -d` under /root) would make every other account's job fail to enter it.  The
    tests submit from a directory like a user's project directory instead."""
    before = os.getcwd()
    here = tempfile.mkdtemp(prefix="mgpu-tests-")
    os.chmod(here, 0o755)
    os.chdir(here)
    try:
        yield
    finally:
        os.chdir(before)
        shutil.rmtree(here, ignore_errors=True)
        # In-process masters (the controller tier) time garbage collections; at exit the
        # interpreter's last collections would be logged to the terminal.
        import gc

        from mgpu.master.runtime import gcpause

        while gcpause._timer in gc.callbacks:
            gc.callbacks.remove(gcpause._timer)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A master and two agents with 4 fake GPUs each, on loopback."""
    with local_cluster(tmp_path, agents=2, gpus=4) as c:
        yield c


@pytest.fixture(scope="session")
def refusing_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster like `cluster`, shared by the tests of requests that must be refused: each
    of them checks that nothing was queued, so none leaves anything for the next (starting
    a master and its agents costs ~2.5 s; there are a few dozen such cases)."""
    with local_cluster(tmp_path_factory.mktemp("refusing"), agents=2, gpus=4) as c:
        yield c


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    """A PostgreSQL server for the session (tests/pgserver.py); skips where none is installed."""
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (scripts/install-system-deps.sh installs it)")
    server = PgServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres: PgServer) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped after the test."""
    url = postgres.create_database()
    try:
        yield url
    finally:
        postgres.drop_database(url)
