"""The cluster's identity in the database (master/ha/identity.py): sealed with the cluster
secret, stored once, the same files in every master's state dir."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mgpu.master.ha import identity
from mgpu.master.ha.identity import FILES, IdentityError
from mgpu.master.store import identity as rows
from mgpu.tlsutil import ensure_ca
from mgpu.tokens import remarked

psycopg = pytest.importorskip("psycopg")

SECRET = b"the cluster's secret, forty bytes long!!"


def test_sealed_files_open_with_the_secret_only() -> None:
    files = {name: f"content of {name}\n" for name in FILES}
    sealed = identity.seal(files, SECRET)
    assert b"content of" not in sealed.sealed
    assert identity.unseal(sealed, SECRET) == files
    with pytest.raises(IdentityError, match="does not open the cluster identity"):
        identity.unseal(sealed, b"another secret of some length")


def test_the_secret_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    assert identity.read_secret(str(path), {}) == SECRET
    assert identity.read_secret(None, {"MGPU_CLUSTER_SECRET": "x" * 20}) == b"x" * 20
    with pytest.raises(IdentityError, match="needs the cluster secret"):
        identity.read_secret(None, {})
    with pytest.raises(IdentityError, match="at least 16"):
        identity.read_secret(None, {"MGPU_CLUSTER_SECRET": "short"})
    with pytest.raises(IdentityError, match="cannot read the cluster secret file"):
        identity.read_secret(str(tmp_path / "missing"), {})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=oct)
def test_a_secret_file_others_may_read_is_refused_as_ssh_refuses_a_key(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(mode)
    with pytest.raises(IdentityError) as refused:
        identity.read_secret(str(path), {"MGPU_CLUSTER_SECRET": "x" * 20})
    assert str(refused.value) == (
        f"permissions {mode:04o} for {path} are too open: the cluster secret file must be "
        f"readable by its owner only (chmod 600 {path})"
    )
    path.chmod(0o400)  # read-only for its owner: as good as 0600
    assert identity.read_secret(str(path), {}) == SECRET


def test_every_master_gets_the_first_ones_identity(tmp_path: Path, pg_url: str) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        fingerprint = identity.ensure_identity(first, conn, SECRET)
        assert identity.ensure_identity(second, conn, SECRET) == fingerprint
        with pytest.raises(IdentityError, match="does not open"):
            identity.ensure_identity(tmp_path, conn, b"not the cluster's secret at all")
        (stored,) = conn.execute(f"SELECT sealed FROM {rows.IDENTITY_TABLE}").fetchone()
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes()
        assert (second / name).stat().st_mode & 0o777 == 0o600
        assert (first / name).read_bytes().strip() not in bytes(stored)
    assert (first / "admin-token").read_text().strip().endswith("." + fingerprint)


def test_masters_starting_at_once_make_one_identity(tmp_path: Path, pg_url: str) -> None:
    dirs = [tmp_path / f"m{i}" for i in range(4)]
    start = threading.Barrier(len(dirs))
    prints: list[str] = []

    def one(state_dir: Path) -> None:
        state_dir.mkdir()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            start.wait()
            prints.append(identity.ensure_identity(state_dir, conn, SECRET))

    threads = [threading.Thread(target=one, args=(d,)) for d in dirs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(prints) == len(dirs) and len(set(prints)) == 1
    ca = {(d / "ca.crt").read_bytes() for d in dirs}
    assert len(ca) == 1


def test_import_keeps_a_sqlite_clusters_identity(tmp_path: Path, pg_url: str) -> None:
    old = tmp_path / "old"
    old.mkdir()
    fingerprint = ensure_ca(old)
    for name in ("join-token", "admin-token"):
        (old / name).write_text(f"mgpu_{name}.{fingerprint}\n")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert identity.import_identity(old, conn, SECRET)
        assert not identity.import_identity(old, conn, SECRET)  # the same: nothing to do
        other = tmp_path / "other"
        other.mkdir()
        ensure_ca(other)
        for name in ("join-token", "admin-token"):
            (other / name).write_text("mgpu_x.y\n")
        with pytest.raises(IdentityError, match="another cluster's identity"):
            identity.import_identity(other, conn, SECRET)
        new = tmp_path / "new"
        new.mkdir()
        assert identity.ensure_identity(new, conn, SECRET) == fingerprint
    for name in FILES:
        assert (new / name).read_bytes() == (old / name).read_bytes()


def test_import_needs_a_state_dir_with_an_identity(tmp_path: Path, pg_url: str) -> None:
    missing = r"no ca\.crt, ca\.key, join-token, admin-token"
    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        pytest.raises(IdentityError, match=missing),
    ):
        identity.import_identity(tmp_path, conn, SECRET)


def test_each_master_marks_its_own_token_files_for_its_mode(tmp_path: Path, pg_url: str) -> None:
    """The database keeps the tokens unmarked; each master's files say how it serves (a
    `--tls` master's end with `.tls`), the secrets the same everywhere."""
    tls_master, plain_master = tmp_path / "a", tmp_path / "b"
    tls_master.mkdir()
    plain_master.mkdir()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        fingerprint = identity.ensure_identity(tls_master, conn, SECRET, tls=True)
        identity.ensure_identity(plain_master, conn, SECRET, tls=False)
        unsealed = identity.unseal(identity.rows.read(conn), SECRET)  # type: ignore[arg-type]
        for name in ("join-token", "admin-token"):
            marked = (tls_master / name).read_text()
            assert marked.endswith(f".{fingerprint}.tls\n")
            assert (
                (plain_master / name).read_text()
                == unsealed[name]
                == remarked(marked, False) + "\n"
            )
        # A master moved from --tls to plain: unmarked at its next start; and back.
        identity.ensure_identity(tls_master, conn, SECRET, tls=False)
        assert (tls_master / "admin-token").read_text() == unsealed["admin-token"]
        identity.ensure_identity(tls_master, conn, SECRET, tls=True)
        # `mgpu db import` of a marked state dir: the same identity as the database's.
        assert not identity.import_identity(tls_master, conn, SECRET)
