"""No token in any log line (logredact.py): records of any logger, uvicorn's handlers
included, come out with tokens and secret headers replaced."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from mgpu import logredact
from mgpu.logredact import REDACTED, redact
from mgpu.master.server import uvicorn_log_config

TOKEN = "mgpu_Zx3kP-q9rTt2uVw8yA1bC4dE5fG6hJ7kL8mN9pQ0rS.3f9a1c"
JOB_TOKEN = "mgpujob_1a2b3c4d_9f8e7d6c5b4a39281706f5e4d3c2b1a0ffeeddccbbaa9988.3f9a1c"
NODE_SECRET = "mgpunode_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_aBcDe"


@pytest.mark.parametrize(
    "line",
    [
        f"< Authorization: Bearer {TOKEN}",
        f"< authorization: Bearer {TOKEN}",
        f"> authorization: Bearer {JOB_TOKEN}",
        f"headers [(b'authorization', b'Bearer {TOKEN}')]",
        f"token {NODE_SECRET} refused",
        f'GET /?token={TOKEN} HTTP/1.1" 200',
        f"env MGPU_TOKEN={JOB_TOKEN} set",
        "< Cookie: session=abc123secret",
        "< X-Auth-Token: abc123secret",
    ],
)
def test_a_secret_is_replaced(line: str) -> None:
    out = redact(line)
    assert REDACTED in out
    for secret in (TOKEN, JOB_TOKEN, NODE_SECRET, "abc123secret"):
        assert secret not in out
        assert secret.partition(".")[0] not in out  # nor the secret without its fingerprint


def test_a_tls_masters_token_goes_whole() -> None:
    """`<secret>.<fingerprint>.tls` (mgpu.tokens): the mark goes with the rest."""
    assert redact(f"token {TOKEN}.tls refused") == f"token {REDACTED} refused"


def test_a_header_keeps_its_name() -> None:
    assert redact(f"< authorization: Bearer {TOKEN}") == f"< authorization: {REDACTED}"


@pytest.mark.parametrize(
    "line",
    [
        "mgpu_event_loop_hold_seconds 0.12",
        "job 1a2b3c4d completed on node001",
        "mgpu master on http://127.0.0.1:8080",
        "    MGPU_JOIN_TOKEN=<the join token> mgpu node --node-id <NODE_ID>",
    ],
)
def test_other_text_is_left_alone(line: str) -> None:
    assert redact(line) == line


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger with one handler, as setup_logging leaves it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    logredact.install([handler])
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.mark.parametrize("name", ["websockets.server", "websockets.client", "uvicorn.error", "x"])
def test_records_of_any_logger_come_out_redacted(
    captured: io.StringIO, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logging.getLogger(name)
    # Another test may have run uvicorn's logging config (its loggers then stop at
    # "uvicorn", at INFO): here the record must reach the root's handler, at DEBUG.
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        logger = logging.getLogger(".".join(parts[:i]))
        monkeypatch.setattr(logger, "propagate", True)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "level", logging.NOTSET)
    logging.getLogger().manager._clear_cache()  # isEnabledFor's answers, kept per logger
    log.debug("< %s: %s", "Authorization", f"Bearer {TOKEN}")  # websockets' header lines
    log.debug("hello from %r", {"token": TOKEN})
    try:
        raise ValueError(f"bad token {TOKEN}")
    except ValueError:
        log.exception("failed")
    out = captured.getvalue()
    assert out.count(REDACTED) >= 3, out
    assert TOKEN.partition(".")[0] not in out
    assert "Traceback" in out and "ValueError: bad token" in out


def test_uvicorns_handlers_are_filtered_too() -> None:
    """uvicorn sets up its own handlers (after ours): each gets the filter, so its loggers,
    and `websockets`' through `uvicorn.error`, print no token."""
    import logging.config

    config = uvicorn_log_config()
    saved = {n: logging.getLogger(n).handlers[:] for n in ("uvicorn", "uvicorn.access")}
    try:
        logging.config.dictConfig(config)
        for name in ("uvicorn", "uvicorn.access"):
            handlers = logging.getLogger(name).handlers
            assert handlers and all(
                any(isinstance(f, logredact.RedactSecrets) for f in h.filters) for h in handlers
            )
        access = logging.getLogger("uvicorn.access").handlers[0]
        stream = io.StringIO()
        assert isinstance(access, logging.StreamHandler)
        access.setStream(stream)
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/?token={TOKEN}", "1.1", 200
        )
        out = stream.getvalue()
        assert "GET /?token=<redacted> HTTP/1.1" in out and TOKEN not in out, out
    finally:
        for name, handlers in saved.items():
            logging.getLogger(name).handlers = handlers
