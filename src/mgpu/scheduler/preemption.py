"""Choosing which preemptible running jobs to stop so a higher-priority job can start.

Only running jobs that are `preemptible` and of strictly lower priority than the waiting
job are candidates; their priorities are the ones they would have as pending jobs now
(`priority.running_priorities`, computed by the pass).  Among them the plan prefers, in
order: fewest victims, lowest highest-victim priority, fewest GPUs taken away.  Victims of
equal priority are taken youngest first (least work lost), as Slurm does.

* one-node requests (`--gpus N`, `--gpu-ids`): the best single node is chosen;
* gang requests (`--nodes`): the N cheapest nodes to clear, each cleared on its own;
* pinned requests (`--node-gpu-ids`): exactly the holders of the named GPUs, which must
  all be candidates;
* split `--distributed` and fractional (`--gpu-share`) requests: victims are added lowest
  priority first until the job fits, then any that turn out unneeded are dropped.

A fractional victim gives back only its share: its GPU is free for a whole-GPU job once every
share on it is gone, so all of them must be victims.  A victim gives back the CPUs and memory
it holds too: a job that asks for them needs enough of both freed beside its GPUs
(`--exclusive`: the node idle once the victims are gone).

The plan's placement is what the job would get once the victims are gone; the core
protects it from backfill until the job starts (on a later pass).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .placement import FreePool, gpus_per_node, place, requested_gpus
from .types import JobRequest, Placement, Policy, RunningJob

__all__ = ["PreemptionPlan", "plan_preemption"]


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    victims: tuple[str, ...]
    placements: tuple[Placement, ...]


def _gpus_on(job: RunningJob, node_id: str) -> set[int]:
    return {g for p in job.placements if p.node_id == node_id for g in p.gpu_ids}


def _freed(pool: FreePool, node_id: str, victims: Iterable[RunningJob]) -> set[int]:
    """The node's GPUs free once `victims` stop: those free now, the victims' whole GPUs,
    and shared GPUs whose every share belongs to a victim (none the pool may not use)."""
    free = set(pool.free(node_id))
    used = dict(pool.shared(node_id))
    usable = pool.usable(node_id)
    for v in victims:
        for p in v.placements:
            if p.node_id != node_id:
                continue
            if not p.share:
                free.update(p.gpu_ids)
                continue
            for g in p.gpu_ids:
                if g in used:
                    used[g] -= p.share
                    if used[g] <= 0:
                        free.add(g)
    return free & usable


def _after(pool: FreePool, victims: Iterable[RunningJob]) -> FreePool:
    sim = pool.copy()
    for v in victims:
        sim.release_all(v.placements)
    return sim


def _cost(victims: Sequence[RunningJob], priorities: Mapping[str, float]) -> tuple[int, float, int]:
    return (
        len(victims),
        max((priorities[v.job_id] for v in victims), default=float("-inf")),
        sum(v.gpus for v in victims),
    )


def plan_preemption(
    job: JobRequest,
    priority: float,
    pool: FreePool,
    running: Sequence[RunningJob],
    default_policy: Policy,
    priorities: Mapping[str, float],
    preemptible: Sequence[RunningJob] | None = None,
) -> PreemptionPlan | None:
    """Victims whose GPUs would let `job` start, or None if no acceptable set exists.

    `priorities` holds the current priority of every preemptible job in `running`;
    `preemptible`: those jobs, in `running`'s order, when the caller has them.
    """
    pre = [r for r in running if r.preemptible] if preemptible is None else preemptible
    candidates = [r for r in pre if priorities[r.job_id] < priority]
    if not candidates:
        return None
    candidates.sort(key=lambda r: (priorities[r.job_id], -r.start_time, r.job_id))
    if job.node_gpu_ids is not None:
        return _pinned(job, pool, running, candidates)
    if job.nodes is not None:
        return _gang(job, pool, candidates, default_policy, priorities)
    if job.gpu_share or (
        job.gpu_ids is None and job.distributed and job.gpus > pool.eligible(job).max_total
    ):
        return _greedy(job, pool, candidates, default_policy)
    return _one_node(job, pool, candidates, default_policy, priorities)


def _by_node(
    pool: FreePool, job: JobRequest, candidates: Sequence[RunningJob]
) -> dict[str, list[RunningJob]]:
    """Candidates on each eligible up node, in preference order."""
    eligible = pool.eligible(job)
    by_node: dict[str, list[RunningJob]] = {}
    for v in candidates:
        for p in v.placements:
            if p.node_id in eligible and pool.is_up(p.node_id):
                victims = by_node.setdefault(p.node_id, [])
                if not victims or victims[-1] is not v:
                    victims.append(v)
    return by_node


def _room_after(
    pool: FreePool, node_id: str, victims: Iterable[RunningJob], job: JobRequest, gpus: int
) -> bool:
    """The node has the CPUs and memory `job` asks (with `gpus` GPUs there) once `victims`
    stop (`--exclusive`: nothing is left on it)."""
    if not job.asks:
        return True
    cpus, mem = pool.free_cpus(node_id), pool.free_mem(node_id)
    for v in victims:
        for p in v.placements:
            if p.node_id == node_id:
                cpus, mem = cpus + p.cpus, mem + p.mem_mb
    view = pool.views[node_id]
    if job.ask.exclusive:
        idle = len(_freed(pool, node_id, victims)) == len(pool.usable(node_id))
        bare = pool.bare_jobs(node_id)
        if bare:  # the jobs that hold nothing there must go too
            gone = sum(
                1
                for v in victims
                for p in v.placements
                if p.node_id == node_id and not (p.gpu_ids or p.cpus or p.mem_mb)
            )
            idle = idle and gone >= bare
        return idle and cpus >= view.cpus and mem >= view.mem_mb
    need_cpus = job.ask.cpus_on(gpus, view.cpus)
    need_mem = job.ask.mem_on(gpus, need_cpus, view.mem_mb)
    return (not need_cpus or cpus >= need_cpus) and (not need_mem or mem >= need_mem)


def _clear(
    pool: FreePool,
    node_id: str,
    victims: Sequence[RunningJob],
    need: int,
    ids: frozenset[int] | None,
    job: JobRequest,
) -> list[RunningJob] | None:
    """The fewest of `victims` (in order) whose GPUs (and CPUs and memory) on `node_id`
    make the request fit there."""
    if ids is not None:
        # Every holder of a wanted GPU that is not free must go (all sharers of a shared one).
        missing = ids - pool.free(node_id)
        holders = [v for v in victims if _gpus_on(v, node_id) & missing]
        for v in victims:  # then the fewest more, in order, for its CPUs and memory
            if _room_after(pool, node_id, holders, job, len(ids)):
                break
            if v not in holders:
                holders.append(v)
        if ids <= _freed(pool, node_id, holders) and _room_after(
            pool, node_id, holders, job, len(ids)
        ):
            return holders
        return None

    def enough(trial: list[RunningJob]) -> bool:
        free = _freed(pool, node_id, trial) if trial else pool.free(node_id)
        return len(free) >= need and _room_after(pool, node_id, trial, job, need)

    chosen: list[RunningJob] = []
    for v in victims:
        if enough(chosen):
            break
        chosen.append(v)
    if not enough(chosen):
        return None
    for v in reversed(list(chosen)):  # drop the ones that turned out unnecessary
        trial = [c for c in chosen if c is not v]
        if enough(trial):
            chosen = trial
    return chosen


def _restricted(job: JobRequest, nodes: Iterable[str]) -> JobRequest:
    return replace(job, nodelist=frozenset(nodes))


def _one_node(
    job: JobRequest,
    pool: FreePool,
    candidates: Sequence[RunningJob],
    policy: Policy,
    priorities: Mapping[str, float],
) -> PreemptionPlan | None:
    ids = frozenset(job.gpu_ids) if job.gpu_ids is not None else None
    need = requested_gpus(job)
    best: tuple[tuple[int, float, int, str], str, list[RunningJob]] | None = None
    for nid, victims in _by_node(pool, job, candidates).items():
        if ids is not None and not ids <= set(pool.views[nid].gpu_indices):
            continue
        chosen = _clear(pool, nid, victims, need, ids, job)
        if chosen is None:
            continue
        key = (*_cost(chosen, priorities), nid)
        if best is None or key < best[0]:
            best = (key, nid, chosen)
    if best is None:
        return None
    _, nid, chosen = best
    placements = place(_restricted(job, [nid]), _after(pool, chosen), policy)
    if placements is None:
        return None
    return PreemptionPlan(tuple(v.job_id for v in chosen), placements)


def _gang(
    job: JobRequest,
    pool: FreePool,
    candidates: Sequence[RunningJob],
    policy: Policy,
    priorities: Mapping[str, float],
) -> PreemptionPlan | None:
    assert job.nodes is not None
    per = gpus_per_node(job)
    if per is None:
        return None
    by_node = _by_node(pool, job, candidates)
    options: list[tuple[tuple[int, float, int, str], list[RunningJob]]] = []
    eligible = pool.eligible(job)
    nodes = pool.views if eligible.nodes is None else eligible.nodes
    for nid in nodes:
        if not pool.is_up(nid) or nid not in eligible:
            continue
        chosen = _clear(pool, nid, by_node.get(nid, []), per, None, job)
        if chosen is not None:
            options.append(((*_cost(chosen, priorities), nid), chosen))
    if len(options) < job.nodes:
        return None
    options.sort(key=lambda o: o[0])
    picked = options[: job.nodes]
    victims: dict[str, RunningJob] = {}
    for _, chosen in picked:
        for v in chosen:
            victims.setdefault(v.job_id, v)
    placements = place(
        _restricted(job, [key[3] for key, _ in picked]), _after(pool, victims.values()), policy
    )
    if placements is None:
        return None
    return PreemptionPlan(tuple(victims), placements)


def _pinned(
    job: JobRequest,
    pool: FreePool,
    running: Sequence[RunningJob],
    candidates: Sequence[RunningJob],
) -> PreemptionPlan | None:
    assert job.node_gpu_ids is not None
    owners: dict[tuple[str, int], list[RunningJob]] = {}
    for r in running:
        for p in r.placements:
            for g in p.gpu_ids:
                owners.setdefault((p.node_id, g), []).append(r)
    allowed = {id(c) for c in candidates}
    victims: dict[str, RunningJob] = {}
    for nid, ids in job.node_gpu_ids:
        if not pool.is_up(nid):
            return None
        for g in set(ids) - set(pool.free(nid)):
            holders = owners.get((nid, g))
            if not holders or any(id(h) not in allowed for h in holders):
                return None
            for holder in holders:
                victims.setdefault(holder.job_id, holder)
    placements = place(job, _after(pool, victims.values()), "fill_first")
    if placements is None or not victims:
        return None
    return PreemptionPlan(tuple(victims), placements)


def _greedy(
    job: JobRequest, pool: FreePool, candidates: Sequence[RunningJob], policy: Policy
) -> PreemptionPlan | None:
    need = requested_gpus(job)
    sim = pool.copy()
    chosen: list[RunningJob] = []
    placements = None
    for v in candidates:
        sim.release_all(v.placements)
        chosen.append(v)
        if sim.total_free >= need:
            placements = place(job, sim, policy)
            if placements is not None:
                break
    if placements is None:
        return None
    for v in reversed(list(chosen)):
        trial = [c for c in chosen if c is not v]
        found = place(job, _after(pool, trial), policy)
        if found is not None:
            chosen, placements = trial, found
    return PreemptionPlan(tuple(v.job_id for v in chosen), placements)
