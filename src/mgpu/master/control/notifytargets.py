"""Where a notification may go (`check_target`, at submit, and again for each delivery with
the addresses its name resolves to then): http or https only, or mailto when an SMTP relay
is configured; `notify.allowed_hosts` limits the hosts; a loopback, link-local, private or
otherwise non-public address is refused unless `allowed_hosts` names it, and an IPv6
address that embeds an IPv4 one (mapped, NAT64, 6to4, Teredo) is judged by that one too
(mgpu.master.control.notify sends what passes)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from mgpu import spec as specs
from mgpu.config import Notify as NotifyConfig

__all__ = [
    "NONE",
    "Target",
    "check_target",
    "is_listed",
    "is_public",
    "literal_address",
    "parse_target",
    "split_target",
]

MAX_TARGET_CHARS = 2048
NONE = "none"
"""`--notify none`: no notification, not even to the cluster's webhook."""

_EMAIL_RE = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9.-]{1,253}")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a notification goes: a webhook URL, or an e-mail address."""

    kind: str
    """"webhook" or "mail"."""
    value: str
    """The URL, or the address."""
    host: str = ""
    """The URL's host (lower case, no brackets), for the allowed-hosts and address rules."""
    port: int | None = None


def parse_target(text: str) -> str:
    """`--notify`'s value checked as text: an http(s) URL, `mailto:ADDRESS` or `none`;
    a bare e-mail address (as `--mail-user` takes it) becomes `mailto:ADDRESS`."""
    text = text.strip()
    if not text:
        raise specs.SpecError("--notify is empty; give an http(s) URL or mailto:ADDRESS")
    if len(text) > MAX_TARGET_CHARS:
        raise specs.SpecError(f"--notify is {len(text)} characters; at most {MAX_TARGET_CHARS}")
    if not text.isprintable() or any(c.isspace() for c in text):
        raise specs.SpecError("--notify must not contain spaces or control characters")
    if text.lower() == NONE:
        return NONE
    if "://" not in text and not text.lower().startswith("mailto:") and "@" in text:
        text = "mailto:" + text
    split_target(text)
    return text


def split_target(text: str) -> Target:
    if text.lower().startswith("mailto:"):
        address = text[len("mailto:") :]
        if _EMAIL_RE.fullmatch(address) is None:
            raise specs.SpecError(
                f"--notify {specs._q(text)}: {specs._q(address)} is not an address"
            )
        return Target("mail", address)
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as e:
        raise specs.SpecError(f"--notify {specs._q(text)} is not a URL ({e})") from None
    if url.scheme.lower() not in ("http", "https"):
        raise specs.SpecError(
            f"--notify {specs._q(text)}: only http://, https:// or mailto: targets are sent"
        )
    host = (url.hostname or "").lower()
    if not host:
        raise specs.SpecError(f"--notify {specs._q(text)} names no host")
    return Target("webhook", text, host, port)


def is_listed(host: str, allowed: Iterable[str]) -> bool:
    for pattern in allowed:
        pattern = pattern.lower().strip()
        if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for, where a host, the kernel or a
    translator on the way would reach them: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
    `::a.b.c.d`, SIIT `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002::/16` and
    Teredo's server and client."""
    found: list[ipaddress.IPv4Address] = []
    head, tail = ip.packed[:12], ipaddress.IPv4Address(ip.packed[12:])
    if head in (bytes(10) + b"\xff\xff", bytes(12), bytes(8) + b"\xff\xff\0\0") or ip in _NAT64:
        found.append(tail)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def is_public(address: str) -> bool:
    """Whether notifications may go to `address`: a global unicast address, and so is
    every IPv4 address it embeds (`::ffff:127.0.0.1` is loopback whatever its form)."""
    ip = ipaddress.ip_address(address)
    inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else []
    return all(a.is_global and not a.is_multicast for a in [ip, *inner])


def literal_address(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def check_target(text: str, config: NotifyConfig) -> Target | None:
    """The target of `--notify text` if this cluster sends there (None for `none`), else a
    SpecError with one sentence.  Names are not resolved here (a delivery checks the
    addresses it connects to); an address literal or `localhost` is judged now."""
    text = parse_target(text)
    if text == NONE:
        return None
    target = split_target(text)
    if target.kind == "mail":
        if config.smtp is None:
            raise specs.SpecError(
                f"--notify {text}: this cluster sends no e-mail (no notify.smtp in its config); "
                "use an http(s) webhook"
            )
        return target
    listed = is_listed(target.host, config.allowed_hosts)
    if config.allowed_hosts and not listed:
        raise specs.SpecError(
            f"--notify: {target.host} is not a host this cluster sends notifications to "
            f"(notify.allowed_hosts: {', '.join(config.allowed_hosts)})"
        )
    literal = literal_address(target.host)
    local = target.host == "localhost" or target.host.endswith(".localhost")
    if not listed and (local or (literal is not None and not is_public(literal))):
        raise specs.SpecError(
            f"--notify: {target.host} is a loopback, link-local or private address; "
            "notifications go only to public hosts unless notify.allowed_hosts names it"
        )
    return target
