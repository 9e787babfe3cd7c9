"""Background summaries in one process: claiming due work, running it, renewing its leases.

The work itself lives in PostgreSQL (app.repositories.work): due conversations and users, and
queued 'processing' rows. The runner knows work only by its key (any hashable: the service uses
(table, row id)), so one runner, one set of slots and one lease loop serve every kind of work.
A runner claims at most as many pieces as it has free slots (``max_concurrent``), in the
database's fair order across tenants, whenever it is poked (a POST
made a summary due, a summary ended, a slot freed) and at least every ``claim_interval`` seconds,
so work made due by another replica, or left by one that died, is picked up too. Nothing waits
in process memory: a runner that stops loses no work.

A maintenance loop renews the leases of the rows this process owns (so no reaper fails them) and
reaps rows whose runner died. A summary that has run longer than ``max_run_seconds`` (the model
call's own bound plus a margin: it can only be wedged) is no longer renewed, so its lease runs
out and another runner claims it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

# Beyond the model call's bound (MEMORY_LLM_CALL_TIMEOUT_SECONDS), what a summary may spend on its
# few statements (each bounded by DATABASE_STATEMENT_TIMEOUT_SECONDS) before it counts as wedged.
RUN_LIMIT_MARGIN_SECONDS = 60.0
# The default run limit: the default call bound (180 s) plus the margin.
DEFAULT_MAX_RUN_SECONDS = 180.0 + RUN_LIMIT_MARGIN_SECONDS
# The most pieces of work one claim asks for. The summaries of a claim start when it returns, so
# filling 128 free slots in one claim held every summary back until the last of 128 plans was
# made (bench sizing, LLM 1 s: bursts of ~128 starts, then ~2 s with none); in claims of 16 the
# first summaries start while the rest are planned.
CLAIM_BATCH = 16


K = TypeVar("K", bound=Hashable)


class SummaryRunner(Generic[K]):
    def __init__(
        self,
        *,
        claim: Callable[[int], Awaitable[list[K]]],
        work: Callable[[K], Awaitable[None]],
        maintenance: Callable[[list[K]], Awaitable[None]],
        max_concurrent: int,
        claim_interval: float,
        maintenance_interval: float,
        max_run_seconds: float | None = DEFAULT_MAX_RUN_SECONDS,
        expected_failure: Callable[[Exception], str | None] = lambda exc: None,
    ) -> None:
        self._claim = claim
        # A one-line description of a failure the loops expect (the database unavailable), or
        # None: an unexpected one, logged with its traceback.
        self._expected_failure = expected_failure
        self._work = work
        self._maintenance = maintenance
        self.max_concurrent = max_concurrent
        self._claim_interval = claim_interval
        self._maintenance_interval = maintenance_interval
        # None: renew for as long as a summary runs.
        self.max_run_seconds = max_run_seconds
        self._tasks: dict[K, asyncio.Task[None]] = {}
        # When each running summary started.
        self._started: dict[K, float] = {}
        self._overdue_logged: set[K] = set()
        self._poked = asyncio.Event()
        self._claim_lock = asyncio.Lock()
        self._claimer: asyncio.Task[None] | None = None
        self._loops: list[asyncio.Task[None]] = []
        self.accepting = False

    @property
    def running(self) -> int:
        return len(self._tasks)

    def owned(self) -> list[K]:
        """Keys of the summaries this process is running."""
        return list(self._tasks)

    def renewable(self) -> list[K]:
        """The owned summaries whose leases to renew: all but those running past
        ``max_run_seconds``, which are wedged (each is logged once)."""
        if self.max_run_seconds is None:
            return self.owned()
        now = asyncio.get_running_loop().time()
        keep = []
        for key in self._tasks:
            if now - self._started[key] <= self.max_run_seconds:
                keep.append(key)
            elif key not in self._overdue_logged:
                self._overdue_logged.add(key)
                logger.warning(
                    "Summary %s has run %.0fs, past its limit of %.0fs: no longer renewing its "
                    "lease, so another runner claims it again",
                    key,
                    now - self._started[key],
                    self.max_run_seconds,
                )
        return keep

    def start(self, *, claims: bool = True) -> None:
        """Start maintenance and, with ``claims``, claiming work (off on an API replica that
        leaves summaries to workers: MEMORY_RUN_SUMMARIES=false)."""
        self.accepting = claims
        self._loops.append(asyncio.create_task(self._maintain_forever(), name="memory-maintenance"))
        if claims:
            self._claimer = asyncio.create_task(self._claim_forever(), name="memory-claims")
            self._loops.append(self._claimer)

    def poke(self) -> None:
        """Look for work now (something was made due or queued in this process)."""
        self._poked.set()

    async def _claim_forever(self) -> None:
        while True:
            # asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for swallows a
            # cancellation that arrives as the event is set, and this loop would outlive its stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._claim_interval):
                    await self._poked.wait()
            self._poked.clear()
            try:
                await self._claim_while_free()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._log_failure("claiming summary work failed", exc)

    async def claim_now(self) -> int:
        """Claim work until the slots are full or none is left; how many summaries started."""
        return await self._claim_while_free()

    async def _claim_while_free(self) -> int:
        # One claim at a time: a claim in progress finishes (its summaries spawned) before
        # another looks at the slots, so claim_now() + wait_idle() never miss a claimed summary.
        async with self._claim_lock:
            return await self._claim_unlocked()

    async def _claim_unlocked(self) -> int:
        started = 0
        while self.accepting:
            free = self.max_concurrent - len(self._tasks)
            if free <= 0:
                break
            asked = min(free, CLAIM_BATCH)
            claimed = await self._claim(asked)
            for key in claimed:
                self._spawn(key)
            started += len(claimed)
            if len(claimed) < asked:
                break
        return started

    def _spawn(self, key: K) -> None:
        task = asyncio.create_task(self._run(key), name=f"summary-{key}")
        self._tasks[key] = task
        self._started[key] = asyncio.get_running_loop().time()

    async def _run(self, key: K) -> None:
        try:
            await self._work(key)
        finally:
            self._tasks.pop(key, None)
            self._started.pop(key, None)
            self._overdue_logged.discard(key)
            self.poke()  # a slot is free

    async def _maintain_forever(self) -> None:
        while True:
            try:
                await self._maintenance(self.renewable())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._log_failure("memory maintenance failed", exc)
            await asyncio.sleep(self._maintenance_interval)

    def _log_failure(self, what: str, exc: Exception) -> None:
        expected = self._expected_failure(exc)
        if expected is None:
            logger.warning("%s; retrying", what, exc_info=exc)
        else:
            logger.warning("%s (%s); retrying", what, expected)

    @property
    def idle(self) -> bool:
        """No summary runs here and no claim is in progress."""
        return not self._tasks and not self._claim_lock.locked()

    async def wait_idle(self) -> None:
        """Wait until every running summary has ended, those of a claim in progress included."""
        while True:
            async with self._claim_lock:  # a claim in progress spawns its summaries first
                tasks = list(self._tasks.values())
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def shutdown(self, grace_seconds: float) -> None:
        """Stop claiming, give running summaries ``grace_seconds`` to finish, cancel the rest
        (the work function gives their rows back to the queue, or a reaper's claim finds their
        leases expired if the database is gone)."""
        self.accepting = False
        if self._claimer is not None:
            self._claimer.cancel()
        if self._tasks:
            logger.info("Waiting up to %.0fs for %d summaries", grace_seconds, len(self._tasks))
            try:
                await asyncio.wait_for(self.wait_idle(), timeout=grace_seconds)
            except TimeoutError:
                for task in list(self._tasks.values()):
                    task.cancel()
                await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        self._claimer = None
