"""A TLS master's tokens say so (`<secret>.<fingerprint>.tls`, mgpu.tokens): whoever holds
one dials that cluster only in TLS from the first contact (mgpu.masters.Transport), and a
master marks or unmarks its token files for the mode it serves in, the secret untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from impostor import Impostor
from mgpu.agent.agent import Agent
from mgpu.agent.options import AgentOptions
from mgpu.client import leader as leader_cache
from mgpu.client.api import Client
from mgpu.errors import MgpuError
from mgpu.master.security.auth import TokenStore, mark_token_file
from mgpu.master.store.base import Store
from mgpu.masters import Transport
from mgpu.tokens import parse_token, remarked, split_token, token_hash

FP = "ab" * 32
PLAIN = f"mgpu_secret.{FP}"
MARKED = f"mgpu_secret.{FP}.tls"
LOOPBACK = ("127.0.0.1", 8080)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no CA pinned
    for name in ("MGPU_MASTER", "MGPU_INSECURE", "MGPU_FAILOVER_WAIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(leader_cache, "_leaders", {})


@pytest.mark.parametrize(
    ("token", "secret", "fingerprint", "tls"),
    [
        (PLAIN, "mgpu_secret", FP, False),
        (MARKED, "mgpu_secret", FP, True),
        (f" {MARKED.upper()}\n", "MGPU_SECRET", FP.upper(), True),
        (f"mgpujob_j1_00ff.{FP}.tls", "mgpujob_j1_00ff", FP, True),
        (f"mgpu_secret.{FP}.other", "mgpu_secret", FP, False),
        ("mgpu_secret", "mgpu_secret", None, False),
        ("", "", None, False),
    ],
)
def test_one_reading_of_a_tokens_form(
    token: str, secret: str, fingerprint: str | None, tls: bool
) -> None:
    parts = parse_token(token)
    assert (parts.secret, parts.fingerprint, parts.tls) == (secret, fingerprint, tls)
    assert split_token(token) == (secret, fingerprint)


def test_the_mark_changes_no_tokens_hash() -> None:
    assert remarked(PLAIN, True) == MARKED and remarked(MARKED, False) == PLAIN
    assert remarked(MARKED, True) == MARKED and remarked(PLAIN + "\n", False) == PLAIN
    assert remarked("mgpu_no_fingerprint", True) == "mgpu_no_fingerprint"
    assert token_hash(PLAIN) == token_hash(MARKED) == token_hash(remarked(MARKED, False))


def test_a_tls_masters_token_means_tls_only() -> None:
    """No CA pinned: an unmarked token keeps the plain first try on loopback, a marked one
    is TLS on every address and refuses plain before any secret is sent."""
    plain = Transport(None, PLAIN)
    assert plain.tls(LOOPBACK) is False and plain.may_switch(LOOPBACK)
    assert plain.plain_refused(LOOPBACK) is None
    marked = Transport(None, MARKED)
    assert marked.fingerprint == FP and marked.ca_known()
    assert marked.tls(LOOPBACK) is True and not marked.may_switch(LOOPBACK)
    marked.switch(LOOPBACK, False)  # whatever a dial's retry would choose
    assert marked.tls(LOOPBACK) is True
    assert "its token is a TLS master's" in (marked.plain_refused(LOOPBACK) or "")
    # An unlisted address a standby names is dialled (in TLS, checked against the CA).
    assert marked.hinted("127.0.0.1:9", [LOOPBACK], 8080) == ("127.0.0.1", 9)
    # Told plain (`http://`, --insecure, $MGPU_INSECURE): obeyed, whatever the token says.
    told = Transport("http", MARKED)
    assert told.tls(LOOPBACK) is False and told.plain_refused(LOOPBACK) is None
    # An agent that finds a marked token later: TLS from then on.
    later = Transport(None, None)
    assert later.tls(LOOPBACK) is False
    later.use_token(MARKED)
    assert later.tls(LOOPBACK) is True and later.fingerprint == FP


def test_a_fresh_client_with_a_marked_token_sends_it_only_in_tls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Impostor() as impostor:
        for call in (lambda c: c.queue(), lambda c: c.attach("7")):
            with pytest.raises(MgpuError):
                call(Client(impostor.address, token=MARKED, connect_timeout=2))
        assert impostor.tls_hellos == impostor.connections() >= 2
    assert b"mgpu_secret" not in impostor.everything()
    assert Client(f"http://{impostor.address}", token=MARKED).tls is False
    monkeypatch.setenv("MGPU_INSECURE", "1")
    assert Client(impostor.address, token=MARKED).tls is False


def test_a_fresh_agent_with_a_marked_join_token_sends_no_hello_in_clear(
    tmp_path: Path,
) -> None:
    options = AgentOptions(
        node_id="n1", master_host="127.0.0.1", master_port=9, state_dir=tmp_path, token=MARKED
    )
    agent = Agent(options)
    assert agent.tls is True  # nothing pinned in its state dir: the token says TLS
    agent.tls = False  # however it came to be plain: refused before the hello
    with pytest.raises(ConnectionError, match="refusing to send a token"):
        asyncio.run(agent._converse(None))


@pytest.mark.parametrize("tls", [True, False])
def test_the_masters_token_files_follow_its_mode(store: Store, tmp_path: Path, tls: bool) -> None:
    """First start in one mode, the next ones in the other and back: the files are marked
    for each, and every token, marked or not, is the same token to the master."""
    first = TokenStore(store, tmp_path, FP, tls)
    first.bootstrap("alice")
    files = [tmp_path / "admin-token", tmp_path / "join-token"]
    made = [f.read_text() for f in files]
    assert all(parse_token(t).tls is tls and parse_token(t).fingerprint == FP for t in made)
    _, bob = first.create("bob", admin=False)
    assert parse_token(bob).tls is tls
    for mode in (not tls, tls):
        again = TokenStore(store, tmp_path, FP, mode)
        again.bootstrap("alice")
        now = [f.read_text() for f in files]
        assert now == [remarked(t, mode) + "\n" for t in made]
        assert (tmp_path / "admin-token").stat().st_mode & 0o777 == 0o600
        owner = again.user(now[0])
        assert owner is not None and owner.owner
        assert again.user(remarked(made[0], not mode)) == owner
        assert again.join(now[1]) and again.user(bob) is not None
    assert len(first.list()) == 3  # re-marking registered nothing new


def test_a_token_file_that_is_no_token_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "join-token"
    path.write_text("not a token.at all\n")
    mark_token_file(path, True)
    assert path.read_text() == "not a token.at all\n"
    mark_token_file(tmp_path / "missing", True)
    assert not (tmp_path / "missing").exists()
