"""The seeds' own commands, walked one by one (issue 14 item 7).

Every mgpu command of the seed README (`../shared/seeds/002_*`) and of seed 001's test plan
is run as the seed writes it, from the clone's root, on a real local cluster, and its
outcome asserted: it works, or it fails with one sentence that says what to do instead.
Adapted, mechanically (`Walk.argv`), only where the machine differs: `venv/bin/python` and
`python` are this venv's Python, `./dist/NAME` its console script of that name, port 8080 a
free port (added where the seed relies on the default), `<MASTER_IP>`/`192.168.1.100`/`IP`
this machine's address, `<job_id>` the job submitted last.  The state dir is the default
one (`~/.local/state/mgpu`) under a HOME the test makes; "another machine" is another
HOME, which holds no token.  The machine has no GPU: a stand-in `nvidia-smi` (2 GPUs) on
the agents' PATH lets them detect GPUs the way a real node does.

Left out, as not mgpu's: the seeds' own files (`venv/bin/python test/test_torch_load.py`,
`test/run_tests.py`: a job running one fails with Python's own error, as checked below),
`pip install -r requirements.txt` (checked by `test_requirements_txt_installs_mgpu`), the
network tools of the troubleshooting section (ps, ss, netstat, ping, telnet, nc, ufw,
firewall-cmd, ip, traceroute, nmap) and lines that only show a synopsis.  Lines that
repeat a command already in the table with another node id are not repeated.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import BIN, free_port, kill_group, wait_for
from mgpu import Client
from mgpu.execspec import is_reserved_env_name
from mgpu.testing import kill_leftover_jobs

ROOT = Path(__file__).resolve().parents[2]

# nvidia-smi's answers on a machine with two GPUs, for the queries the agent makes
# (discovery, telemetry, compute processes) and for a job that runs `nvidia-smi`.
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,name,memory.total,uuid*)
    echo "0, NVIDIA GeForce RTX 3060, 12288, GPU-00000000-seed-0000-0000-000000000000"
    echo "1, NVIDIA GeForce RTX 3060, 12288, GPU-00000000-seed-0000-0000-000000000001" ;;
  *--query-gpu=index,utilization.gpu*)
    echo "0, 0, 1, 12288, 30, 20.00"
    echo "1, 0, 1, 12288, 30, 20.00" ;;
  *--query-compute-apps*) ;;
  *) echo "NVIDIA-SMI stand-in: 2 x NVIDIA GeForce RTX 3060" ;;
esac
"""

JOB_ID = r"[1-9][0-9]*\n"
MISSING_FILE = r"can't open file .*No such file or directory"
NO_JOIN_TOKEN = (
    r"mgpu: error: this node has no join token: copy it from the file join-token in the "
    r"master's state dir .* and give it to this node with --token TOKEN or \$MGPU_JOIN_TOKEN"
)


@dataclass(frozen=True)
class Seed:
    text: str
    """The command as the seed writes it."""
    rc: int | None
    """Its exit code; None for a daemon the seed starts in the background or another
    terminal: it must come up (a master answers, a node is online) and stay up."""
    expect: str = ""
    """A regex: stdout if `rc` is 0, else the last line of stderr (the one sentence)."""
    where: str = "head"
    """"head": the master's machine and account; "worker": another machine (no token)."""
    gpus: int = 2
    """(a node) the GPUs it must show in `mgpu nodes`."""


