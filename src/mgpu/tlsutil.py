"""The cluster's own CA and the master's certificate, and how peers pin them.

At first start the master makes a CA and a server certificate in its state dir
(the `cryptography` package).  Tokens end with the CA's SHA-256 fingerprint, so
an agent or client holding a token can check, on first contact, that the CA the
master presents is the one the token names (as kubeadm's discovery hash and
k3s's tokens do) — no file to copy.  After that, connections are verified TLS
against the pinned CA.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import socket
import ssl
from pathlib import Path

from mgpu.privatefile import write_private

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.crt"
SERVER_KEY = "server.key"


def fingerprint_pem(pem: bytes) -> str:
    """SHA-256 of the certificate's DER bytes, hex."""
    der = ssl.PEM_cert_to_DER_cert(pem.decode())
    return hashlib.sha256(der).hexdigest()


def _local_names() -> tuple[list[str], list[str]]:
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    ips = {"127.0.0.1", "::1"}
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    ips.add(a.address.split("%")[0])
    except Exception:
        pass
    return sorted(n for n in names if n), sorted(ips)


def ensure_ca(state_dir: Path) -> str:
    """Create the CA (once) and return its fingerprint."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path = state_dir / CA_CERT
    if not cert_path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mgpu cluster CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        write_private(
            state_dir / CA_KEY,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return fingerprint_pem(cert_path.read_bytes())


def ensure_server_cert(state_dir: Path, extra_names: list[str] | None = None) -> tuple[Path, Path]:
    """A server certificate signed by the CA, for this machine's names and addresses.

    Peers verify it against the pinned CA (not the host name they dialled), so it
    keeps working behind NAT or under another name; the SANs are for other tools.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ensure_ca(state_dir)
    cert_path, key_path = state_dir / SERVER_CERT, state_dir / SERVER_KEY
    names, ips = _local_names()
    names += [n for n in (extra_names or []) if n not in names]
    ca_key = serialization.load_pem_private_key((state_dir / CA_KEY).read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((state_dir / CA_CERT).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    for ip in ips:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            continue
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mgpu master")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """Verify the master against the pinned cluster CA only."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode())
    ctx.check_hostname = False  # identity is the CA, which only this cluster has
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class CAFetchError(ConnectionError):
    """Something answered, but not with the master's CA (not an mgpu master?)."""


class CAMismatch(ssl.SSLError):
    """The CA the master presented is not the one the token names."""

    def __str__(self) -> str:
        return str(self.args[0])  # SSLError's own shows the args tuple


def fetch_pinned_ca(host: str, port: int, fingerprint: str, timeout: float) -> bytes:
    """Fetch the master's CA over an unverified TLS connection and check it against the
    fingerprint the token carries; only a matching CA is ever trusted.

    Raises CAMismatch when the CA does not match, ssl.SSLError when TLS itself fails, and
    an OSError
    for every other failure: the socket's own (refused, timed out, reset), or
    CAFetchError when something answered that is not the master's CA.  (The minimal
    client transport, not http.client: that would cost the CLI 40 ms of imports.)"""
    from mgpu.wire import Connection

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = Connection(host, port, timeout, ctx)
    try:
        conn.settimeout(timeout)
        resp = conn.request("GET", "/api/ca", None, {"Connection": "close"})
        pem = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise CAFetchError(f"it answered HTTP {resp.status} when asked for its CA")
    try:
        found = fingerprint_pem(pem)
    except (ValueError, UnicodeDecodeError):
        raise CAFetchError("it answered with no CA certificate (is it an mgpu master?)") from None
    if found != fingerprint.lower():
        raise CAMismatch(
            f"the master at {host}:{port} presented a CA that does not match the token "
            "(wrong cluster, or someone in between)"
        )
    return pem


def cached_ca(
    host: str, port: int, fingerprint: str, timeout: float, cache_dir: str | None = None
) -> bytes:
    """The pinned CA, from `cache_dir` (default ~/.cache/mgpu; by fingerprint) or fetched
    and checked once.  Once kept there, the client or agent dials this cluster only in
    TLS (mgpu.masters.Transport)."""
    from mgpu.masters import pinned_ca_path

    path = Path(pinned_ca_path(fingerprint, cache_dir))
    cache = path.parent
    try:
        pem = path.read_bytes()
        if fingerprint_pem(pem) == fingerprint.lower():
            return pem
    except (OSError, ValueError):
        pass
    pem = fetch_pinned_ca(host, port, fingerprint, timeout)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pem)
    except OSError:
        pass  # a read-only home only costs a fetch next time
    return pem
