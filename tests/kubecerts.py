"""Credentials for the test Kubernetes (tests/kubecluster.py): a CA, the API server's serving
certificate, client certificates, static bearer tokens, the service-account signing key and
kubeconfig files.  ECDSA P-256 throughout: fast to make, and accepted by Kubernetes 1.20."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass
class Pki:
    """Everything under `dir`: ca.crt, apiserver.{crt,key}, sa.{key,pub}, tokens.csv and one
    .crt/.key pair per client certificate made."""

    dir: Path
    ca_key: ec.EllipticCurvePrivateKey = field(default_factory=_key)
    tokens: dict[str, str] = field(default_factory=dict)  # user -> token

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("mgpu-test-kubernetes-ca"))
            .issuer_name(_name("mgpu-test-kubernetes-ca"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.ca_key, hashes.SHA256())
        )  # fmt: skip
        self.ca_path.write_bytes(self.ca_cert.public_bytes(serialization.Encoding.PEM))
        sa_key = _key()
        _write_key(self.dir / "sa.key", sa_key)
        (self.dir / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @property
    def ca_path(self) -> Path:
        return self.dir / "ca.crt"

    def issue(
        self,
        stem: str,
        cn: str,
        org: str | None = None,
        *,
        server_ips: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A certificate signed by the CA: a server one where names or IPs are given, else a
        client one (CN = user, O = group).  Returns (cert path, key path)."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        server = bool(server_ips or server_names)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        crt, key_path = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return crt, key_path

    def token(self, user: str, groups: tuple[str, ...] = ()) -> str:
        """A static bearer token for `user` (in tokens.csv, the API server's --token-auth-file;
        add them all before the server starts)."""
        token = secrets.token_hex(16)
        self.tokens[user] = token
        line = f'{token},{user},{user},"{",".join(groups)}"\n'
        with open(self.dir / "tokens.csv", "a") as fh:
            fh.write(line)
        return token


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    cert: tuple[Path, Path] | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """A kubeconfig with one cluster, user and (current) context."""
    user: dict[str, str] = {}
    if cert is not None:
        user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    if token is not None:
        user["token"] = token
    context: dict[str, str] = {"cluster": "test", "user": "test"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": context}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