def local_ip() -> str:
    """This machine's address as other machines reach it (the seeds' <MASTER_IP>); loopback
    when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, a route is chosen
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class Walk:
    """Runs seed commands from the clone's root against one cluster and checks them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.master_ip = local_ip()
        self.last_job = ""
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self._client: Client | None = None
        self._count = itertools.count()
        smi = tmp / "gpu-bin"
        smi.mkdir()
        (smi / "nvidia-smi").write_text(NVIDIA_SMI)
        (smi / "nvidia-smi").chmod(0o755)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MGPU_") and not is_reserved_env_name(k) and k != "HOME"
        }
        base["PATH"] = f"{smi}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        base["MGPU_MASTER"] = f"127.0.0.1:{self.port}"  # the seeds' default port, moved
        self.homes = {"head": tmp / "head", "worker": tmp / "worker"}
        self.envs = {}
        for where, home in self.homes.items():
            home.mkdir()
            self.envs[where] = {**base, "HOME": str(home)}

    @property
    def state_dir(self) -> Path:
        return self.homes["head"] / ".local" / "state" / "mgpu"

    def argv(self, text: str) -> list[str]:
        words = shlex.split(text.removesuffix(" &"))  # `&`: in the background, as rc None says
        for old, new in (
            ("8080", str(self.port)),
            ("<MASTER_IP>", self.master_ip),
            ("192.168.1.100", self.master_ip),
            ("<job_id>", self.last_job),
        ):
            words = [w.replace(old, new) for w in words]
        # A job's own command line ("venv/bin/python train.py") runs this venv's Python too.
        words = [re.sub(r"^venv/bin/python\b", sys.executable, w) for w in words]
        words = [self.master_ip if w == "IP" else w for w in words]
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0].startswith("./dist/"):
            words[0] = str(BIN / words[0].removeprefix("./dist/"))
        name = Path(words[1] if words[0] == sys.executable else words[0]).name
        if "master" in name and "--port" not in words:
            words += ["--port", str(self.port)]
        if "node" in name and "--master-port" not in words:
            words += ["--master-port", str(self.port)]
        return words

    def client(self) -> Client:
        """The owner's client, as on the master's machine (one, reused: a TLS master waits
        for idle connections to close when it stops)."""
        if self._client is None:
            token = (self.state_dir / "admin-token").read_text().strip()
            self._client = Client(f"127.0.0.1:{self.port}", token=token, connect_timeout=2.0)
        return self._client

    def run(self, seed: Seed, extra_env: dict[str, str] | None = None) -> str:
        """Run one seed command and check its outcome; returns its stdout."""
        argv = self.argv(seed.text)
        env = {**self.envs[seed.where], **(extra_env or {})}
        if seed.rc is None:
            return self._start(seed, argv, env)
        res = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        what = f"{seed.text!r} ({' '.join(argv)})"
        assert res.returncode == seed.rc, f"{what}: exit {res.returncode}\n{res.stderr[-2000:]}"
        if seed.rc == 0:
            assert re.fullmatch(seed.expect or ".*", res.stdout, re.S), f"{what}: {res.stdout}"
            if re.fullmatch(JOB_ID, res.stdout):
                self.last_job = res.stdout.strip()
        else:
            last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
            assert re.search(seed.expect, last), f"{what}: {res.stderr[-2000:]}"
            if last.startswith("mgpu: "):
                assert "Traceback" not in res.stderr, f"{what}: {res.stderr}"
        return res.stdout

    def _start(self, seed: Seed, argv: list[str], env: dict[str, str]) -> str:
        log = self.tmp / f"daemon-{next(self._count)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.daemons.append(proc)

        def up() -> bool:
            assert proc.poll() is None, f"{seed.text!r} exited:\n{log.read_text()[-2000:]}"
            if "--node-id" not in argv:
                return self.client().nodes() is not None
            node_id = argv[argv.index("--node-id") + 1]
            nodes = {n["node_id"]: n for n in self.client().nodes()}
            node = nodes.get(node_id)
            return bool(node and node["state"] == "online" and node["connected"])

        wait_for(up, timeout=30, what=f"{seed.text!r} up")
        if "--node-id" in argv:
            node_id = argv[argv.index("--node-id") + 1]
            node = next(n for n in self.client().nodes() if n["node_id"] == node_id)
            assert len(node["gpus"]) == seed.gpus, node
        return ""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in reversed(self.daemons):
            kill_group(proc)
        self.daemons.clear()
        kill_leftover_jobs(self.tmp)


@pytest.fixture
def walk(tmp_path: Path) -> Iterator[Walk]:
    w = Walk(tmp_path)
    try:
        yield w
    finally:
        w.stop()


