"""Placement of one job on the free GPUs of a pass, and `could_ever_fit` at submit time."""

from __future__ import annotations

import pytest

from factories import job, node
from mgpu.scheduler import FreePool, JobRequest, NodeView, Placement, could_ever_fit, place
from mgpu.scheduler.placement import wait_reason


def placed(
    req: JobRequest, nodes: list[NodeView], policy: str = "fill_first"
) -> list[tuple[str, tuple[int, ...]]] | None:
    result = place(req, FreePool(nodes), policy)  # type: ignore[arg-type]
    return None if result is None else [(p.node_id, p.gpu_ids) for p in result]


# --------------------------------------------------------------------------- policies


def test_fill_first_picks_the_busiest_node_that_still_fits() -> None:
    nodes = [node("node001"), node("node002", [2, 3]), node("node003", [1, 2, 3])]
    assert placed(job(gpus=2), nodes) == [("node002", (2, 3))]
    # Three GPUs do not fit on node002, so the next busiest that fits.
    assert placed(job(gpus=3), nodes) == [("node003", (1, 2, 3))]


def test_spread_picks_the_least_loaded_node() -> None:
    nodes = [node("node001", [3]), node("node002", [0, 1, 2, 3]), node("node003", [1, 2])]
    assert placed(job(gpus=1), nodes, "spread") == [("node002", (0,))]


def test_ties_go_to_the_lower_node_id_and_lowest_indices() -> None:
    nodes = [node("node003", [1, 3]), node("node001", [2, 3]), node("node002", [0, 3])]
    assert placed(job(gpus=1), nodes) == [("node001", (2,))]
    assert placed(job(gpus=1), nodes, "spread") == [("node001", (2,))]


def test_per_job_policy_overrides_the_default() -> None:
    nodes = [node("node001", [3]), node("node002")]
    assert placed(job(gpus=1, policy="spread"), nodes, "fill_first") == [("node002", (0,))]
    assert placed(job(gpus=1, policy="fill_first"), nodes, "spread") == [("node001", (3,))]


def test_plain_gpus_never_span_nodes() -> None:
    nodes = [node("node001", [0, 1]), node("node002", [0, 1])]
    assert placed(job(gpus=3), nodes) is None


# --------------------------------------------------------------------------- filters


def test_unschedulable_and_filtered_nodes_are_never_used() -> None:
    nodes = [
        node("node001", up=False),
        node("node002", gpu_type="v100"),
        node("node003", gpu_type="a100", features=["podman"]),
        node("node004", gpu_type="a100"),
    ]
    assert placed(job(gpus=1), nodes) == [("node002", (0,))]
    assert placed(job(gpus=1, gpu_type="a100"), nodes) == [("node003", (0,))]
    assert placed(job(gpus=1, gpu_type="a100", exclude=frozenset({"node003"})), nodes) == [
        ("node004", (0,))
    ]
    assert placed(job(gpus=1, requires=frozenset({"podman"})), nodes) == [("node003", (0,))]
    assert placed(job(gpus=1, nodelist=frozenset({"node001"})), nodes) is None
    assert placed(job(gpus=1, allowed_nodes=frozenset({"node004"})), nodes) == [("node004", (0,))]


def test_nodelist_among_many_nodes_is_scored_by_policy() -> None:
    nodes = [node(f"node{i:03d}") for i in range(100)]
    nodes[50] = node("node050", [1, 2])
    nodes[60] = node("node060", [3])
    req = job(gpus=1, nodelist=frozenset({"node050", "node060", "node070"}))
    assert placed(req, nodes) == [("node060", (3,))]
    assert placed(req, nodes, "spread") == [("node070", (0,))]


# --------------------------------------------------------------------------- gpu ids


def test_gpu_ids_need_those_indices_free_on_one_node() -> None:
    nodes = [node("node001", [0, 2]), node("node002", [0, 1, 3]), node("node003")]
    assert placed(job(gpus=2, gpu_ids=(0, 1)), nodes) == [("node002", (0, 1))]
    assert placed(job(gpus=2, gpu_ids=(0, 1)), nodes, "spread") == [("node003", (0, 1))]
    assert placed(job(gpus=1, gpu_ids=(3,), nodelist=frozenset({"node001"})), nodes) is None


