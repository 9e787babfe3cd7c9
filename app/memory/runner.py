"""Background summaries: one runner owns starting, capping, tracking and stopping them.

Each summary is an asyncio task (a reference is kept until it ends). At most
``max_concurrent`` run at once; up to ``max_pending`` more may wait for a slot, and past that
``has_capacity()`` is False so the service does not start new ones (the next round retries).
Tenants are served fairly: a free slot goes to the waiting tenant with the fewest summaries
running (among equals, the one given a slot longest ago), and a tenant holding fewer than
``max_concurrent`` summaries may submit one even when others have filled the queue, so one
tenant's burst cannot hold back another's summaries.
A maintenance loop renews the leases of the rows this process owns (so no reaper fails them)
and reaps expired leases left by dead workers. A summary that has run longer than
``max_run_seconds`` (the model call's own bound plus a margin: it can only be wedged) is no
longer renewed, so its lease runs out and a reaper on any replica fails its row.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

# Beyond the model call's bound (MEMORY_LLM_CALL_TIMEOUT_SECONDS), what a summary may spend on its
# few statements (each bounded by DATABASE_STATEMENT_TIMEOUT_SECONDS) before it counts as wedged.
RUN_LIMIT_MARGIN_SECONDS = 60.0
# The default run limit: the default call bound (180 s) plus the margin.
DEFAULT_MAX_RUN_SECONDS = 180.0 + RUN_LIMIT_MARGIN_SECONDS


class SummaryRunner:
    def __init__(
        self,
        *,
        work: Callable[[int], Awaitable[None]],
        maintenance: Callable[[list[int]], Awaitable[None]],
        max_concurrent: int,
        max_pending: int,
        maintenance_interval: float,
        max_run_seconds: float | None = DEFAULT_MAX_RUN_SECONDS,
    ) -> None:
        self._work = work
        self._maintenance = maintenance
        self.max_concurrent = max_concurrent
        self.max_pending = max_pending
        self._interval = maintenance_interval
        # None: renew for as long as a summary runs.
        self.max_run_seconds = max_run_seconds
        self._free_slots = max_concurrent
        # Per tenant, the summaries waiting for a slot: (arrival number, future to wake it).
        self._queues: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()
        self._running_by_tenant: Counter[str] = Counter()
        # When each tenant was last given a slot, to take turns among tenants running as many.
        self._grants = itertools.count()
        self._last_granted: dict[str, int] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # When each running summary got its slot (waiting for one does not count).
        self._started: dict[int, float] = {}
        self._overdue_logged: set[int] = set()
        self._running = 0
        self._maintainer: asyncio.Task[None] | None = None
        self.accepting = False

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._tasks) - self._running

    def owned(self) -> list[int]:
        """Memory ids of the summaries this process is running or about to run."""
        return list(self._tasks)

    def renewable(self) -> list[int]:
        """The owned summaries whose leases to renew: all but those running past
        ``max_run_seconds``, which are wedged (each is logged once)."""
        if self.max_run_seconds is None:
            return self.owned()
        now = asyncio.get_running_loop().time()
        keep = []
        for memory_id in self._tasks:
            started = self._started.get(memory_id)
            if started is None or now - started <= self.max_run_seconds:
                keep.append(memory_id)
            elif memory_id not in self._overdue_logged:
                self._overdue_logged.add(memory_id)
                logger.warning(
                    "Summary %d has run %.0fs, past its limit of %.0fs: no longer renewing its "
                    "lease, so a reaper fails it",
                    memory_id,
                    now - started,
                    self.max_run_seconds,
                )
        return keep

    def has_capacity(self, tenant: str) -> bool:
        """Whether a summary of ``tenant`` may be submitted: the queue has room, or others
        filled it and the tenant holds fewer than ``max_concurrent`` summaries (its reserve, so
        that the bound grows by at most ``max_concurrent`` per tenant)."""
        if not self.accepting:
            return False
        if len(self._tasks) < self.max_concurrent + self.max_pending:
            return True
        held = self._running_by_tenant[tenant] + len(self._queues.get(tenant, ()))
        return held < self.max_concurrent

    def start(self) -> None:
        self.accepting = True
        self._maintainer = asyncio.create_task(self._maintain_forever(), name="memory-maintenance")

    def submit(self, memory_id: int, tenant: str) -> None:
        """Run the summary of ``memory_id`` in the background (its row is already committed)."""
        task = asyncio.create_task(self._run(memory_id, tenant), name=f"summary-{memory_id}")
        self._tasks[memory_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(memory_id, None))

    async def _acquire_slot(self, tenant: str) -> None:
        """Take a slot for ``tenant``, waiting for one fairly; counted in _running_by_tenant."""
        if self._free_slots > 0 and not self._queues:
            self._free_slots -= 1
            self._grant(tenant)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._arrivals), woken)
        self._queues.setdefault(tenant, deque()).append(entry)
        try:
            await woken  # the releasing task hands its slot over (see _release_slot)
        except asyncio.CancelledError:
            queue = self._queues.get(tenant)
            if queue is not None and entry in queue:
                queue.remove(entry)
                if not queue:
                    del self._queues[tenant]
            elif woken.done() and not woken.cancelled():
                self._running_by_tenant[tenant] -= 1  # handed a slot while being cancelled:
                self._release_slot()  # pass it on
            raise

    def _release_slot(self) -> None:
        """Hand the slot to the waiting tenant with the fewest running (among equals, the one
        served longest ago), else free it."""
        if not self._queues:
            self._free_slots += 1
            return
        tenant = min(
            self._queues,
            key=lambda t: (self._running_by_tenant[t], self._last_granted.get(t, -1), self._queues[t][0][0]),
        )
        queue = self._queues[tenant]
        _, woken = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._grant(tenant)  # counted at once, so the next choice sees it
        woken.set_result(None)

    def _grant(self, tenant: str) -> None:
        self._running_by_tenant[tenant] += 1
        self._last_granted[tenant] = next(self._grants)

    async def _run(self, memory_id: int, tenant: str) -> None:
        await self._acquire_slot(tenant)
        self._running += 1
        self._started[memory_id] = asyncio.get_running_loop().time()
        try:
            await self._work(memory_id)
        finally:
            self._running -= 1
            self._running_by_tenant[tenant] -= 1
            if not self._running_by_tenant[tenant]:
                del self._running_by_tenant[tenant]
            self._started.pop(memory_id, None)
            self._overdue_logged.discard(memory_id)
            self._release_slot()

    async def _maintain_forever(self) -> None:
        while True:
            try:
                await self._maintenance(self.renewable())
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("memory maintenance failed; retrying next tick", exc_info=True)
            await asyncio.sleep(self._interval)

    async def wait_idle(self) -> None:
        """Wait until every submitted summary has ended (used by tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def shutdown(self, grace_seconds: float) -> None:
        """Stop accepting, give running summaries ``grace_seconds`` to finish, cancel the rest
        (their rows are failed by the work function, or by a reaper if the DB is gone)."""
        self.accepting = False
        if self._tasks:
            logger.info("Waiting up to %.0fs for %d summaries", grace_seconds, len(self._tasks))
            try:
                await asyncio.wait_for(self.wait_idle(), timeout=grace_seconds)
            except TimeoutError:
                for task in list(self._tasks.values()):
                    task.cancel()
                await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
        if self._maintainer is not None:
            self._maintainer.cancel()
            await asyncio.gather(self._maintainer, return_exceptions=True)
            self._maintainer = None