# The seed README (002), in its order.  A worker node is "another machine": it has no join
# token until it is given one, as the refusal says (see test_seed_readme).
README_HEAD = [
    # "Step 1", "Multi-node Setup", "Tested Example", "Configuration", "Quick Test"
    Seed("venv/bin/python src/mgpu_simple_master.py --host 0.0.0.0 --port 8080", None),
    # "Step 2": the node on the master's own machine finds the join token by itself
    Seed(
        "venv/bin/python src/mgpu_simple_node.py --node-id node001 --master-host 127.0.0.1 "
        "--master-port 8080",
        None,
    ),
]
README_WORKERS = [
    # "Multi-node Setup" step 2, "Multi-node Configuration", "실제 멀티노드 설정 예시"
    "venv/bin/python src/mgpu_simple_node.py --master-host <MASTER_IP> --master-port 8080 "
    "--node-id node002",
    "venv/bin/python src/mgpu_simple_node.py --master-host 192.168.1.100 --master-port 8080 "
    "--node-id node003",
    # "Debug Mode"
    "venv/bin/python src/mgpu_simple_node.py --master-host IP --master-port 8080 "
    "--node-id nodeXXX --verbose",
]
CLIENT = "venv/bin/python src/mgpu_simple_client.py"
README_CLIENT = [
    # "Step 3"
    Seed(f'{CLIENT} submit --gpus 1 --interactive "venv/bin/python /path/to/your_script.py"', 2,
         MISSING_FILE),
    Seed(f'{CLIENT} submit --gpus 1 "venv/bin/python /path/to/your_script.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 1 --interactive "venv/bin/python test/test_torch_load.py"', 2,
         MISSING_FILE),
    # "Step 4"
    Seed(f"{CLIENT} queue", 0, r"Jobs:\n.*Nodes:\n.*node001 +online +2 .*"),
    Seed(f"{CLIENT} cancel <job_id>", 0),
    Seed(f"{CLIENT} submit --interactive --gpus 1 --session-timeout 3600 "
         f'--max-consecutive-timeouts 60 "venv/bin/python long_running_script.py"', 2,
         MISSING_FILE),
    Seed(f"{CLIENT} submit --gpus 1 --max-wait-time 600 --connection-timeout 15 "
         f'"venv/bin/python batch_job.py"', 0, JOB_ID),
    # "Multi-node Setup" step 3
    Seed(f"{CLIENT} --host <MASTER_IP> --port 8080 submit --gpus 2 "
         f'"venv/bin/python distributed_script.py"', 0, JOB_ID),
    # "Configuration", "Usage Examples"
    Seed(f'{CLIENT} submit --gpus 1 --interactive "venv/bin/python your_script.py"', 2,
         MISSING_FILE),
    Seed(f'{CLIENT} submit --gpus 1 "venv/bin/python train.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 2 "venv/bin/python distributed_train.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 1 --interactive "venv/bin/python interactive_script.py"', 2,
         MISSING_FILE),
    Seed(f"{CLIENT} submit --gpus 1 --interactive --session-timeout 14400 "
         f'--max-consecutive-timeouts 120 "venv/bin/python gpu_training.py"', 2, MISSING_FILE),
    Seed(f"{CLIENT} submit --gpus 1 --max-wait-time 1800 --connection-timeout 20 "
         f'"venv/bin/python batch_processing.py"', 0, JOB_ID),
    # "Advanced: Multi-node Jobs": a job of N GPUs never spans nodes on its own (the contract)
    Seed(f'{CLIENT} submit --gpus 1 "venv/bin/python script.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 4 "venv/bin/python distributed_training.py"', 1,
         r"^mgpu: error: no node has 4 GPUs .*--nodes"),
    Seed(f'{CLIENT} submit --gpus 1 --node-gpu-ids "node001:0" "venv/bin/python script.py"', 0,
         JOB_ID),
    Seed(f'{CLIENT} submit --gpus 2 --node-gpu-ids "node001:0,1" '
         f'"venv/bin/python multi_gpu_script.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 4 --node-gpu-ids "node001:0,1;node002:0,1" '
         f'"venv/bin/python distributed_training.py"', 0, JOB_ID),
    Seed(f'{CLIENT} submit --gpus 1 --interactive --node-gpu-ids "node002:0" '
         f'"venv/bin/python debug_script.py"', 2, MISSING_FILE),
    Seed(f"{CLIENT} --host 192.168.1.100 --port 8080 submit --gpus 2 "
         f'"venv/bin/python distributed_script.py"', 0, JOB_ID),
    Seed(f"{CLIENT} --host 192.168.1.100 --port 8080 submit --gpus 1 "
         f'--node-gpu-ids "node002:0" "venv/bin/python script.py"', 0, JOB_ID),
    # "노드 상태 확인", "Troubleshooting" step 5
    Seed(f"{CLIENT} --host 192.168.1.100 --port 8080 queue", 0,
         r"Jobs:\n.*Nodes:\n.*node001 +online +2 .*node002 +online +2 .*node003 +online +2 .*"),
]  # fmt: skip


