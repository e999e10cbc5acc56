"""`loads` and `dumps` as the `json` package has them, without importing that package.

Why: `import json` imports `re` (and `re` imports `enum`), about 4 ms of the 20 ms that
`mgpu queue` may take in all.  The work is done by the same C accelerator, `_json`, that
`json.loads` and `json.dumps` use themselves, called the way the package calls it, so the
results are identical (tests/unit/test_cli_startup.py compares them).  Where `_json` is
missing (not CPython), this is the `json` package.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - not CPython: the json package does it all
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"


class _Options:
    """What the C scanner reads from a `json.JSONDecoder()`: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity: what float() makes of them


_scan = None if _json is None else _json.make_scanner(_Options())  # type: ignore[arg-type]


def loads(data: str | bytes) -> Any:
    """`json.loads(data)`: ValueError for what is not JSON; bytes are UTF-8."""
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(data)
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as e:
        raise ValueError(f"not JSON: expecting a value at character {e.value}") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"not JSON: extra data at character {end}")
    return value


def _unserializable(value: object) -> None:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """`json.dumps(value)`, with its default options."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value)
    # A new encoder each time, with its own map for catching circular references.
    encode = _json.make_encoder(
        {}, _unserializable, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )
    return "".join(encode(value, 0))


__all__ = ["dumps", "loads"]
