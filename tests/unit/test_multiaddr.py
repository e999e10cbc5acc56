"""Several masters, one leading (issue 24), on the client's and the agent's side: address
lists (--host, $MGPU_MASTER, Client(), --master-host), the leader search against stand-in
masters (refusing, standby 503s with and without a leader, one that drops a request), the
bounded wait while a failover runs, streams resumed from the records already had, and the
agent's dial order, its standby handling and its check of the leader's generation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from factories import http_server
from impostor import Impostor
from mgpu.addresses import AddressError, format_address, parse_addresses
from mgpu.agent.agent import Agent, DeposedMaster, StandbyMaster
from mgpu.agent.health import check_masters
from mgpu.agent.options import AgentOptions
from mgpu.client import api
from mgpu.client import leader as leader_cache
from mgpu.client.api import Client, ConnectError, LostConnection, resolve_addresses
from mgpu.client.stream import print_logs
from mgpu.errors import MgpuError
from mgpu.masters import Search, Transport, pinned_ca_path
from mgpu.protocol import Welcome

MGPU = Path(sys.executable).parent / "mgpu"
FP = "ab" * 32
"""A CA fingerprint, as tokens end with."""
SECRET = f"mgpu_secret.{FP}"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MGPU_MASTER", raising=False)
    monkeypatch.delenv("MGPU_FAILOVER_WAIT", raising=False)
    monkeypatch.setenv("MGPU_TOKEN", "mgpu_test")
    monkeypatch.setattr(leader_cache, "_leaders", {})


@pytest.fixture
def dead() -> Iterator[str]:
    with socket.socket() as s:  # bound, not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


# ---- addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scheme", "found"),
    [
        ("h", None, [("h", 8080)]),
        ("h:1", None, [("h", 1)]),
        ("a:1,b", None, [("a", 1), ("b", 8080)]),
        (" a:1 , b:2 ,", None, [("a", 1), ("b", 2)]),
        ("a:1,a:1,b:2", None, [("a", 1), ("b", 2)]),
        ("https://a:1,b:2", "https", [("a", 1), ("b", 2)]),
        ("http://a:1/", "http", [("a", 1)]),
        ("[::1]:9,::1", None, [("::1", 9), ("::1", 8080)]),
    ],
)
def test_address_lists(text: str, scheme: str | None, found: list[tuple[str, int]]) -> None:
    assert parse_addresses(text, 8080) == (scheme, found)


def test_address_lists_repeated_and_shown() -> None:
    assert parse_addresses(["a:1,b", "c:3"], 9) == (None, [("a", 1), ("b", 9), ("c", 3)])
    assert format_address(("::1", 9)) == "[::1]:9"
    assert format_address(("h", 9)) == "h:9"


@pytest.mark.parametrize("text", ["", ",", "a:x", "a:0", "a:70000", ":1", "ftp://a:1", "[::1]x"])
def test_bad_address_lists_are_one_sentence(text: str) -> None:
    with pytest.raises(AddressError, match="--host"):
        parse_addresses(text, 8080, "--host")


def test_where_the_client_takes_its_masters(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_addresses() == (None, [("127.0.0.1", 8080)])
    monkeypatch.setenv("MGPU_MASTER", "a:1,b")
    assert resolve_addresses() == (None, [("a", 1), ("b", 8080)])
    assert resolve_addresses(None, 9) == (None, [("a", 1), ("b", 9)])  # --port: the default
    assert resolve_addresses("c", 9) == (None, [("c", 9)])  # --host wins over the variable
    assert resolve_addresses("c:1", 9) == (None, [("c", 9)])  # one address: --port, as ever
    assert Client("a:1,b:2").addresses == [("a", 1), ("b", 2)]
    assert Client(host="x:5,y").addresses == [("x", 5), ("y", 8080)]
    monkeypatch.setenv("MGPU_MASTER", "a:1,b:oops")
    with pytest.raises(api.MgpuError, match=r"\$MGPU_MASTER: 'b:oops' is not HOST\[:PORT\]"):
        Client()


# ---- stand-in masters ------------------------------------------------------------------


class _Master(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, *args: Any) -> None:
        pass


class Leader(_Master):
    posts: ClassVar[list[str]] = []
    keys: ClassVar[list[str | None]] = []
    """The Idempotency-Key of each POST."""

    def do_GET(self) -> None:
        self._answer(200, {"jobs": [], "nodes": []})

    def do_POST(self) -> None:
        self._body()
        type(self).posts.append(self.path)
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        self._answer(201, {"job_id": "1"})


class _Standby(_Master):
    asked: ClassVar[int] = 0


def standby(leader: str | None) -> type[_Standby]:
    class Standby(_Standby):
        asked = 0

        def _refuse(self) -> None:
            type(self).asked += 1
            where = f"the leader is {leader}" if leader else "no leader yet"
            body: dict[str, Any] = {"detail": f"this master is a standby; {where}"}
            body.update(role="standby", leader=leader)
            self._answer(503, body, {"X-Mgpu-Leader": leader} if leader else {})

        def do_GET(self) -> None:
            self._refuse()

        def do_POST(self) -> None:
            self._body()
            self._refuse()

    return Standby


class Dropper(_Master):
    """Reads the request, then closes the connection without an answer (a leader that died
    while it handled it)."""

    keys: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.close_connection = True

    def do_POST(self) -> None:
        self._body()
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        self.close_connection = True


def test_the_next_master_is_tried_and_the_leader_remembered(dead: str) -> None:
    with http_server(Leader) as leader:
        client = Client(f"{dead},{leader}")
        assert client.address == dead
        assert client.queue() == {"jobs": [], "nodes": []}
        assert client.address == leader
        assert Client(f"{dead},{leader}").address == leader  # for the process
        leader_cache._leaders.clear()  # another process: the leader is in the user's cache
        assert Client(f"{dead},{leader}").address == leader
        assert Client(f"{leader},{dead}").address == leader  # another list: its own
        assert Client(f"{dead},127.0.0.1:1").address == dead


def test_a_standby_names_the_leader() -> None:
    Other = standby(None)
    with (
        http_server(Leader) as leader,
        http_server(standby(leader)) as stand,
        http_server(Other) as other,
    ):
        client = Client(f"{stand},{other},{leader}")  # the hint skips the one between
        assert client.queue() == {"jobs": [], "nodes": []}
        assert client.address == leader
        assert Other.asked == 0


def test_a_hint_outside_the_list_is_not_followed(
    dead: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby reached in plain HTTP proves nothing: it may not send the client, and its
    token, to an address the user did not list."""
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "0.3")
    Leader.posts = []
    with http_server(Leader) as elsewhere, http_server(standby(elsewhere)) as stand:
        with pytest.raises(ConnectError, match=f"a standby, the leader is {elsewhere}"):
            Client(f"{stand},{dead}").submit("true", env={}, cwd="/")
        assert Leader.posts == []  # nothing reached the address the standby named


