"""How to reach a Kubernetes API server: a kubeconfig file, or the in-cluster service account.

A kubeconfig's current (or named) context gives the server, its CA (file or inline data, or
`insecure-skip-tls-verify`), and the user: a client certificate and key (files or inline
data) and/or a bearer token (inline or `tokenFile`).  Exec and auth-provider plugins are not
supported (they run programs on the master's behalf): such a file is refused with a sentence.
Inside a Pod, the service account's token, CA and namespace are files under
/var/run/secrets/kubernetes.io/serviceaccount and the server is KUBERNETES_SERVICE_HOST/PORT;
the token file is read again for each request (the kubelet rotates bound tokens)."""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mgpu.errors import MgpuError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(MgpuError):
    """The credentials cannot be loaded; one sentence saying which and why."""


@dataclass(frozen=True)
class Credentials:
    """Everything a request needs: where (`server`), how TLS is checked (`verify`: a context
    with the CA and any client certificate, or False), which bearer token, if any."""

    server: str
    verify: ssl.SSLContext | bool
    origin: str  # for messages: "kubeconfig /etc/mgpu/kubeconfig" or "in-cluster service account"
    namespace: str = "default"
    token: str | None = None
    token_file: Path | None = None

    def bearer(self) -> str | None:
        """The token to send now (a token file is read each time: it may have been rotated)."""
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as exc:
                raise KubeConfigError(
                    f"{self.origin}: cannot read token file {self.token_file} ({exc.strerror})."
                ) from None
        return self.token


def _pick(entries: Any, name: str, what: str, origin: str) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(what)
            return value if isinstance(value, dict) else {}
    raise KubeConfigError(f"{origin}: no {what} named {name!r}.")


def _inline(value: str, field: str, origin: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise KubeConfigError(f"{origin}: {field} is not valid base64.") from None


def _file(base: Path, value: str, field: str, origin: str) -> Path:
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise KubeConfigError(f"{origin}: {field} {path} does not exist.")
    return path


def _context(
    cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path, origin: str
) -> ssl.SSLContext | bool:
    """The TLS context for one cluster + user entry of a kubeconfig."""
    if cluster.get("insecure-skip-tls-verify"):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        pem = _inline(cluster["certificate-authority-data"], "certificate-authority-data", origin)
        ctx = _ssl_or_error(
            lambda: ssl.create_default_context(cadata=pem.decode()), "the CA data", origin
        )
    elif cluster.get("certificate-authority"):
        ca = _file(base, cluster["certificate-authority"], "certificate-authority", origin)
        ctx = _ssl_or_error(lambda: ssl.create_default_context(cafile=str(ca)), str(ca), origin)
    else:
        ctx = ssl.create_default_context()
    cert, key = user.get("client-certificate"), user.get("client-key")
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if cert_data or key_data:
        if not (cert_data and key_data):
            raise KubeConfigError(
                f"{origin}: client-certificate-data needs client-key-data (and back)."
            )
        pem_cert = _inline(cert_data, "client-certificate-data", origin)
        pem_key = _inline(key_data, "client-key-data", origin)
        # ssl loads a certificate chain from files only: a private file, removed at once.
        with tempfile.TemporaryDirectory(prefix="mgpu-kube-") as tmp:
            pem_path = Path(tmp) / "client.pem"
            fd = os.open(pem_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem_cert + b"\n" + pem_key)
            _ssl_or_error(lambda: ctx.load_cert_chain(str(pem_path)), "the client data", origin)
    elif cert or key:
        if not (cert and key):
            raise KubeConfigError(f"{origin}: client-certificate needs client-key (and back).")
        cert_path = _file(base, cert, "client-certificate", origin)
        key_path = _file(base, key, "client-key", origin)
        _ssl_or_error(
            lambda: ctx.load_cert_chain(str(cert_path), str(key_path)), str(cert_path), origin
        )
    if cluster.get("tls-server-name"):
        # The name checked against the server's certificate, when it differs from the URL's.
        raise KubeConfigError(f"{origin}: tls-server-name is not supported.")
    return ctx


def _ssl_or_error(make: Any, what: str, origin: str) -> Any:
    try:
        return make()
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise KubeConfigError(f"{origin}: cannot load {what} ({exc}).") from None


def from_kubeconfig(path: str | Path, context: str | None = None) -> Credentials:
    """Credentials from a kubeconfig file's current context (or `context`)."""
    path = Path(path).expanduser()
    origin = f"kubeconfig {path}"
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeConfigError(f"Cannot read {origin} ({exc.strerror}).") from None
    except yaml.YAMLError:
        raise KubeConfigError(f"{origin} is not valid YAML.") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"{origin} is not a kubeconfig (no mapping at the top).")
    name = context or doc.get("current-context")
    if not name:
        raise KubeConfigError(f"{origin} has no current-context; name one.")
    ctx = _pick(doc.get("contexts"), str(name), "context", origin)
    cluster = _pick(doc.get("clusters"), str(ctx.get("cluster", "")), "cluster", origin)
    user = (
        _pick(doc.get("users"), str(ctx.get("user", "")), "user", origin) if ctx.get("user") else {}
    )
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{origin}: cluster {ctx.get('cluster')!r} has no https:// server.")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeConfigError(
                f"{origin}: user {ctx.get('user')!r} uses an {plugin} plugin, which mgpu does"
                " not run; give it a token or a client certificate."
            )
    base = path.parent
    token_file = (
        _file(base, user["tokenFile"], "tokenFile", origin) if user.get("tokenFile") else None
    )
    return Credentials(
        server=server.rstrip("/"),
        verify=_context(cluster, user, base, origin),
        origin=origin,
        namespace=str(ctx.get("namespace") or "default"),
        token=str(user["token"]) if user.get("token") else None,
        token_file=token_file,
    )


def in_cluster(
    account_dir: Path = SERVICE_ACCOUNT_DIR, environ: Mapping[str, str] | None = None
) -> Credentials:
    """Credentials of the Pod this process runs in (its service account)."""
    env = os.environ if environ is None else environ
    origin = "in-cluster service account"
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            "No kubeconfig given, and KUBERNETES_SERVICE_HOST/PORT are not set (not inside"
            " a Pod): name a kubeconfig."
        )
    token, ca = account_dir / "token", account_dir / "ca.crt"
    for needed in (token, ca):
        if not needed.is_file():
            raise KubeConfigError(f"{origin}: {needed} does not exist (is the token mounted?).")
    namespace_file = account_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    host = f"[{host}]" if ":" in host else host
    ctx = _ssl_or_error(lambda: ssl.create_default_context(cafile=str(ca)), str(ca), origin)
    return Credentials(
        server=f"https://{host}:{port}",
        verify=ctx,
        origin=origin,
        namespace=namespace,
        token_file=token,
    )


def load(kubeconfig: str | Path | None, context: str | None = None) -> Credentials:
    """A kubeconfig's credentials when one is named, else the in-cluster service account."""
    return from_kubeconfig(kubeconfig, context) if kubeconfig else in_cluster()