def test_node_gpu_ids_are_strict() -> None:
    nodes = [node("node001", [0, 1]), node("node002", [0, 1, 2, 3]), node("node003", up=False)]
    pinned = (("node001", (0, 1)), ("node002", (3,)))
    assert placed(job(gpus=3, node_gpu_ids=pinned), nodes) == [
        ("node001", (0, 1)),
        ("node002", (3,)),
    ]
    # One GPU busy: the job waits, it never goes elsewhere.
    assert placed(job(gpus=2, node_gpu_ids=(("node001", (1, 2)),)), nodes) is None
    assert placed(job(gpus=1, node_gpu_ids=(("node003", (0,)),)), nodes) is None


def test_wait_reasons_name_what_is_missing() -> None:
    pool = FreePool([node("node001", []), node("node002", [], up=False)])
    assert wait_reason(job(gpus=2), pool) == ("waiting for 2 GPUs", True)
    assert wait_reason(job(gpus=1), pool) == ("waiting for 1 GPU", True)
    assert wait_reason(job(gpus=2, node_gpu_ids=(("node001", (0, 1)),)), pool) == (
        "waiting for GPUs 0,1 on node001",
        True,
    )
    reason, runnable = wait_reason(job(gpus=1, node_gpu_ids=(("node002", (0,)),)), pool)
    assert reason.startswith("node002 is down") and not runnable
    assert wait_reason(job(gpus=8, nodes=2, gpus_per_node=4), pool) == (
        "node002 is down or draining",
        False,
    )
    assert wait_reason(job(gpus=4, nodes=1, gpus_per_node=4), pool) == (
        "waiting for 1 node with 4 free GPUs each",
        True,
    )


# --------------------------------------------------------------------------- gangs


def test_gang_takes_distinct_nodes_all_or_nothing() -> None:
    nodes = [node("node001", [0, 1, 2]), node("node002"), node("node003", [0])]
    got = placed(job(gpus=6, nodes=2, gpus_per_node=3), nodes)
    assert got == [("node001", (0, 1, 2)), ("node002", (0, 1, 2))]
    assert placed(job(gpus=9, nodes=3, gpus_per_node=3), nodes) is None


def test_gang_prefers_one_rack_that_holds_it() -> None:
    nodes = [
        node("node001", [3], rack="r1"),  # busiest, but r1 cannot hold two
        node("node002", rack="r2"),
        node("node003", rack="r2"),
        node("node004", [0, 1], rack="r3"),
    ]
    got = placed(job(gpus=2, nodes=2, gpus_per_node=1), nodes)
    assert got is not None
    assert {n for n, _ in got} == {"node002", "node003"}


def test_gang_spans_the_fewest_racks_when_no_rack_suffices() -> None:
    nodes = [
        node("node001", rack="r1"),
        node("node002", rack="r2"),
        node("node003", rack="r2"),
        node("node004", rack="r3"),
        node("node005", rack="r3"),
    ]
    got = placed(job(gpus=3, nodes=3, gpus_per_node=1), nodes)
    assert got is not None
    racks = {
        n: r
        for n, r in [
            ("node001", "r1"),
            ("node002", "r2"),
            ("node003", "r2"),
            ("node004", "r3"),
            ("node005", "r3"),
        ]
    }
    assert len({racks[n] for n, _ in got}) == 2


# --------------------------------------------------------------------------- distributed / cpu


def test_distributed_splits_only_when_no_node_could_ever_hold_it() -> None:
    nodes = [node("node001", [0, 1, 2]), node("node002", [0, 1]), node("node003", [0])]
    # A 4-GPU node exists, so even --distributed waits for one node with 3 free ... it has.
    assert placed(job(gpus=3, distributed=True), nodes) == [("node001", (0, 1, 2))]
    # 4 GPUs: no node has 4 free now, but nodes have 4 in total: wait, do not split.
    assert placed(job(gpus=4, distributed=True), nodes) is None
    # 6 GPUs exceed every node: split, fewest nodes first.
    got = placed(job(gpus=6, distributed=True), nodes)
    assert got == [("node001", (0, 1, 2)), ("node002", (0, 1)), ("node003", (0,))]
    got = placed(job(gpus=5, distributed=True), [node("a"), node("b"), node("c", [0])])
    assert got is not None and sum(len(g) for _, g in got) == 5 and len(got) == 2