def test_a_hints_scheme_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """`https://` in a hint: the named master is dialled in TLS (the CA its token names
    checked first), never in plain HTTP with the token."""
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "0.3")
    with Impostor() as named, http_server(standby(f"https://{named.address}")) as stand:
        with pytest.raises(MgpuError):
            Client(f"{stand},{named.address}", token=SECRET).queue()
        assert named.tls_hellos >= 1
    assert b"mgpu_secret" not in named.everything()


def test_a_pinned_ca_means_tls_on_loopback_too() -> None:
    """A client that has pinned the cluster's CA (it served TLS) never tries plain HTTP
    first, not even on loopback: a plain listener on the port gets no token."""
    pin = Path(pinned_ca_path(FP))
    pin.parent.mkdir(parents=True)
    pin.write_text("kept at the first TLS contact")  # not a CA: fetched again, in TLS
    with Impostor() as impostor:
        for call in (lambda c: c.queue(), lambda c: c.attach("7")):
            with pytest.raises(MgpuError):
                call(Client(impostor.address, token=SECRET))
        assert impostor.tls_hellos >= 2
    assert b"mgpu_secret" not in impostor.everything()
    assert Client(f"http://{impostor.address}", token=SECRET).tls is False  # told so


@pytest.mark.parametrize("role", ["standby", "leader"])
def test_a_failover_is_waited_for(dead: str, role: str) -> None:
    """A standby that knows no leader yet, or the new leader still opening the cluster
    (503, `"role": "leader"`, itself as the leader), until it serves."""
    Waiting = standby(None)

    class Promoted(Leader):
        def do_GET(self) -> None:
            if Waiting.asked < 3:
                Waiting.asked += 1
                host, port = self.server.server_address[:2]  # type: ignore[index,str-unpack]
                me = f"{host!s}:{port}"
                leader = me if role == "leader" else None
                body = {"detail": "not yet", "role": role, "leader": leader}
                self._answer(503, body, {"X-Mgpu-Leader": me} if leader else {})
            else:
                super().do_GET()

    with http_server(Promoted) as promoted:
        client = Client(f"{dead},{promoted}")
        assert client.queue() == {"jobs": [], "nodes": []}
        assert Waiting.asked == 3


