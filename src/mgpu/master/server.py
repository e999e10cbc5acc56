"""`mgpu master`: load the config, open the state dir, serve."""

from __future__ import annotations

import copy
import logging
import os
import stat
from pathlib import Path
from typing import Any

from mgpu import logredact
from mgpu.config import ClusterConfig, load_config
from mgpu.dbaddress import describe, parse
from mgpu.master.ha.leadership import Leadership, LeaseTiming, advertised_address


def default_state_dir() -> Path:
    env = os.environ.get("MGPU_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path("~/.local/state/mgpu").expanduser()


WS_MAX_SIZE = 16 << 20
"""Bytes of one WebSocket message the master accepts (agents, terminals)."""

PRIVATE_UMASK = 0o077
"""Everything the master writes is its own: tokens, the CA key, jobs' environments, output."""


def secure_state_dir(state_dir: Path) -> None:
    """Make the state dir 0700 and its files 0600, whatever the umask of whoever made them.

    The dir alone keeps other accounts out, so files are fixed one by one only when it was
    not private yet (a state dir of an older version, or one made by hand): a start costs
    one stat, not a walk over every job's output.  The database is chmod-ed every time,
    because SQLite gives its -wal and -shm the database file's mode."""
    try:
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        state_dir.mkdir(mode=0o700, exist_ok=True)
        was_open = state_dir.stat().st_mode & 0o077
        os.chmod(state_dir, 0o700)
    except OSError as e:
        from mgpu.errors import MgpuError

        raise MgpuError(f"cannot use {state_dir} as the state dir: {e.strerror}") from None
    if was_open:
        for root, dirs, files in os.walk(state_dir):
            for name in dirs:
                _make_private(Path(root, name), 0o700)
            for name in files:
                _make_private(Path(root, name), 0o600)
    else:
        for name in ("mgpu.db", "mgpu.db-wal", "mgpu.db-shm"):
            _make_private(state_dir / name, 0o600)


def _make_private(path: Path, mode: int) -> None:
    try:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
            os.chmod(path, mode)
    except OSError:
        pass  # gone meanwhile, or another account's (a job's exit file under `mgpu up`)


def setup_logging(verbose: bool) -> None:
    """The master's and the agent's logging: to stderr, every handler filtered so that no
    token or secret header reaches a log (logredact.py)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logredact.install()


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging set-up (its handlers, its formats) with the filter on each
    handler: uvicorn installs them after `setup_logging`, and the `websockets` library logs
    every handshake header (a client's `Authorization` included) through them at --verbose."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": logredact.RedactSecrets}
    config["filters"]["refusals"] = {"()": HandshakeRefusals}
    for handler in config["handlers"].values():
        handler["filters"] = [*handler.get("filters", []), "redact", "refusals"]
    return config


class HandshakeRefusals(logging.Filter):
    """uvicorn logs an error for every WebSocket refused with an HTTP answer (a standby's
    503, a bad token's 401), which is how the master means to refuse them: not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing handshake."


def raise_fd_limit() -> int:
    """Raise the soft limit on open descriptors to the hard one (as Go programs do at
    start): the usual soft 1,024 is less than one address may hold (connections_per_address);
    the number of descriptors the master may now have."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # kept as it was: the cap per address still bounds each client
    return soft


def _leadership(
    state_dir: Path,
    config: ClusterConfig,
    database: str,
    secret_file: str | None,
    host: str,
    port: int,
    tls: bool,
) -> Leadership:
    """A master of several on one database: the cluster's identity loaded (or stored, by
    the first master; its token files marked for `tls`), and its part in the election, not
    started yet."""
    from mgpu.master.ha.identity import load_identity, read_secret
    from mgpu.master.store.fence import Fence

    load_identity(state_dir, database, read_secret(secret_file), tls=tls)
    ha = config.ha
    timing = LeaseTiming(ttl=ha.lease_ttl, renew=ha.renew_interval, retry=ha.retry_interval)
    return Leadership(database, advertised_address(host, port), Fence(), timing)


def check_kube_templates(config: ClusterConfig) -> None:
    """The Kubernetes partitions' Pod templates, dry-run on their API servers: a master
    whose template is refused does not start (one sentence per problem)."""
    import asyncio

    from mgpu.errors import MgpuError
    from mgpu.master.kube.validate import check_partitions

    errors = asyncio.run(check_partitions(config))
    if errors:
        raise MgpuError("\n".join(errors))


def run_master(
    host: str | None,
    port: int | None,
    state_dir: Path,
    config_path: str | None,
    verbose: bool = False,
    tls: bool | None = None,
    database: str | None = None,
    cluster_secret_file: str | None = None,
    advertise: str | None = None,
) -> None:
    """tls: True forces it, False refuses it (loudly), None = on for non-loopback binds.

    database: a PostgreSQL URL shared with other masters (else `database:` in the config;
    none: SQLite in the state dir): this master then needs the cluster secret
    (`cluster_secret_file` or $MGPU_CLUSTER_SECRET), loads the cluster's identity from the
    database, and stands by until it takes the leader's lease (master/ha); `advertise`:
    the HOST:PORT it is reached at, which standbys tell clients while it leads."""
    import uvicorn

    from mgpu.master.http.app import create_app
    from mgpu.master.http.connections import ConnectionLimits, protocol_class

    setup_logging(verbose)
    from mgpu.master.runtime.testclock import install_from_env

    install_from_env()  # a test hook, off unless $MGPU_TEST_CLOCK_OFFSET_FILE is set
    config: ClusterConfig = load_config(config_path)
    if database:
        config.database = database
    host = host or (config.cluster.master.host if config_path else "127.0.0.1")
    port = port or (config.cluster.master.port if config_path else 8080)
    if config.kube_partitions():
        check_kube_templates(config)
    secure_state_dir(state_dir)
    os.umask(PRIVATE_UMASK)  # what it writes from now on: the DB, output, certificates
    log = logging.getLogger("mgpu.master")
    first_start = not (state_dir / "join-token").exists()
    from mgpu.credentials import is_loopback

    if tls is None:
        tls = not is_loopback(host)
    elif tls is False and not is_loopback(host):
        log.warning(
            "INSECURE: serving plain HTTP on %s: tokens and job output cross the network "
            "unencrypted. Drop --insecure to serve TLS.",
            host,
        )
    leadership = None
    if config.database:
        parse(config.database, "the database")  # one sentence here, not libpq's later
        leadership = _leadership(
            state_dir, config, config.database, cluster_secret_file, host, port, tls
        )
        leadership.address = advertised_address(host, port, advertise)
    ssl_args: dict[str, str] = {}
    if tls:
        from mgpu.tlsutil import ensure_server_cert

        cert, key = ensure_server_cert(state_dir)
        ssl_args = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    fds = raise_fd_limit()
    master_conf = config.cluster.master
    if master_conf.connections_per_address * 2 > fds:
        log.warning(
            "one address may hold %d connections, half or more of the %d descriptors the "
            "master may open (ulimit -n): lower cluster.master.connections_per_address",
            master_conf.connections_per_address,
            fds,
        )
    limits = ConnectionLimits(master_conf.header_timeout, master_conf.connections_per_address)
    if leadership is None:
        from mgpu.master.store import open_store

        store = open_store(config.database, state_dir)
    else:
        store = None  # opened when it leads: what it loads is the state then
    app = create_app(
        state_dir,
        config,
        announce=(host, port, first_start),
        leadership=leadership,
        store=store,
        tls=tls,
    )
    log.info(
        "mgpu master on %s://%s:%d, state in %s",
        "https" if tls else "http",
        host,
        port,
        describe(config.database) if config.database else state_dir,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="debug" if verbose else "warning",
        log_config=uvicorn_log_config(),
        access_log=verbose,
        # Each request's head within header_timeout; at most so many connections per
        # address (connections.py).
        http=protocol_class(limits),
        ws_ping_interval=None,
        ws_per_message_deflate=False,
        # The largest message an agent sends is a few MiB (a batch of frames, 1 MiB of
        # text, plus one message); whoever can reach the port may send one before its
        # hello is checked, so this is what one such connection can hold.
        ws_max_size=WS_MAX_SIZE,
        # uvicorn believes X-Forwarded-For/-Proto from loopback by default: any local
        # account could then write any address into the audit log and dodge the
        # bad-token throttle (per address).  The master serves clients directly.
        proxy_headers=False,
        forwarded_allow_ips=[],
        # An idle keep-alive TLS connection otherwise holds a SIGTERM'd master up for
        # ~30 s (uvicorn waits for it); state is flushed by the lifespan's end anyway.
        timeout_graceful_shutdown=3,
        **ssl_args,  # type: ignore[arg-type]
    )