def test_cpu_job_needs_a_node_but_no_gpu() -> None:
    nodes = [node("node001", [], up=False), node("node002", [])]
    assert placed(job(gpus=0), nodes) == [("node002", ())]
    assert placed(job(gpus=0), [node("node001", up=False)]) is None


# --------------------------------------------------------------------------- the pool


def test_pool_buckets_follow_takes_and_releases() -> None:
    pool = FreePool([node("a"), node("b", [0]), node("c", up=False)])
    assert pool.total_free == 5
    assert list(pool.iter_nodes(1, "fill_first")) == ["b", "a"]
    pool.take([Placement("a", (0, 1, 2))])
    assert pool.total_free == 2
    assert list(pool.iter_nodes(1, "fill_first")) == ["a", "b"]
    copy = pool.copy()
    copy.release("a", (0, 1, 9))  # 9 does not exist and is ignored
    assert copy.free("a") == {0, 1, 3} and pool.free("a") == {3}
    assert list(copy.iter_nodes(3, "spread")) == ["a"]
    assert pool.nodes_with_at_least(1) == 2 and copy.nodes_with_at_least(2) == 1


# --------------------------------------------------------------------------- could_ever_fit


CLUSTER = [
    node("node001", gpus=4, gpu_type="a100", features=["podman"]),
    node("node002", gpus=8, gpu_type="a100", up=False),
    node("node003", gpus=2, gpu_type="v100"),
]


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (job(gpus=8), None),  # node002 is down now but could come back
        (job(gpus=0), None),
        (job(gpus=14, distributed=True), None),
        (job(gpus=8, nodes=2, gpus_per_node=4), None),
        (
            job(gpus=16),
            "no node has 16 GPUs (the largest has 8); "
            "use --nodes/--gpus-per-node or --distributed to span nodes",
        ),
        (job(gpus=15, distributed=True), "the job asks for 15 GPUs but the cluster has only 14"),
        (job(gpus=1, node_gpu_ids=(("node009", (0,)),)), "node node009 is not in the cluster"),
        (
            job(gpus=1, node_gpu_ids=(("node001", (7,)),)),
            "node001 has no GPU 7 (it has GPUs 0-3)",
        ),
        (
            job(gpus=1, nodelist=frozenset({"node001", "node404"})),
            "node node404 is not in the cluster",
        ),
        (
            job(gpus=2, gpu_ids=(4, 5), nodelist=frozenset({"node001"})),
            "node001 has no GPUs 4,5 (it has GPUs 0-3)",
        ),
        (
            job(gpus=1, gpu_ids=(9,)),
            "no node has GPU 9 (the largest, node002, has GPUs 0,1,2,3,4,5,6,7)",
        ),
        (
            job(gpus=1, gpu_type="h100"),
            "no node the job may use has h100 GPUs (the cluster has a100, v100)",
        ),
        (job(gpus=1, requires=frozenset({"apptainer"})), "no node the job may use has apptainer"),
        (
            job(gpus=6, nodes=2, gpus_per_node=3, gpu_type="a100", distributed=True),
            None,
        ),
        (
            job(gpus=6, nodes=3, gpus_per_node=2, gpu_type="a100"),
            "the job needs 3 nodes but only 2 can run it",
        ),
        (
            job(gpus=8, nodes=2, gpus_per_node=4, gpu_type="a100", exclude=frozenset({"node003"})),
            None,
        ),
        (
            job(gpus=16, nodes=2, gpus_per_node=8),
            "the job needs 2 nodes with 8 GPUs each but only 1 has that many",
        ),
        (
            job(gpus=18, nodes=2, gpus_per_node=9),
            "the job needs 2 nodes with 9 GPUs each but only 0 have that many",
        ),
        (
            job(gpus=3, node_gpu_ids=(("node003", (0, 1)),), gpu_type="a100"),
            "node003 has no a100 GPUs",
        ),
        (job(gpus=5, nodes=2), "5 GPUs cannot be split evenly over 2 nodes; give --gpus-per-node"),
        (
            job(gpus=1, allowed_nodes=frozenset()),
            "user alice may not use any of the nodes the job asks for",
        ),
    ],
)
def test_could_ever_fit(req: JobRequest, expected: str | None) -> None:
    assert could_ever_fit(req, CLUSTER) == expected


def test_could_ever_fit_accepts_a_mapping_of_nodes() -> None:
    assert could_ever_fit(job(gpus=4), {n.node_id: n for n in CLUSTER}) is None