def test_the_wait_is_bounded_and_ends_in_one_line(
    dead: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "0.5")
    with http_server(standby(None)) as stand:
        began = time.monotonic()
        with pytest.raises(ConnectError) as caught:
            Client(f"{dead},{stand}").queue()
        assert time.monotonic() - began < 5
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("no mgpu master leads after 0.5 s (")
    assert f"{dead}: connection refused" in text and f"{stand}: a standby, no leader" in text


def test_a_stopped_leader_is_left_for_the_next_master() -> None:
    """A stopped master (SIGSTOP) takes connections and says nothing: a read, and a submit
    (its idempotency key makes it safe to send again), ask the next master after the
    timeout."""
    Leader.posts, Leader.keys = [], []
    with socket.socket() as stopped, http_server(Leader) as leader:
        stopped.bind(("127.0.0.1", 0))
        stopped.listen(8)  # connections complete, nothing ever answers
        silent = f"127.0.0.1:{stopped.getsockname()[1]}"
        client = Client(f"http://{silent},{leader}", timeout=0.5)
        assert client.submit("true", env={}, cwd="/").id == "1"
        assert Leader.posts == ["/api/jobs"] and Leader.keys[0]
        assert client.queue() == {"jobs": [], "nodes": []}
        assert client.address == leader
        with pytest.raises(api.NoAnswer, match="did not answer in time"):
            Client(f"http://{silent}", timeout=0.5).submit("true", env={}, cwd="/")


def test_one_master_that_is_down_fails_at_once(dead: str) -> None:
    began = time.monotonic()
    with pytest.raises(ConnectError, match=f"cannot reach the mgpu master at {dead}"):
        Client(dead).queue()
    assert time.monotonic() - began < 2


def test_a_lone_standby_with_no_leader_is_waited_for_then_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "0.3")
    with (
        http_server(standby(None)) as stand,
        pytest.raises(ConnectError, match=r"no leader yet \(still so after 0.3 s\)"),
    ):
        Client(stand).queue()


def test_a_submit_whose_answer_was_lost_is_sent_again_with_its_key() -> None:
    """The master it reached may have made the job: sent again with the same key, the
    next master answers with that job if it did (master/control/submitkeys.py)."""
    Leader.posts, Leader.keys, Dropper.keys = [], [], []
    with http_server(Dropper) as dropper, http_server(Leader) as leader:
        client = Client(f"http://{dropper},{leader}")  # plain: no TLS tried on loopback
        assert client.submit("true", env={}, cwd="/").id == "1"
        assert Leader.posts == ["/api/jobs"]
        assert Dropper.keys[-1] == Leader.keys[0] and len(Leader.keys[0] or "") == 32
        assert client.address == leader
        client.submit("true", env={}, cwd="/")
        assert Leader.keys[1] != Leader.keys[0]  # each submit its own key
    with (
        http_server(Dropper) as alone,  # one master, gone: said, not hidden
        pytest.raises(LostConnection, match="lost the connection"),
    ):
        Client(f"http://{alone}").submit("true", env={}, cwd="/")


def test_a_submit_to_a_standby_goes_to_the_leader() -> None:
    Leader.posts = []
    with http_server(Leader) as leader, http_server(standby(leader)) as stand:
        assert Client(f"{stand},{leader}").submit("true", env={}, cwd="/").id == "1"
        assert Leader.posts == ["/api/jobs"]


# ---- streams ---------------------------------------------------------------------------


