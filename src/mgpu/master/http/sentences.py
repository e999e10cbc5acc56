"""One sentence for a request the API refuses as invalid: the option named as the user
typed it (``--gpus-per-node``, ``--env[NAME]``), never pydantic's wording or a traceback."""

from __future__ import annotations

import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

__all__ = ["validation_sentence"]

_SHOULD = re.compile(r"^(?:Input|String|List|Dictionary|Value|Tuple|Set) should ")


def _shown(part: object) -> str:
    """A piece of an error location as the user may see it: printable, short, encodable."""
    text = str(part)
    if len(text) > 40 or not text.isprintable():
        return ascii(text[:40] + ("..." if len(text) > 40 else ""))
    return text


def validation_sentence(exc: RequestValidationError | ValidationError) -> str:
    """One sentence for a refused request, naming the option as the user typed it
    (``--gpus-per-node``, ``--env[NAME]``), not the JSON field; no pydantic wording."""
    err = exc.errors()[0]
    kind = err.get("type", "")
    raw_loc = tuple(err.get("loc", ()))
    if kind == "json_invalid":
        why = (err.get("ctx") or {}).get("error", "")
        at = f" at character {raw_loc[1]}" if len(raw_loc) > 1 else ""
        return f"the request body is not valid JSON ({why}{at})"
    if kind in ("value_error", "assertion_error"):
        # Our own validators' messages are whole sentences that name the option.
        return str((err.get("ctx") or {}).get("error", err.get("msg", "invalid value")))
    loc = [p for p in raw_loc if p not in ("body", "query", "path")]
    if kind == "string_unicode":  # a key pydantic cannot read as text (a lone surrogate)
        return f"{_where(loc) if loc else 'a field name of the request'} is not valid UTF-8"
    if not loc:
        if kind == "missing":
            return "the request body is missing; send a JSON object"
        if kind in ("model_attributes_type", "model_type", "dict_type"):
            return "the request body must be a JSON object"
        return "the request body " + _predicate(str(err.get("msg", "")))
    where = _where(loc)
    if kind == "extra_forbidden":
        return f"{where} is not an option of this request"
    if kind == "missing":
        return f"{where} is required"
    return f"{where} {_predicate(str(err.get('msg', '')))}"


def _where(loc: list[Any]) -> str:
    """A JSON location as the option the user typed: `--gpus-per-node`, `--env[NAME]`."""
    return "--" + _shown(loc[0]).replace("_", "-") + "".join(f"[{_shown(p)}]" for p in loc[1:])


def _predicate(msg: str) -> str:
    """pydantic's "Input should be a valid integer" as "must be a valid integer"."""
    if _SHOULD.match(msg):
        return _SHOULD.sub("must ", msg)
    return f"is not valid: {msg[:1].lower()}{msg[1:]}" if msg else "is not valid"
