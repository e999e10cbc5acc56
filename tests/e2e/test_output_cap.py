"""`limits.max_output_per_job` against a real master and agent: a job writing far past a
small cap has its stored output stop at the cap with one marker, runs on to its end with
its own exit code, and `mgpu logs -f` and `mgpu srun` end normally with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import BIN, local_cluster, wait_for

CAP = 64 * 1024
MARKER = "mgpu: output truncated at 64 KiB (limits.max_output_per_job)\n"
FLOOD = "head -c 1000000 /dev/zero | tr '\\0' x"  # 1 MB of output, 15 times the cap


def _stored(state_dir: Path, job_id: str) -> tuple[int, list[dict[str, str]]]:
    """Bytes the master's file holds before its last record, and its records."""
    lines = (state_dir / "output" / f"{job_id}.jsonl").read_bytes().splitlines(keepends=True)
    return sum(map(len, lines[:-1])), [json.loads(line) for line in lines]


def test_output_stops_at_the_cap_and_the_job_runs_to_its_end(tmp_path: Path) -> None:
    config = f"limits:\n  max_output_per_job: {CAP}\n"
    with local_cluster(tmp_path, agents=1, gpus=1, config=config) as c:
        client = c.client()
        gate, after = tmp_path / "gate", tmp_path / "ran-on"
        job = client.submit(
            f"while [ ! -e {gate} ]; do sleep 0.05; done; {FLOOD}; "
            f"echo not stored >&2; touch {after}; exit 7",
            gpus=0,
        )
        wait_for(lambda: client.show(job.id)["state"] == "running", what="the job to start")
        follow = subprocess.Popen(
            [str(BIN / "mgpu"), "logs", "-f", job.id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=c.env,
            start_new_session=True,
        )
        try:
            gate.touch()
            out, err = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                os.killpg(follow.pid, signal.SIGKILL)
                follow.wait()
        assert follow.returncode == 0, err
        done = client.wait(job.id, timeout=30)
        assert (done["state"], done["exit_code"]) == ("failed", 7)
        assert after.exists()  # it was not stopped at the cap
        text = out.decode()
        assert text.endswith("\n" + MARKER) and set(text[: -len(MARKER) - 1]) == {"x"}
        assert client.logs(job.id) == text
        size, records = _stored(c.state_dir, job.id)
        assert CAP - 100 < size <= CAP
        assert records[-1] == {"s": "e", "d": "\n" + MARKER, "n": "node001"}

        srun = c.cli("srun", "--gpus", "0", "--", "sh", "-c", f"{FLOOD}; exit 3")
        assert srun.returncode == 3
        assert set(srun.stdout) == {"x"} and CAP // 2 < len(srun.stdout) < CAP
        assert srun.stderr == "\n" + MARKER
        assert "Traceback" not in c.log("master")
