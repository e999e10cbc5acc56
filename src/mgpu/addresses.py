"""Master addresses as users write them: `HOST[:PORT],HOST[:PORT]` (several masters, one
leads), each optionally `http://` or `https://`, an IPv6 host in brackets (`[::1]:8080`).

Shared by the client (`--host`, `$MGPU_MASTER`, `Client("a:8080,b:8080")`) and the agent
(`mgpu node --master-host`, repeatable).  Imports nothing: `mgpu queue` parses its
address before anything else and must start fast.
"""

from __future__ import annotations

__all__ = ["AddressError", "format_address", "parse_addresses", "split_scheme"]


class AddressError(ValueError):
    """An address list that cannot be read: said in one sentence."""


def split_scheme(text: str) -> tuple[str | None, str]:
    """("https", "h:1") for "https://h:1"; (None, text) without a scheme."""
    if "://" in text:
        scheme, _, rest = text.partition("://")
        return scheme.lower(), rest
    return None, text


def _one(item: str, default_port: int, what: str) -> tuple[str, int]:
    text = item.rstrip("/")
    if text.startswith("["):  # [v6] or [v6]:port
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise AddressError(f"{what}: {item!r} is not HOST[:PORT]")
        port_text = rest[1:]
    elif text.count(":") > 1:  # a bare IPv6 address: no port
        host, port_text = text, ""
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise AddressError(f"{what}: {item!r} has no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"{what}: {item!r} is not HOST[:PORT] (the port is not a number)")
    return host, int(port_text)


def parse_addresses(
    text: str | list[str] | tuple[str, ...], default_port: int, what: str = "address"
) -> tuple[str | None, list[tuple[str, int]]]:
    """The scheme (the first one given, else None) and the (host, port) of each comma-
    separated address in `text` (a list: each of its items may hold several); a host
    without a port takes `default_port`.  Duplicates are dropped, the order is kept."""
    items = [text] if isinstance(text, str) else list(text)
    scheme: str | None = None
    out: list[tuple[str, int]] = []
    for chunk in items:
        for raw in chunk.split(","):
            raw = raw.strip()
            if not raw:
                continue
            given, rest = split_scheme(raw)
            if given is not None:
                if given not in ("http", "https"):
                    raise AddressError(f"{what}: {raw!r}: only http:// or https://")
                scheme = scheme or given
            address = _one(rest, default_port, what)
            if address not in out:
                out.append(address)
    if not out:
        raise AddressError(f"{what}: no address given")
    return scheme, out


def format_address(address: tuple[str, int]) -> str:
    """ "host:port" ("[v6]:port" for an IPv6 host), as parse_addresses reads it."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
