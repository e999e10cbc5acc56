"""No secret in any log line: a filter on every handler the master and the agent set up
rewrites tokens and the values of headers that carry secrets, whichever logger wrote
the record (ours, uvicorn's, the `websockets` library's handshake headers at --verbose,
httpx's).

It works on the text a record will print: its message (and arguments), and the text of
its traceback, so a secret inside an exception's message is caught too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

__all__ = ["REDACTED", "RedactSecrets", "install", "redact"]

REDACTED = "<redacted>"

_TOKEN = re.compile(
    # mgpu_, mgpujob_ and mgpunode_ secrets (tokens.py, master/security/): random text that
    # holds an upper-case letter, a digit or a dash, so a metric name like
    # mgpu_event_loop_hold_seconds is left alone; then the CA fingerprint and the TLS mark,
    # if any.
    r"\bmgpu(?:job|node)?_(?=[\w-]*[A-Z0-9-])[\w-]{16,}(?:\.[\w:]+){0,2}"
)
_HEADER = re.compile(
    # `Authorization: Bearer x`, `('cookie', 'a=b')`, `X-Auth-Token=x`: the value to the end
    # of the line or its closing quote.
    r"(?i)(\b(?:proxy-)?authorization|\b(?:set-)?cookie|\bx-[\w-]*token)"
    r"(['\"]?\s*[:=,]\s*(?:b?['\"])?)([^'\"\r\n]+)"
)
_QUERY = re.compile(r"(?i)(\w*token=)[^&\s'\"<>]+")  # not a placeholder: TOKEN=<the token>


def redact(text: str) -> str:
    """`text` with every token and secret-carrying header value replaced."""
    if "mgpu" not in text and not _maybe_header(text):
        return text  # the common case: one scan for a few letters, no regex
    text = _HEADER.sub(rf"\1\2{REDACTED}", text)
    text = _QUERY.sub(rf"\1{REDACTED}", text)
    return _TOKEN.sub(REDACTED, text)


def _maybe_header(text: str) -> bool:
    low = text.lower()
    return "auth" in low or "cookie" in low or "token" in low


def _clean(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


class RedactSecrets(logging.Filter):
    """A handler's filter: rewrites the record in place, never drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Arguments one by one first, keeping their shape: uvicorn's access formatter
        # unpacks them.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: _clean(v) for k, v in record.args.items()}
        try:
            message = record.getMessage()
        except Exception:
            return True  # a bad format: logging reports it as it would have
        clean = redact(message)
        if clean != message:  # a secret inside an argument that is not text (bytes, a URL)
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactSecrets()


def install(handlers: Iterable[logging.Handler] | None = None) -> None:
    """Put the filter on `handlers`, by default on every handler of every logger there is
    now (the root's included).  Idempotent."""
    if handlers is None:
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    for handler in handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(_FILTER)
