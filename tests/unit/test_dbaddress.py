"""A database's address (mgpu/dbaddress.py): read as libpq reads it, shown without a secret,
and never taken with a password from a command line or a file other accounts may read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mgpu.config import ConfigError, load_config
from mgpu.dbaddress import UNREADABLE, AddressError, describe, from_command_line, parse, secrets
from mgpu.testing import BIN

PW = "Pw-s3cr3t"


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        # A URL: the password after the user, and in the query (libpq takes the last).
        (f"postgresql://mgpu:{PW}@db1:5432/mgpu", "postgresql://mgpu@db1:5432/mgpu"),
        (
            f"postgresql://mgpu@db1/mgpu?password={PW}&sslmode=verify-full",
            "postgresql://mgpu@db1/mgpu?sslmode=verify-full",
        ),
        (
            f"postgres://mgpu:x@db1/mgpu?sslpassword={PW}&password={PW}x",
            "postgresql://mgpu@db1/mgpu",
        ),
        (f"postgresql://mgpu:{PW}%40at@db1/mgpu", "postgresql://mgpu@db1/mgpu"),  # encoded
        # libpq ends the user at this `@`: the "user" holds the password; shown it is not.
        (f"postgresql://db1?password={PW}@db2/mgpu", "postgresql://db2/mgpu"),
        # libpq's keyword form, quoted values with spaces and escaped quotes included.
        (
            f"host=db1 port=5433 user=mgpu password={PW} dbname=mgpu",
            "postgresql://mgpu@db1:5433/mgpu",
        ),
        (
            f"host=db1 dbname='my db' password='{PW} with \\'quotes\\' and spaces' user=mgpu",
            "postgresql://mgpu@db1/my%20db",
        ),
        (
            f"host = db1  sslpassword = '{PW}' dbname=mgpu application_name='a b'",
            "postgresql://db1/mgpu?application_name=a%20b",
        ),
        # No password: the same address, as a URL.
        ("postgresql://mgpu@db1:5432/mgpu", "postgresql://mgpu@db1:5432/mgpu"),
        ("host=db1,db2 port=5432 dbname=mgpu", "postgresql://db1:5432,db2:5432/mgpu"),
        ("postgresql://[::1]:5432/mgpu", "postgresql://[::1]:5432/mgpu"),
        ("host=/run/postgresql dbname=mgpu", "postgresql:///mgpu?host=/run/postgresql"),
    ],
)
def test_describe_shows_an_address_without_its_secrets(address: str, shown: str) -> None:
    assert describe(address) == shown
    assert PW not in describe(address)


@pytest.mark.parametrize(
    "address",
    [
        f"mysql://root:{PW}@db1/mgpu",
        f"host=db1 password='{PW}",  # an unterminated quote
        f"host=db1 password {PW}",  # no `=`
        f"/var/lib/{PW}.db",
    ],
)
def test_an_address_libpq_cannot_read_is_never_shown(address: str) -> None:
    assert describe(address) == UNREADABLE
    with pytest.raises(AddressError) as refused:
        parse(address)
    assert PW not in str(refused.value) and "is not a PostgreSQL address" in str(refused.value)


def test_secrets_names_every_parameter_that_holds_one() -> None:
    assert secrets(parse(f"postgresql://u:{PW}@h/d?sslpassword=x")) == ["password", "sslpassword"]
    assert secrets(parse("host=h user=u dbname=d sslmode=require")) == []


@pytest.mark.parametrize(
    "database",
    [
        f"postgresql://mgpu:{PW}@db1/mgpu",
        f"postgresql://mgpu@db1/mgpu?password={PW}",
        f"postgresql://mgpu@db1/mgpu?sslpassword={PW}",
        f"host=db1 dbname=mgpu password={PW}",
        f"host=db1 dbname=mgpu password='{PW} quoted'",
    ],
)
def test_a_password_on_the_command_line_is_refused_without_being_shown(database: str) -> None:
    with pytest.raises(AddressError) as refused:
        from_command_line(database, None)
    message = str(refused.value)
    assert PW not in message and "\n" not in message
    assert message.startswith("--database holds a password, which every account")
    for place in ("~/.pgpass", "$PGPASSFILE", "$PGPASSWORD", "--database-file FILE"):
        assert place in message


def test_the_database_file_holds_the_password_and_only_its_owner_may_read_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "database"
    address = f"host=db1 dbname=mgpu password='{PW} x'"
    path.write_text(address + "\n")
    path.chmod(0o644)
    with pytest.raises(AddressError) as refused:
        from_command_line(None, str(path))
    assert str(refused.value) == (
        f"permissions 0644 for {path} are too open: a file holding a database's address "
        f"must be readable by its owner only (chmod 600 {path})"
    )
    path.chmod(0o600)
    assert from_command_line(None, str(path)) == address
    assert from_command_line("postgresql://mgpu@db1/mgpu", None) == "postgresql://mgpu@db1/mgpu"
    assert from_command_line(None, None) is None
    with pytest.raises(AddressError, match="not both"):
        from_command_line("postgresql://mgpu@db1/mgpu", str(path))
    with pytest.raises(AddressError, match="cannot read the database file"):
        from_command_line(None, str(tmp_path / "missing"))
    path.write_text(f"mysql://root:{PW}@db1/mgpu\n")
    with pytest.raises(AddressError) as bad:
        from_command_line(None, str(path))
    assert PW not in str(bad.value) and str(path) in str(bad.value)


def test_a_password_in_the_config_only_in_a_file_no_one_else_may_read(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"database: postgresql://mgpu:{PW}@db1/mgpu\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    assert PW not in message and "\n" not in message
    assert message.startswith(f"{path}: database: holds a password, but other accounts may")
    assert "(permissions 0644): chmod 600" in message and "~/.pgpass" in message
    path.chmod(0o600)
    assert load_config(path).database == f"postgresql://mgpu:{PW}@db1/mgpu"
    path.write_text("database: postgresql://mgpu@db1/mgpu\n")
    path.chmod(0o644)  # no password: anyone may read it
    assert load_config(path).database == "postgresql://mgpu@db1/mgpu"
    path.write_text(f"database: mysql://root:{PW}@db1/mgpu\n")
    with pytest.raises(ConfigError) as bad:
        load_config(path)
    assert PW not in str(bad.value) and "is not a PostgreSQL address" in str(bad.value)


def _mgpu(*args: str) -> subprocess.CompletedProcess[str]:
    if not (BIN / "mgpu").exists():
        pytest.skip("no mgpu console script next to this Python")
    return subprocess.run([str(BIN / "mgpu"), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [["master"], ["master", "--print-systemd-unit"]])
def test_mgpu_master_refuses_a_password_in_its_argv_and_writes_no_unit(
    tmp_path: Path, command: list[str]
) -> None:
    res = _mgpu(*command, "--state-dir", str(tmp_path), "--database", f"host=h password={PW}")
    assert res.returncode != 0 and res.stdout == ""
    assert PW not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--database holds a password" in res.stderr


def test_mgpu_db_import_refuses_a_password_in_its_argv(tmp_path: Path) -> None:
    res = _mgpu("db", "import", str(tmp_path), "--database", f"postgresql://u:{PW}@h/d")
    assert res.returncode != 0 and res.stdout == ""
    assert PW not in res.stderr and "--database holds a password" in res.stderr


def test_the_master_unit_names_the_database_file_not_its_password(tmp_path: Path) -> None:
    path = tmp_path / "database"
    path.write_text(f"postgresql://mgpu:{PW}@db1/mgpu?password={PW}\n")
    path.chmod(0o600)
    res = _mgpu(
        "master",
        "--state-dir",
        str(tmp_path / "state"),
        "--database-file",
        str(path),
        "--print-systemd-unit",
    )
    assert res.returncode == 0, res.stderr
    exec_start = next(ln for ln in res.stdout.splitlines() if ln.startswith("ExecStart="))
    assert f"--database-file {path}" in exec_start
    assert PW not in res.stdout and "--database " not in exec_start
    res = _mgpu("master", "--database", "postgresql://mgpu@db1/mgpu", "--print-systemd-unit")
    assert res.returncode == 0, res.stderr
    assert "--database postgresql://mgpu@db1/mgpu" in res.stdout
