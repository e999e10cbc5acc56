"""Idempotent submits: the same submit sent twice makes one job.

A client whose submit's answer was lost (the master was killed, another took over, the
connection broke) cannot know whether the job was made.  It sends the submit again with
the same `Idempotency-Key` header (a random key of its own per submit), and the master
answers with the job the first one made, if it made one.  The key is stored with the job,
in the job's transaction (`submit_keys`), so that a master that takes over knows it; a
second request while the first is still being admitted here waits for the first's answer.
Keys are forgotten after a day (control/retention.py).

A key is not looked up before the submit: nearly every submit is a first one, and a
lookup is a round trip to the database on the submit's way.  Its row goes in with the
job's; a key stored already makes that transaction fail whole (KeyTaken, the row's
unique constraint: store/submitbatch.py sorts a batch out), and only then is the stored
job looked up and given as the answer.

A key is one user's: stored and looked up by (user, key), so another user who sends the
same key (guessed, seen, or by chance) makes a submit of their own: never the first one's
job, and never a refusal that would let one user block another's key (docs/SECURITY.md).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

from mgpu import spec as specs
from mgpu.master.control.submit import SubmitError
from mgpu.master.store.base import KeyTaken, Store

__all__ = ["KEPT_S", "KEY_PATTERN", "Made", "SubmitKeys"]

KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{8,128}")
"""What a key may be: a client's random token (mgpu sends 32 hex digits)."""

KEPT_S = 24 * 3600.0
"""How long a key is kept: a client retries within seconds, or a failover's minute."""

Made = tuple[str, tuple[str, ...] | None]
"""What a submit made: the job's id, and an array's task ids."""


class SubmitKeys:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._in_flight: dict[tuple[str, str], asyncio.Future[Made]] = {}
        """(user, key) of the submits being made here: the answer to come."""

    async def once(self, key: str, user: str, make: Callable[[], Awaitable[Made]]) -> Made:
        """What the submit with this key made: before (here or on another master), or now
        by `make()`.  A key of another user's submit is refused: it is not theirs to see."""
        if not KEY_PATTERN.fullmatch(key):
            raise SubmitError("Idempotency-Key: 8 to 128 letters, digits or '_.:-'")
        if (made_by_first := self._in_flight.get((user, key))) is not None:
            return await asyncio.shield(made_by_first)  # the same submit, still being made
        running: asyncio.Future[Made] = asyncio.get_running_loop().create_future()
        self._in_flight[user, key] = running
        try:
            try:
                made = await make()
            except KeyTaken:  # sent before (here or to another master): that job
                earlier = self._stored(key, user)
                if earlier is None:  # pruned meanwhile (a day old): never expected
                    raise SubmitError("this Idempotency-Key was used and forgotten") from None
                made = earlier
        except BaseException as e:
            running.set_exception(e if isinstance(e, Exception) else SubmitError(str(e)))
            running.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            self._in_flight.pop((user, key), None)
        running.set_result(made)
        return made

    def _stored(self, key: str, user: str) -> Made | None:
        job_id = self.store.job_of_submit_key(key, user)
        if job_id is None:
            return None
        array = self.store.get_array(job_id)
        if array is not None:
            template, indices, _ = array
            owner: str | None = template.user
            tasks: tuple[str, ...] | None = tuple(specs.array_task_id(job_id, i) for i in indices)
        else:
            job = self.store.get_job(job_id)
            owner, tasks = (None if job is None else job.user), None
        _check_owner(owner, user)
        return job_id, tasks


def _check_owner(owner: str | None, user: str) -> None:
    """Refuse `user` a key whose job is not theirs (its job since gone): never expected,
    the key being looked up by its user."""
    if owner != user:
        raise SubmitError("this Idempotency-Key belongs to another submit")
