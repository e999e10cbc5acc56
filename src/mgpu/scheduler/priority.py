"""Multifactor job priority, after Slurm's priority/multifactor plugin.

Each factor is a number in [0, 1]; a job's priority is the weighted sum

    priority = w_age·age + w_fairshare·fairshare + w_job_size·job_size + w_user·user_priority

* **age** — time since submission divided by `weights.max_age`, saturating at 1.
* **fairshare** — Slurm's classic formula `2^(-U/S)`: `U` is the user's share of all
  decayed usage (`Snapshot.usage`), `S` the user's share of all configured shares.  A user
  who has used nothing scores 1; one who has used exactly their share scores 0.5.  Users
  not in `config.shares` get the mean configured share (1.0 when nothing is configured),
  so with no configuration every user seen (pending, running or with usage) is equal.
  A configured share of 0 scores 0.
* **job_size** — GPUs asked for / GPUs in the cluster, at most 1 (bigger jobs first, as
  Slurm does by default: they are the hardest to fit later); a share of a GPU counts F.
* **user_priority** — the job's `--priority`, clamped to [-1000, 1000] and mapped linearly
  onto [0, 1]: -1000 → 0, 0 → 0.5, 1000 → 1.  With the default weight of 1000 each unit
  of `--priority` is worth one point (about ten minutes of age with the default weights).

`Decisions.factors` records each job's *weighted* contributions under the keys `age`,
`fairshare`, `job_size` and `user_priority`; they add up to the job's priority.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

from .placement import requested_gpus
from .running import RunningStats, running_stats
from .types import SHARE_UNITS, JobRequest, PriorityWeights, RunningJob, Snapshot

__all__ = [
    "USER_PRIORITY_RANGE",
    "FactorMap",
    "FactorTable",
    "compute_priorities",
    "fairshare_factors",
    "job_size",
    "running_priorities",
    "running_priority_floor",
    "user_priority_factor",
    "weighted_fairshare",
]

USER_PRIORITY_RANGE = 1000
"""`--priority` is clamped to ±this before being mapped onto [0, 1]."""


def user_priority_factor(priority: float) -> float:
    """`--priority` mapped onto [0, 1] (-1000 → 0, 0 → 0.5, 1000 → 1)."""
    p = max(-USER_PRIORITY_RANGE, min(USER_PRIORITY_RANGE, priority))
    return (p + USER_PRIORITY_RANGE) / (2 * USER_PRIORITY_RANGE)


def fairshare_factors(
    users: Iterable[str], shares: Mapping[str, float], usage: Mapping[str, float]
) -> dict[str, float]:
    """Each user's fairshare factor `2^(-U/S)` (see the module docstring).

    `users` are the users seen this pass; configured users and users with usage are
    added, since they all take part in the normalisation.
    """
    # Sorted: the sums below do not depend on the order the users came in (a pass over a
    # kept set of running jobs and one over a list of them weigh users to the last bit alike).
    everyone = sorted(set(users) | set(shares) | {u for u, v in usage.items() if v > 0})
    configured = [max(0.0, s) for s in shares.values()]
    default_share = sum(configured) / len(configured) if configured else 1.0
    share = {u: max(0.0, shares.get(u, default_share)) for u in everyone}
    total_share = sum(share.values())
    total_usage = sum(max(0.0, usage.get(u, 0.0)) for u in everyone)
    factors: dict[str, float] = {}
    for user in everyone:
        used = max(0.0, usage.get(user, 0.0)) / total_usage if total_usage > 0 else 0.0
        owned = share[user] / total_share if total_share > 0 else 0.0
        if owned <= 0.0:
            factors[user] = 0.0
        else:
            factors[user] = 2.0 ** (-used / owned)
    return factors


def cluster_size(snapshot: Snapshot) -> int:
    if snapshot.config.cluster_gpus > 0:
        return snapshot.config.cluster_gpus
    return sum(len(n.gpu_indices) for n in snapshot.nodes)


def weighted_fairshare(snapshot: Snapshot) -> dict[str, float]:
    """Each user's fairshare term (weight × factor) for this snapshot.

    Users of pending and running jobs alike take part, so waiting and running jobs are
    weighed against one another with the same numbers; so do `Snapshot.users` (a pass over
    the head of a long queue weighs its users as the full pass does).
    """
    users = {j.user for j in snapshot.pending}
    users.update(running_stats(snapshot.running).users())
    users.update(snapshot.users)
    cfg = snapshot.config
    factors = fairshare_factors(users, cfg.shares, snapshot.usage)
    weight = cfg.weights.fairshare
    return {u: weight * f for u, f in factors.items()}


def job_size(job: JobRequest) -> float:
    """The GPUs a job counts for in the job-size factor: F for a share, else its GPUs."""
    return job.gpu_share / SHARE_UNITS if job.gpu_share else requested_gpus(job)


def compute_priorities(
    snapshot: Snapshot,
    needs: Sequence[float] | None = None,
    fairshare: Mapping[str, float] | None = None,
) -> tuple[list[float], FactorTable]:
    """Priority and weighted factor breakdown of each pending job, in `pending` order.

    `needs` (each job's `job_size`) and `fairshare` (`weighted_fairshare`) may be
    passed when the caller has them already.  The work is done in list comprehensions on
    purpose: this runs over every pending job on every pass, and is the bulk of a pass over
    a long queue.
    """
    pending: Sequence[JobRequest] = snapshot.pending
    w: PriorityWeights = snapshot.config.weights
    weighted_fs = weighted_fairshare(snapshot) if fairshare is None else fairshare
    if needs is None:
        needs = [job_size(j) for j in pending]

    now = snapshot.now
    age_scale = w.age / w.max_age if w.max_age > 0 else 0.0
    w_age, w_size = w.age, w.job_size
    total = cluster_size(snapshot)
    size_scale = w_size / total if total > 0 else 0.0
    user_scale = w.user_priority / (2 * USER_PRIORITY_RANGE)
    bound = USER_PRIORITY_RANGE

    ages = [(now - j.submit_time) * age_scale for j in pending]
    ages = [w_age if a > w_age else (a if a > 0.0 else 0.0) for a in ages]
    sizes = [n * size_scale for n in needs]
    sizes = [w_size if s > w_size else s for s in sizes]
    shares = [weighted_fs[j.user] for j in pending]
    users_p = [
        ((bound if p > bound else (-bound if p < -bound else p)) + bound) * user_scale
        for p in [j.priority for j in pending]
    ]
    priorities = [a + f + s + u for a, f, s, u in zip(ages, shares, sizes, users_p, strict=True)]
    return priorities, FactorTable(ages, shares, sizes, users_p)


class FactorTable(Sequence[dict[str, float]]):
    """Each pending job's weighted factors, in `pending` order, each made into a dict only
    when it is read: a pass over 100,000 jobs would otherwise build 100,000 dicts, of which
    a query reads a few."""

    __slots__ = ("_ages", "_shares", "_sizes", "_users")

    def __init__(
        self, ages: list[float], shares: list[float], sizes: list[float], users: list[float]
    ) -> None:
        self._ages, self._shares, self._sizes, self._users = ages, shares, sizes, users

    def __len__(self) -> int:
        return len(self._ages)

    @overload
    def __getitem__(self, i: int) -> dict[str, float]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, float]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, float] | list[dict[str, float]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return {
            "age": self._ages[i],
            "fairshare": self._shares[i],
            "job_size": self._sizes[i],
            "user_priority": self._users[i],
        }


class FactorMap(Mapping[str, dict[str, float]]):
    """Job id -> its weighted factors (`Decisions.factors`), read from a `FactorTable`."""

    __slots__ = ("_index", "_table")

    def __init__(self, ids: Sequence[str], table: Sequence[dict[str, float]]) -> None:
        self._index = dict(zip(ids, range(len(ids)), strict=True))
        self._table = table

    def __getitem__(self, job_id: str) -> dict[str, float]:
        return self._table[self._index[job_id]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def running_priorities(
    snapshot: Snapshot,
    jobs: Iterable[RunningJob],
    fairshare: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The priority each running job in `jobs` would have as a pending job now.

    The same formula and inputs as `compute_priorities`: age from its submission, its GPUs
    as the job size, its user's fairshare (which counts its own running work) and its user
    priority.  A priority kept from the pass that started a job would be stale: before its
    own usage counted against its user, it looked more urgent than it is.
    """
    w = snapshot.config.weights
    weighted_fs = weighted_fairshare(snapshot) if fairshare is None else fairshare
    age_scale = w.age / w.max_age if w.max_age > 0 else 0.0
    total = cluster_size(snapshot)
    size_scale = w.job_size / total if total > 0 else 0.0
    user_scale = w.user_priority / (2 * USER_PRIORITY_RANGE)
    bound = USER_PRIORITY_RANGE
    out: dict[str, float] = {}
    # Term by term as in `compute_priorities`, so that equal inputs give equal priorities
    # to the last bit (preemption needs a strictly lower priority).
    for r in jobs:
        submitted = r.start_time if r.submit_time is None else r.submit_time
        age = (snapshot.now - submitted) * age_scale
        age = w.age if age > w.age else (age if age > 0.0 else 0.0)
        size = r.gpu_amount * size_scale
        size = w.job_size if size > w.job_size else size
        p = r.priority
        user = ((bound if p > bound else (-bound if p < -bound else p)) + bound) * user_scale
        out[r.job_id] = age + weighted_fs.get(r.user, 0.0) + size + user
    return out


def running_priority_floor(
    snapshot: Snapshot, stats: RunningStats, fairshare: Mapping[str, float]
) -> float:
    """A priority no preemptible running job's is below (`running_priorities`), from
    `stats.floor()`: each user's latest submit, least GPUs and least `--priority` give terms
    no job of theirs is below, and the same float operations on smaller terms never give a
    larger sum.  -inf when unknown (a plain list of running jobs) or a weight is negative."""
    floor = stats.floor()
    w = snapshot.config.weights
    if floor is None or min(w.age, w.job_size, w.user_priority, w.max_age) < 0:
        return -math.inf
    age_scale = w.age / w.max_age if w.max_age > 0 else 0.0
    total = cluster_size(snapshot)
    size_scale = w.job_size / total if total > 0 else 0.0
    user_scale = w.user_priority / (2 * USER_PRIORITY_RANGE)
    bound = USER_PRIORITY_RANGE
    lowest = math.inf
    for user, (submitted, units, p) in floor.items():
        age = (snapshot.now - submitted) * age_scale
        age = w.age if age > w.age else (age if age > 0.0 else 0.0)
        size = units / SHARE_UNITS * size_scale
        size = w.job_size if size > w.job_size else size
        up = ((bound if p > bound else (-bound if p < -bound else p)) + bound) * user_scale
        lowest = min(lowest, age + fairshare.get(user, 0.0) + size + up)
    return lowest
