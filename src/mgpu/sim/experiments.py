"""Experiments on top of the replay: what GPU sharing buys on a lab's small jobs.

`small_jobs_trace` makes a deterministic synthetic workload of the kind that fights over a
handful of GPUs: notebooks and debugging sessions on a quarter of a GPU, inference and
evaluation on half a GPU, single-GPU runs and a few 2-4 GPU trainings, arriving at random
(a Poisson process) so that the GPUs they *use* are a given fraction of the cluster.

`sharing_experiment` replays it twice with the same scheduler: as it is (shares packed by
the core, up to a whole GPU each) and with every share rounded up to a whole GPU, as a
scheduler without sharing must; and reports the wait and two utilisations: *allocated*
(GPU time held by jobs, a share counting F when shared and 1 when rounded up) and *useful*
(the GPU time the jobs asked for, F x run for a share: the same work in both replays).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from mgpu.durations import format_duration

from .report import compute_metrics, percentile
from .simulator import ClusterShape, SimConfig, SimResult, simulate
from .traces import TraceJob

__all__ = [
    "SharingRow",
    "default_shape",
    "format_sharing",
    "round_up_shares",
    "sharing_experiment",
    "small_jobs_trace",
]

# (weight, GPUs or share units, shortest run, longest run) of the mix; runs are drawn
# log-uniformly between the two.
_MIX: tuple[tuple[float, tuple[int, int], float, float], ...] = (
    (0.45, (1, 250), 600.0, 7200.0),  # notebook / debugging: a quarter of a GPU
    (0.25, (1, 500), 300.0, 3600.0),  # inference / evaluation: half a GPU
    (0.20, (1, 0), 1800.0, 4 * 3600.0),  # one GPU
    (0.10, (2, 0), 3600.0, 8 * 3600.0),  # small training: 2-4 GPUs
)


def small_jobs_trace(n: int, gpus: int, load: float = 0.7, seed: int = 1) -> list[TraceJob]:
    """`n` jobs of the mix above whose GPU use is `load` x `gpus` on average (see the
    module docstring); exact time limits (the run time)."""
    if n < 1 or gpus < 1 or load <= 0:
        raise ValueError("a small-jobs trace needs jobs, GPUs and a positive load")
    rng = random.Random(seed)
    weights = [m[0] for m in _MIX]
    shapes: list[tuple[int, int, float]] = []
    for _ in range(n):
        _, (count, share), shortest, longest = rng.choices(_MIX, weights)[0]
        if count > 1:
            count = rng.choice((2, 2, 4))
        run = shortest * (longest / shortest) ** rng.random()
        shapes.append((count, share, round(run)))
    used = sum((share / 1000 if share else count) * run for count, share, run in shapes)
    mean_gap = used / (load * gpus) / n  # arrivals spread so that use / capacity = load
    jobs: list[TraceJob] = []
    now = 0.0
    for i, (count, share, run) in enumerate(shapes):
        jobs.append(
            TraceJob(
                job_id=str(i + 1),
                submit=round(now, 1),
                run=float(run),
                gpus=count,
                user=f"u{rng.randrange(8)}",
                time_limit=float(run),
                gpu_share=share,
            )
        )
        now += rng.expovariate(1.0 / mean_gap)
    return jobs


def round_up_shares(jobs: Sequence[TraceJob]) -> list[TraceJob]:
    """The same jobs with every share of a GPU asking for a whole one."""
    return [replace(j, gpu_share=0) if j.gpu_share else j for j in jobs]


@dataclass(frozen=True, slots=True)
class SharingRow:
    label: str
    jobs: int
    wait_avg: float
    wait_median: float
    wait_p99: float
    makespan: float
    allocated: float
    """Allocated GPU time / (GPUs x makespan)."""
    useful: float
    """The jobs' own GPU time (F x run for a share) / (GPUs x makespan)."""


def _row(label: str, result: SimResult, asked: Sequence[TraceJob]) -> SharingRow:
    m = compute_metrics(result)
    by_id = {j.job_id: j for j in asked}
    work = sum(by_id[r.job_id].gpu_amount * r.run for r in result.jobs if r.finished)
    capacity = m.gpus * m.makespan
    waits = [r.start - r.submit for r in result.jobs if r.finished]
    return SharingRow(
        label=label,
        jobs=m.finished,
        wait_avg=m.wait_avg,
        wait_median=m.wait_median,
        wait_p99=percentile(waits, 99),
        makespan=m.makespan,
        allocated=m.utilisation,
        useful=work / capacity if capacity > 0 else 0.0,
    )


def sharing_experiment(jobs: Sequence[TraceJob], config: SimConfig) -> list[SharingRow]:
    """Replay `jobs` with their shares packed, then rounded up to whole GPUs."""
    shared = simulate(jobs, config)
    whole = simulate(round_up_shares(jobs), config)
    return [_row("shares packed", shared, jobs), _row("rounded up to whole GPUs", whole, jobs)]


def format_sharing(rows: Sequence[SharingRow]) -> str:
    """A Markdown table of `sharing_experiment`'s rows."""
    lines = [
        "| replay | jobs | wait avg | wait median | wait p99 | makespan | allocated | useful |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    d = partial(format_duration, style="exact")
    for r in rows:
        lines.append(
            f"| {r.label} | {r.jobs} | {d(r.wait_avg)} | {d(r.wait_median)} | {d(r.wait_p99)} "
            f"| {d(r.makespan)} | {r.allocated:.1%} | {r.useful:.1%} |"
        )
    return "\n".join(lines)


def default_shape() -> ClusterShape:
    """The experiment's cluster: 4 nodes x 4 GPUs, a lab's worth."""
    return ClusterShape(4, 4)
