"""A job's CPUs and memory: whether any node could ever hold them, and why the job waits.

`fit.py` answers these for GPUs and calls here for a job that asks for CPUs, memory or
whole nodes (`JobRequest.asks`), once its GPUs could fit.  A refusal is Slurm's sentence,
`Requested node configuration is not available`, with the numbers; a reason names the
resource that is short, with the most free on one node.
"""

from __future__ import annotations

from collections.abc import Collection

from .pool import FreePool
from .room import ask_text, format_mb, need_on
from .shape import gpus_per_node
from .types import JobRequest, NodeView

__all__ = ["NOT_AVAILABLE", "ask_never_fits", "ask_wait_reason"]

NOT_AVAILABLE = "Requested node configuration is not available"
"""Slurm's refusal of a job no node could hold."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _holds(node: NodeView, req: JobRequest, gpus: int) -> bool:
    """An idle `node` could hold the job's CPUs and memory with `gpus` GPUs there."""
    if req.ask.exclusive:
        return True
    cpus, mem = need_on(req.ask, gpus, node)
    return cpus <= node.cpus and mem <= node.mem_mb


def _most_gpus(node: NodeView, req: JobRequest) -> int:
    """The most GPUs an idle `node` could give a split job, its CPUs and memory counted."""
    for gpus in range(len(node.gpu_indices), 0, -1):
        if _holds(node, req, gpus):
            return gpus
    return 0


def ask_never_fits(req: JobRequest, eligible: Collection[NodeView], restricted: bool) -> str | None:
    """Why no idle node of `eligible` (those its filters accept, each with GPUs enough for
    it) could hold the job's CPUs and memory, or None.  `restricted`: its filters left out
    some nodes (the sentence then says "it may use")."""
    if req.ask.exclusive:
        return None  # an idle node is all its own
    if req.node_gpu_ids is not None:
        wanted: dict[str, set[int]] = {}
        for nid, ids in req.node_gpu_ids:
            wanted.setdefault(nid, set()).update(ids)
        for node in eligible:
            gpus = len(wanted.get(node.node_id, ()))
            if node.node_id in wanted and not _holds(node, req, gpus):
                return _sentence(req, gpus, [node], restricted=True)
        return None
    if req.nodes is not None:
        per = gpus_per_node(req) or 0
        fit: list[NodeView] = []
        for v in eligible:  # stops once it has enough
            if len(v.gpu_indices) >= per and _holds(v, req, per):
                fit.append(v)
                if len(fit) >= req.nodes:
                    return None
        if fit:
            have = "has" if len(fit) == 1 else "have"
            cpus, mem = need_on(req.ask, per, fit[0])
            return (
                f"{NOT_AVAILABLE}: the job needs {req.nodes} nodes with {_plural(per, 'GPU')} "
                f"and {_ask(req, cpus, mem)} each but only {len(fit)} {have} that much"
            )
        return _sentence(req, per, eligible, restricted)
    if req.gpu_ids is not None:
        asked = set(req.gpu_ids)
        sized = [v for v in eligible if asked <= set(v.gpu_indices)]
        gpus = len(asked)
    else:
        gpus = 1 if req.gpu_share else req.gpus
        if req.distributed and gpus > max((len(v.gpu_indices) for v in eligible), default=0):
            if sum(_most_gpus(v, req) for v in eligible) >= gpus:
                return None
            return _sentence(req, 1, eligible, restricted)
        if any(len(v.gpu_indices) >= gpus and _holds(v, req, gpus) for v in eligible):
            return None  # (usually the first node: a walk, not a list)
        sized = [v for v in eligible if len(v.gpu_indices) >= gpus]
    if any(_holds(v, req, gpus) for v in sized):
        return None
    return _sentence(req, gpus, sized or eligible, restricted)


def _ask(req: JobRequest, cpus: int, mem: int) -> str:
    """What the job asks of a node, in words (`--mem=0`: all of its memory)."""
    text = ask_text(cpus, 0 if req.ask.whole_memory else mem)
    if req.ask.whole_memory:
        text = " and ".join(filter(None, (text, "all of its memory")))
    return text or "nothing"


def _sentence(req: JobRequest, gpus: int, nodes: Collection[NodeView], restricted: bool) -> str:
    """Slurm's refusal with the short resource and the most any of `nodes` offers."""
    where = "any node it may use" if restricted else "any node"
    most_cpus = max((v.cpus for v in nodes), default=0)
    most_mem = max((v.mem_mb for v in nodes), default=0)
    probe = max(nodes, key=lambda v: (v.cpus, v.mem_mb)) if nodes else None
    cpus, mem = need_on(req.ask, gpus, probe) if probe is not None else (0, 0)
    if cpus > most_cpus:
        offers = f"the most {where} offers is {most_cpus}" if most_cpus else f"{where} reports none"
        return f"{NOT_AVAILABLE}: {_plural(cpus, 'CPU')} asked per node, {offers}"
    if not req.ask.whole_memory and mem > most_mem:
        offers = (
            f"the most {where} offers is {format_mb(most_mem)}"
            if most_mem
            else f"{where} reports none"
        )
        return f"{NOT_AVAILABLE}: {format_mb(mem)} of memory asked per node, {offers}"
    what = f"{_plural(gpus, 'GPU')} with {_ask(req, cpus, mem)}" if gpus else _ask(req, cpus, mem)
    return f"{NOT_AVAILABLE}: no node {'it may use ' if restricted else ''}offers {what} together"


def ask_wait_reason(req: JobRequest, pool: FreePool) -> str:
    """Why a job that asks for CPUs, memory or whole nodes waits, as the pool is now (the
    short resource and the most free on one node, when one is short)."""
    ask = req.ask
    if req.nodes is not None:
        per = gpus_per_node(req) or 0
        if ask.exclusive:
            return f"waiting for {_plural(req.nodes, 'whole node')}"
        cpus, mem = ask.cpus_on(per, 0), ask.mem_on(per, ask.cpus_on(per, 0), 0)
        return (
            f"waiting for {_plural(req.nodes, 'node')} with {_plural(per, 'free GPU')} "
            f"and {_ask(req, cpus, mem)} free each"
        )
    if ask.exclusive:
        return "waiting for a whole node"
    if req.node_gpu_ids is not None:
        gpus = max(len(set(ids)) for _, ids in req.node_gpu_ids)
    elif req.gpu_ids is not None:
        gpus = len(set(req.gpu_ids))
    elif req.gpu_share:
        gpus = 1
    else:
        gpus = req.gpus
    cpus = ask.cpus_on(gpus, 0)
    mem = ask.mem_on(gpus, cpus, 0)
    if req.node_gpu_ids is not None:
        most_cpus, most_mem = pool.most_room({nid for nid, _ in req.node_gpu_ids})
    else:
        most_cpus, most_mem = pool.most_room(pool.eligible(req).nodes)
    if cpus > most_cpus:
        return f"waiting for {_plural(cpus, 'CPU')}: the most free on one node is {most_cpus}"
    if not ask.whole_memory and mem > most_mem:
        return (
            f"waiting for {format_mb(mem)} of memory: "
            f"the most free on one node is {format_mb(most_mem)}"
        )
    gpu_text = f"{_plural(gpus, 'GPU')} with " if gpus and not req.gpu_share else ""
    return f"waiting for {gpu_text}{_ask(req, cpus, mem)} free on one node"
