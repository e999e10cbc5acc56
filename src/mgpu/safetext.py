"""Text from users made safe to print on someone else's terminal.

A job name, a command, a node's reason or an audit row's request path is shown to other
users (`mgpu queue`, `mgpu show`, `mgpu audit`).  Printed raw, an ESC in it could move the
cursor, recolour or retitle the reader's terminal, or hide the rest of a line (CR, bidi
overrides).  `escape_controls` writes every character that is not printable as its Python
escape (`\\x1b`, `\\n`, `\\u202e`, as `repr` writes them), so it is seen, not obeyed;
normal text (any script, spaces, punctuation) is left as it is.

Standard library only, and not even that: `mgpu queue` imports it (tests/unit/
test_cli_startup.py keeps that path free of `re` and friends).
"""

from __future__ import annotations

__all__ = ["escape_controls", "escape_optional"]


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """`text` with each non-printable character (C0 and C1 controls, DEL, format
    characters such as bidi overrides, line and paragraph separators, lone surrogates)
    replaced by its escape; printable text is returned as it is."""
    if text.isprintable():  # the common case, in C
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def escape_optional(text: str | None) -> str | None:
    """`escape_controls` for a value that may be absent."""
    return None if text is None else escape_controls(text)
