"""`mgpu master`: load the config, open the state dir, serve."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mgpu.config import ClusterConfig, load_config


def default_state_dir() -> Path:
    env = os.environ.get("MGPU_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path("~/.local/state/mgpu").expanduser()


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_master(
    host: str | None,
    port: int | None,
    state_dir: Path,
    config_path: str | None,
    verbose: bool = False,
    tls: bool | None = None,
) -> None:
    """tls: True forces it, False refuses it (loudly), None = on for non-loopback binds."""
    import uvicorn

    from mgpu.master.app import create_app

    setup_logging(verbose)
    config: ClusterConfig = load_config(config_path)
    host = host or (config.cluster.master.host if config_path else "127.0.0.1")
    port = port or (config.cluster.master.port if config_path else 8080)
    state_dir.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("mgpu.master")
    from mgpu.client.credentials import is_loopback

    if tls is None:
        tls = not is_loopback(host)
    elif tls is False and not is_loopback(host):
        log.warning(
            "INSECURE: serving plain HTTP on %s: tokens and job output cross the network "
            "unencrypted. Drop --insecure to serve TLS.",
            host,
        )
    ssl_args: dict[str, str] = {}
    if tls:
        from mgpu.tlsutil import ensure_server_cert

        cert, key = ensure_server_cert(state_dir)
        ssl_args = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    first_start = not (state_dir / "join-token").exists()
    app = create_app(state_dir, config, announce=(host, port, first_start))
    log.info(
        "mgpu master on %s://%s:%d, state in %s", "https" if tls else "http", host, port, state_dir
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="debug" if verbose else "warning",
        access_log=verbose,
        ws_ping_interval=None,
        ws_per_message_deflate=False,
        ws_max_size=64 * 1024 * 1024,
        **ssl_args,  # type: ignore[arg-type]
    )