@pytest.mark.timeout(120)
def test_seed_readme(walk: Walk) -> None:
    for seed in README_HEAD:
        walk.run(seed)
    for text in README_WORKERS:
        # On another machine the node has no join token: it is told where it is...
        walk.run(Seed(text, 1, NO_JOIN_TOKEN, where="worker"))
        # ...and, given it as told, joins.
        join = (walk.state_dir / "join-token").read_text().strip()
        walk.run(Seed(text, None, where="worker"), {"MGPU_JOIN_TOKEN": join})
    # A client on another machine is told how to give its token (the master serves TLS).
    walk.run(
        Seed(f"{CLIENT} --host 192.168.1.100 --port 8080 queue", 1,
             r"^mgpu: error: the master at .* uses TLS and no token names its CA \(set \$MGPU_TO",
             where="worker"),
    )  # fmt: skip
    for seed in README_CLIENT:
        walk.run(seed)
    # What ran ran where it was sent, and failed with its own error.
    client = walk.client()
    job = client.wait(walk.last_job, timeout=30)
    assert [a["node_id"] for a in job["allocation"]] == ["node002"]
    assert (job["state"], job["exit_code"]) == ("failed", 2)
    assert "can't open file" in client.logs(job["id"])


# Seed 001's test plan ("기능 동일성 테스트"), then its run examples ("실행 예시").
PLAN_OLD = [
    Seed("python src/mgpu_simple_master.py &", None),
    Seed("python src/mgpu_simple_node.py --node-id test --host 127.0.0.1 &", None),
    Seed('python src/mgpu_simple_client.py submit "echo test"', 0, JOB_ID),
]
PLAN_NEW = [
    Seed("./dist/mgpu_master &", None),
    Seed("./dist/mgpu_node --node-id test &", None),
    Seed('./dist/mgpu_client submit "echo test"', 0, JOB_ID),
]
PLAN_EXAMPLES = [
    Seed("./dist/mgpu_master --host 0.0.0.0 --port 8080", None),
    Seed("./dist/mgpu_node --node-id node001 --master-host 127.0.0.1 --gpu-count 1", None, gpus=1),
    Seed('./dist/mgpu_client submit --gpus 1 "nvidia-smi"', 0, JOB_ID),
    Seed("./dist/mgpu_client queue", 0, r"Jobs:\n.*Nodes:\n.*node001 +online +1 .*"),
    Seed("./dist/mgpu_client cancel <job_id>", 0),
    Seed("./dist/mgpu_queue", 0, r"Jobs:\n.*"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("plan", "output"),
    [(PLAN_OLD, "test\n"), (PLAN_NEW, "test\n"), (PLAN_EXAMPLES, "NVIDIA-SMI stand-in")],
    ids=["old-way", "new-way", "run-examples"],
)
def test_seed_001_test_plan(walk: Walk, plan: list[Seed], output: str) -> None:
    for seed in plan:
        walk.run(seed)
        if seed.expect == JOB_ID:  # the job did what the seed meant it to
            client = walk.client()
            assert client.wait(walk.last_job, timeout=30)["state"] == "completed"
            assert output in client.logs(walk.last_job)


@pytest.mark.timeout(60)
def test_seed_masters_for_troubleshooting(walk: Walk) -> None:
    # "잘못된 시작": loopback only, plain HTTP; then "Debug Mode": TLS, debug logs.
    walk.run(Seed("venv/bin/python src/mgpu_simple_master.py --host 127.0.0.1 --port 8080", None))
    client = walk.client()
    assert client.nodes() == [] and not client.tls
    # A node of another account, without the join token: the master refuses it, and the
    # node says where the token is.
    walk.run(
        Seed("venv/bin/python src/mgpu_simple_node.py --node-id test --host 127.0.0.1", 1,
             NO_JOIN_TOKEN, where="worker")
    )  # fmt: skip
    walk.stop()
    walk.run(
        Seed("venv/bin/python src/mgpu_simple_master.py --host 0.0.0.0 --port 8080 --verbose", None)
    )
    client = walk.client()
    assert client.nodes() == [] and client.tls
    assert '"GET /api/nodes HTTP/1.1" 200' in walk.logs[-1].read_text()  # the access log


# ---- the node's old and new options ------------------------------------------------------


def run_here(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run a command from the clone's root, with no mgpu settings in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MGPU_")}
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("args", "rc", "message"),
    [
        (
            ["--fake-gpus", "2", "--gpu-count", "3"],
            1,
            "mgpu: error: --gpu-count 3 asks for more GPUs than this node has (2 simulated by "
            "--fake-gpus); give a smaller N, or leave --gpu-count out to use them all",
        ),
        (["--gpu-count", "-1"], 1, "mgpu: error: --gpu-count must not be negative"),
        (
            ["--gpu-count", "two"],
            2,
            "mgpu: error: argument --gpu-count: invalid int value: 'two'",
        ),
        (
            ["--host", "10.0.0.1", "--master-host", "10.0.0.2"],
            1,
            "mgpu: error: --host 10.0.0.1 and --master-host 10.0.0.2 name different masters; "
            "give only --master-host",
        ),
    ],
)
def test_node_options_refused_in_one_sentence(
    tmp_path: Path, args: list[str], rc: int, message: str
) -> None:
    closed = str(free_port())  # nothing listens: the refusal must come before any connection
    node = [str(BIN / "mgpu_simple_node"), "--node-id", "n1", "--master-port", closed]
    res = run_here(*node, *args, "--state-dir", str(tmp_path / "st"))
    assert (res.returncode, res.stderr.strip().splitlines()[-1]) == (rc, message), res.stderr
    assert "Traceback" not in res.stderr


def test_node_health_checks_the_gpu_count(tmp_path: Path) -> None:
    node = [str(BIN / "mgpu"), "node", "--node-id", "n1", "--master-port", str(free_port())]
    node += ["--state-dir", str(tmp_path / "st"), "--health", "--fake-gpus", "4"]
    res = run_here(*node, "--gpu-count", "2")
    assert "ok    GPUs visible: 2 simulated GPU(s) (--fake-gpus)" in res.stdout, res.stdout
    res = run_here(*node, "--gpu-count", "5")
    assert res.returncode == 1
    assert "FAIL  GPUs visible: --gpu-count 5 asks for more GPUs than this node has" in res.stdout


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        ([str(BIN / "mgpu_simple_node")], [str(BIN / "mgpu_simple_node")]),
        (
            [sys.executable, "src/mgpu_simple_node.py"],
            [sys.executable, str(ROOT / "src" / "mgpu_simple_node.py")],
        ),
        ([str(BIN / "mgpu"), "node"], [str(BIN / "mgpu"), "node"]),
    ],
    ids=["console-script", "seed-file", "mgpu"],
)
def test_systemd_unit_of_a_seed_node(argv: list[str], start: list[str], tmp_path: Path) -> None:
    options = ["--node-id", "gpu07", "--host", "10.0.0.5", "--gpu-count", "2"]
    res = run_here(*argv, *options, "--state-dir", str(tmp_path / "st"), "--print-systemd-unit")
    assert res.returncode == 0, res.stderr
    words = [*start, "--node-id", "gpu07", "--master-host", "10.0.0.5", "--master-port", "8080"]
    words += ["--gpu-count", "2", "--state-dir", str(tmp_path / "st")]
    assert f"\nExecStart={' '.join(words)}\n" in res.stdout


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        ([str(BIN / "mgpu_simple_master")], [str(BIN / "mgpu_simple_master")]),
        (
            [sys.executable, "src/mgpu_master_server.py"],
            [sys.executable, str(ROOT / "src" / "mgpu_master_server.py")],
        ),
    ],
    ids=["console-script", "seed-file"],
)
def test_systemd_unit_of_a_seed_master(argv: list[str], start: list[str], tmp_path: Path) -> None:
    options = ["--host", "0.0.0.0", "--port", "8181", "--state-dir", str(tmp_path / "ms")]
    res = run_here(*argv, *options, "--print-systemd-unit")
    assert res.returncode == 0, res.stderr
    assert f"\nExecStart={' '.join([*start, *options])}\n" in res.stdout
