"""What a scheduling pass can ask a `FreePool`, gathered for comparing two pools."""

from __future__ import annotations

from typing import Any

from mgpu.scheduler import FreePool, JobRequest


def observed(pool: FreePool) -> dict[str, Any]:
    """Everything a pass can ask a pool."""
    ids = sorted(pool.views)
    top = max((len(v.gpu_indices) for v in pool.views.values()), default=0)
    plain = JobRequest(job_id="q", user="u", submit_time=0.0)
    typed = JobRequest(job_id="t", user="u", submit_time=0.0, gpu_type="a100")
    featured = JobRequest(job_id="f", user="u", submit_time=0.0, requires=frozenset({"podman"}))
    return {
        "total_free": pool.total_free,
        "up_count": pool.up_count,
        "views": {nid: pool.views[nid] for nid in ids},
        "up": sorted(pool.up_views()),
        "free": {nid: sorted(pool.free(nid)) for nid in ids},
        "usable": {nid: sorted(pool.usable(nid)) for nid in ids},
        "shared": {nid: dict(pool.shared(nid)) for nid in ids},
        "room": {nid: (pool.free_cpus(nid), pool.free_mem(nid)) for nid in ids},
        "most_room": pool.most_room(),
        "at_least": [pool.nodes_with_at_least(k) for k in range(top + 2)],
        "order": {
            policy: [list(pool.iter_nodes(k, policy)) for k in range(top + 2)]
            for policy in ("fill_first", "spread")
        },
        "best": [pool.best_node(k, "fill_first") for k in range(top + 2)],
        "best_shared": [
            pool.best_shared(units, policy)
            for units in (100, 500, 1000)
            for policy in ("fill_first", "spread")
        ],
        "eligible": [pool.eligible(r) for r in (plain, typed, featured)],
    }
