"""The dashboard's OutputResume (web/resume.js) is client/resume.py's Resume in JavaScript:
the same operations, random and many, give the same answers in both (run with Node)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mgpu.client.resume import Resume, Rewind

NODE = shutil.which("node") or shutil.which("nodejs")
RESUME_JS = Path(__file__).parents[2] / "src" / "mgpu" / "web" / "resume.js"

pytestmark = pytest.mark.skipif(NODE is None, reason="no Node.js here (Debian's nodejs)")

RUN_JS = """
const fs = require("fs");
const source = fs.readFileSync(process.argv[1], "utf8");
eval(source + "\\nglobalThis.R = OutputResume; globalThis.W = OutputRewind;");
const runs = JSON.parse(fs.readFileSync(0, "utf8"));
const out = runs.map((ops) => {
  const r = new R();
  return ops.map(([op, arg]) => {
    if (op === "take") {
      try { return r.take(arg); } catch (e) { if (e instanceof W) return "REWIND"; throw e; }
    }
    if (op === "mark") { r.mark(arg); return r.since(); }
    if (op === "reopen") { r.reopen(); return r.since(); }
    return r.since();
  });
});
process.stdout.write(JSON.stringify(out));
"""


def python_answers(ops: list[list[Any]]) -> list[Any]:
    r = Resume()
    out: list[Any] = []
    for op, arg in ops:
        if op == "take":
            try:
                out.append(r.take(arg))
            except Rewind:
                out.append("REWIND")
        elif op == "mark":
            r.mark(arg)
            out.append(r.since())
        elif op == "reopen":
            r.reopen()
            out.append(r.since())
        else:
            out.append(r.since())
    return out


def random_run(rng: random.Random) -> list[list[Any]]:
    """Records of two nodes' two streams as a follower gets them, with reopenings and marks
    between: offsets that grow, go back (a new leader's records cut otherwise), or none."""
    ops: list[list[Any]] = []
    at: dict[tuple[str, str], int] = {}
    for _ in range(rng.randint(5, 40)):
        roll = rng.random()
        if roll < 0.1:
            ops.append(["reopen", None])
        elif roll < 0.2:
            ops.append(["mark", rng.choice([rng.randint(0, 30), "x", None])])
        elif roll < 0.25:
            ops.append(["since", None])
        else:
            key = (rng.choice(["n1", "n2"]), rng.choice(["o", "e"]))
            text = "".join(rng.choice(["a", "b\n", "é", "日", "line\n"]) for _ in range(3))
            size = len(text.encode())
            if rng.random() < 0.3:  # sent again, or cut otherwise: back a little
                at[key] = max(size, at.get(key, 0) - rng.randint(0, 12))
            else:
                at[key] = at.get(key, 0) + size + rng.choice([0, 0, 0, 4])  # 4: a gap
            rec: dict[str, Any] = {"s": key[1], "d": text, "n": key[0]}
            if rng.random() < 0.9:
                rec["ep"], rec["at"] = 1, at[key]
            ops.append(["take", rec])
    return ops


def test_the_dashboard_resumes_a_stream_as_the_cli_does() -> None:
    rng = random.Random(20261206)
    runs = [random_run(rng) for _ in range(400)]
    assert NODE is not None
    done = subprocess.run(
        [NODE, "-e", RUN_JS, str(RESUME_JS)],
        input=json.dumps(runs),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    js = json.loads(done.stdout)
    rewinds = 0
    for ops, theirs in zip(runs, js, strict=True):
        ours = python_answers(ops)
        assert theirs == ours, json.dumps(ops)
        rewinds += ours.count("REWIND")
    assert rewinds > 10  # the random runs do reach the rewind
