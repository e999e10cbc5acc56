"""An idempotency key is one user's (master/control/submitkeys.py): a second submit with
the key while the first is still being stored waits for the first's job only when it is
the same user's; another user's same key is a submit of their own, in flight or stored:
never the first one's job, and never refused (no user can block another's key)."""

from __future__ import annotations

import asyncio

from harness import Harness

from mgpu.master.control.cluster import Cluster
from mgpu.master.control.submit import JobSpec

KEY = "k" * 32


async def _submit(cl: Cluster, user: str) -> str:
    result = await cl.submit(JobSpec(command="true"), user, key=KEY)
    return result.job_id


def _race(h: Harness, first: str, second: str) -> list[BaseException | str]:
    """Both submits in one turn of the loop: the second arrives while the first waits
    for its commit (the in-flight answer)."""

    async def main() -> list[BaseException | str]:
        both = (_submit(h.cl, first), _submit(h.cl, second))
        return list(await asyncio.gather(*both, return_exceptions=True))

    return asyncio.run(main())


def test_another_user_racing_the_same_key_makes_their_own_job(h: Harness) -> None:
    h.agent("n1")
    made, theirs = _race(h, "alice", "bob")
    assert isinstance(made, str) and h.stored(made).user == "alice"
    assert isinstance(theirs, str) and theirs != made  # never alice's job id
    assert h.stored(theirs).user == "bob"
    assert sorted(j.id for j in h.cl.jobs.values()) == sorted([made, theirs])
    # Stored now: each user's resend is answered with their own job.
    assert asyncio.run(_submit(h.cl, "bob")) == theirs
    assert asyncio.run(_submit(h.cl, "alice")) == made


def test_the_same_user_racing_a_key_gets_the_one_job(h: Harness) -> None:
    h.agent("n1")
    first, again = _race(h, "alice", "alice")
    assert isinstance(first, str) and again == first
    assert list(h.cl.jobs) == [first]
