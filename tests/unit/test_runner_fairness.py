"""The runner serves tenants fairly: a burst from one cannot hold back another's summaries."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from app.memory.runner import SummaryRunner


class Work:
    """Summaries that run until released, recording the order in which they got a slot."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}

    async def __call__(self, memory_id: int) -> None:
        self.started.append(memory_id)
        gate = self.gates.setdefault(memory_id, asyncio.Event())
        await gate.wait()

    def release(self, memory_id: int) -> None:
        self.gates.setdefault(memory_id, asyncio.Event()).set()


async def _nothing(_owned: list[int]) -> None:
    return None


def runner(work: Work, *, max_concurrent: int, max_pending: int) -> SummaryRunner:
    made = SummaryRunner(
        work=work,
        maintenance=_nothing,
        max_concurrent=max_concurrent,
        max_pending=max_pending,
        maintenance_interval=3600,
    )
    made.accepting = True
    return made


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_quiet_tenant_gets_the_next_slot_before_a_bursting_one() -> None:
    work = Work()
    run = runner(work, max_concurrent=2, max_pending=100)
    for memory_id in range(1, 21):  # tenant A: 20 summaries
        run.submit(memory_id, "A")
    await settle()
    run.submit(100, "B")  # tenant B arrives behind A's 18 waiting ones
    await settle()
    assert work.started == [1, 2]
    work.release(1)
    await settle()
    assert work.started == [1, 2, 100]  # B has none running: it goes first
    work.release(2)
    await settle()
    assert work.started == [1, 2, 100, 3]
    for memory_id in list(work.gates) + list(range(1, 101)):
        work.release(memory_id)
    await asyncio.wait_for(run.wait_idle(), 5)
    assert sorted(work.started) == [*range(1, 21), 100]


async def test_each_tenant_may_queue_beyond_a_full_shared_queue() -> None:
    work = Work()
    run = runner(work, max_concurrent=1, max_pending=2)
    for memory_id in (1, 2, 3):
        assert run.has_capacity("A")
        run.submit(memory_id, "A")
    await settle()
    assert not run.has_capacity("A")  # 1 running + 2 waiting: the shared queue is full
    assert run.has_capacity("B")  # but B, holding none, has its reserve of one
    run.submit(4, "B")
    await settle()
    assert not run.has_capacity("B")
    for memory_id in (1, 2, 3, 4):
        work.release(memory_id)
    await asyncio.wait_for(run.wait_idle(), 5)


@settings(max_examples=50, deadline=None)
@given(
    arrivals=st.lists(st.sampled_from("ABC"), min_size=1, max_size=40),
    slots=st.integers(min_value=1, max_value=4),
)
def test_slots_are_never_oversubscribed_and_every_summary_runs(arrivals: list[str], slots: int) -> None:
    async def scenario() -> None:
        work = Work()
        run = runner(work, max_concurrent=slots, max_pending=1000)
        for memory_id, tenant in enumerate(arrivals):
            run.submit(memory_id, tenant)
        await settle()
        done = 0
        while done < len(arrivals):
            assert run.running <= slots
            assert run.running == min(slots, len(arrivals) - done)
            work.release(work.started[done])
            done += 1
            await settle()
        await asyncio.wait_for(run.wait_idle(), 5)
        assert sorted(work.started) == list(range(len(arrivals)))

    asyncio.run(scenario())


async def test_a_waiting_summary_cancelled_at_shutdown_gives_up_its_place() -> None:
    work = Work()
    run = runner(work, max_concurrent=1, max_pending=10)
    run.submit(1, "A")
    run.submit(2, "A")
    run.submit(3, "B")
    await settle()
    waiting = run._tasks[2]
    waiting.cancel()
    await settle()
    work.release(1)
    await settle()
    assert work.started == [1, 3]
    work.release(3)
    await asyncio.wait_for(run.wait_idle(), 5)