class Output(_Master):
    """Job 7's output: six records; the first stream breaks after three of them."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/api/jobs/7":
            self._answer(200, {"id": "7", "state": "running", "allocation": []})
            return
        since = int(dict(q.split("=") for q in query.split("&"))["since"])
        type(self).asked.append(query)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        records = [{"s": "o", "d": f"line {i}\n", "n": "n1"} for i in range(6)]
        first = since == 0
        shown = records[since:3] if first else records[since:]
        for rec in shown:
            self._chunk(json.dumps(rec).encode() + b"\n")
        if first:  # the master goes away: no last chunk, the connection closes
            self.close_connection = True
            return
        self._chunk(b'{"end": true, "state": "completed", "exit_code": 0}\n')
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def test_logs_follow_resumes_where_it_was(dead: str, capsys: pytest.CaptureFixture[str]) -> None:
    Output.asked = []
    with http_server(Output) as master:
        assert print_logs(Client(f"{dead},{master}"), "7", follow=True) == 0
    assert capsys.readouterr().out == "".join(f"line {i}\n" for i in range(6))
    asked = [dict(p.split("=") for p in q.split("&")) for q in Output.asked]
    assert [q["since"] for q in asked] == ["0", "3"]


def test_attach_to_a_standby_is_a_standby(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "0.2")
    with (
        http_server(standby(None)) as stand,
        pytest.raises(ConnectError, match="standby; no leader yet"),
    ):
        Client(f"http://{stand}").attach("7")


# ---- the agent -------------------------------------------------------------------------


def _agent(
    tmp_path: Path, masters: list[tuple[str, int]], insecure: bool = True, token: str = ""
) -> Agent:
    options = AgentOptions(
        node_id="n1",
        master_host=masters[0][0],
        master_port=masters[0][1],
        state_dir=tmp_path,
        insecure=insecure,
        masters=tuple(masters) if len(masters) > 1 else (),
        token=token or None,
    )
    return Agent(options)


def test_the_agent_keeps_the_highest_generation(tmp_path: Path) -> None:
    agent = _agent(tmp_path, [("127.0.0.1", 1)])
    agent._check_generation(Welcome(heartbeat_interval=1, generation=None))  # one master
    assert agent.generation is None
    agent._check_generation(Welcome(heartbeat_interval=1, generation=5))
    again = _agent(tmp_path, [("127.0.0.1", 1)])
    again.generations.load()
    assert again.generation == 5  # kept in the node dir
    with pytest.raises(DeposedMaster, match="generation 4, older than 5 seen"):
        again._check_generation(Welcome(heartbeat_interval=1, generation=4))
    again._check_generation(Welcome(heartbeat_interval=1, generation=5))
    again._check_generation(Welcome(heartbeat_interval=1, generation=None))
    again._check_generation(Welcome(heartbeat_interval=1, generation=7))
    assert again.generation == 7


def test_a_standby_refuses_the_agent_at_the_handshake(tmp_path: Path) -> None:
    with http_server(standby("10.0.0.9:8080")) as stand:
        host, port = stand.rsplit(":", 1)
        agent = _agent(tmp_path, [(host, int(port)), ("127.0.0.1", 1)])
        with pytest.raises(StandbyMaster) as caught:
            asyncio.run(agent._session())
    assert caught.value.leader == "10.0.0.9:8080"


class _Stop(BaseException):
    pass


def test_the_agent_dials_in_turn_and_follows_the_hint(tmp_path: Path) -> None:
    agent = _agent(tmp_path, [("dead", 1), ("standby", 2), ("leader", 3)])
    dialled: list[tuple[str, int]] = []
    times: list[float] = []

    async def session() -> None:
        dialled.append(agent.master)
        times.append(time.monotonic())
        if agent.master == ("dead", 1):
            raise ConnectionRefusedError("refused")
        if agent.master == ("standby", 2):
            raise StandbyMaster("a standby", "leader:3" if len(dialled) < 3 else None)
        if len(dialled) < 4:
            agent._welcomed = True  # it led, then the link dropped
            raise ConnectionResetError("reset")
        if len(dialled) < 14:
            raise ConnectionRefusedError("refused")
        raise _Stop

    agent._session = session  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        asyncio.run(agent._dial_forever())
    assert dialled[:5] == [("dead", 1), ("standby", 2), ("leader", 3), ("leader", 3), ("dead", 1)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 1.6  # a small backoff while all refuse: a failover is seen soon


def _keepalive_timeout() -> Exception:
    """What websockets raises when the link's pings went unanswered (a frozen master)."""
    from websockets.exceptions import ConnectionClosedError
    from websockets.frames import Close, CloseCode

    return ConnectionClosedError(None, Close(CloseCode.INTERNAL_ERROR, "keepalive ping timeout"))


def test_an_agent_whose_leader_froze_dials_it_last(tmp_path: Path) -> None:
    """A frozen leader keeps the link open and answers no ping: once the agent drops it,
    it dials the other masters first (each dial of the frozen one costs a whole handshake
    timeout), and does not follow a standby's hint back to it while another is untried."""
    agent = _agent(tmp_path, [("frozen", 1), ("standby", 2), ("third", 3)])
    dialled: list[tuple[str, int]] = []

    async def session() -> None:
        dialled.append(agent.master)
        if len(dialled) == 1:
            agent._welcomed = True  # it led, then stopped answering pings
            raise _keepalive_timeout()
        if len(dialled) > 5:
            raise _Stop
        if agent.master == ("frozen", 1):
            raise TimeoutError("timed out during opening handshake")
        raise StandbyMaster("a standby", "frozen:1")  # it has not taken over yet

    agent._session = session  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        asyncio.run(agent._dial_forever())
    assert dialled[:4] == [("frozen", 1), ("standby", 2), ("third", 3), ("standby", 2)]


