"""What the commands say on stderr: errors and warnings, one line each, `mgpu: ...`.

Kept below `cli.py` and the `cmd_*` modules, which all speak this way; cheap to import
(`mgpu queue` loads it).
"""

from __future__ import annotations

import sys

from mgpu.safetext import escape_controls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def print_error(message: str) -> None:
    """`mgpu: error: ...` on stderr, one line whatever the master's sentence quotes
    (another user's job name, say)."""
    print(f"mgpu: error: {escape_controls(message)}", file=sys.stderr)


def fail(message: str, code: int = 1) -> NoReturn:
    """Say the error and exit with `code`."""
    print_error(message)
    raise SystemExit(code)


def warn(messages: list[str]) -> None:
    for message in messages:
        print(f"mgpu: warning: {message}", file=sys.stderr)