def test_a_link_closed_by_the_master_is_not_silence() -> None:
    from websockets.exceptions import ConnectionClosedError
    from websockets.frames import Close, CloseCode

    from mgpu.agent.link import said_nothing

    assert said_nothing(_keepalive_timeout())
    assert said_nothing(TimeoutError("timed out during opening handshake"))
    closed = Close(CloseCode.GOING_AWAY, "bye")
    assert not said_nothing(ConnectionClosedError(closed, closed, True))
    assert not said_nothing(ConnectionResetError("reset"))


def test_a_search_tries_a_silent_master_last_and_still_tries_it() -> None:
    masters = [("a", 1), ("b", 2), ("c", 3)]
    walk = Search(masters, Transport(None, None))
    assert walk.failed(("a", 1), silent=True) == ("b", 2)
    assert walk.failed(("b", 2), "a:1") == ("c", 3)  # not back to the silent one
    assert walk.failed(("c", 3), "a:1") is None  # the others all tried: a pause
    assert walk.again() == ("b", 2)  # named, but silent: the others first
    assert walk.failed(("b", 2), "a:1") == ("c", 3)
    assert walk.failed(("c", 3), "a:1") == ("a", 1)  # only the silent one left: its turn
    fresh = Search(masters, Transport(None, None))
    fresh.failed(("a", 1), silent=True)
    assert fresh.again() == ("b", 2)


def test_the_agent_follows_no_hint_outside_its_list(tmp_path: Path) -> None:
    """A hint to an address not configured is not dialled, and never added to the list
    (nor to the jobs' $MGPU_MASTER)."""
    agent = _agent(tmp_path, [("standby", 2), ("dead", 1)])
    dialled: list[tuple[str, int]] = []

    async def session() -> None:
        dialled.append(agent.master)
        if len(dialled) > 6:
            raise _Stop
        if agent.master == ("standby", 2):
            raise StandbyMaster("a standby", "elsewhere:3")
        raise ConnectionRefusedError("refused")

    agent._session = session  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        asyncio.run(agent._dial_forever())
    assert set(dialled) == {("standby", 2), ("dead", 1)}
    assert agent.masters == [("standby", 2), ("dead", 1)]


def test_an_agent_that_pinned_the_ca_dials_loopback_in_tls(tmp_path: Path) -> None:
    """Pinned in its state dir at its first TLS link: from then on TLS only, on loopback
    too, and no hello goes out on a plain link."""
    agent = _agent(tmp_path, [("127.0.0.1", 9)], insecure=False, token=SECRET)
    assert agent.tls is False  # nothing pinned: a loopback master may be plain
    Path(pinned_ca_path(FP, str(tmp_path))).write_text("the CA")
    agent._choose_tls()
    assert agent.tls is True
    agent.tls = False  # however it came to be plain: refused before the hello
    with pytest.raises(ConnectionError, match="refusing to send a token"):
        asyncio.run(agent._converse(None))


def test_health_checks_every_master(dead: str) -> None:
    class Healthy(_Master):
        def do_GET(self) -> None:
            self._answer(200, {"status": "ok", "role": "standby"})

    with http_server(Healthy) as live:
        addresses = [parse_addresses(a, 1)[1][0] for a in (dead, live)]
        check = check_masters(addresses, timeout=2)
    assert check.ok
    assert check.detail.startswith(f"{dead}: cannot reach it")
    assert f"; {live} (http)" in check.detail


def test_node_takes_several_master_hosts() -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    argv = [str(MGPU), "node", "--node-id", "n1", "--master-host", "a:1", "--master-host"]
    argv += ["b,c:3", "--master-port", "9", "--print-systemd-unit"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--master-host a:1,b,c:3 --master-port 9" in res.stdout
    res = subprocess.run([*argv[:-1], "--master-host", "x:y"], capture_output=True, text=True)
    assert res.returncode == 2
    assert "--master-host: 'x:y' is not HOST[:PORT]" in res.stderr.splitlines()[-1]


def test_slurm_commands_take_several_masters(dead: str) -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    from test_slurm_cli import _Master as SlurmMaster

    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "MGPU_TOKEN": "t"}
    with http_server(SlurmMaster) as live:
        for argv, given in (
            (["squeue", "-h", "-o", "%i %T %N"], {**env, "MGPU_MASTER": f"{dead},{live}"}),
            (["--host", f"{dead},{live}", "squeue", "-h", "-o", "%i %T %N"], env),
        ):
            res = subprocess.run(
                [str(MGPU), *argv], capture_output=True, text=True, env=given, timeout=60
            )
            assert (res.returncode, res.stdout) == (0, "42 RUNNING node001\n"), res.stderr
