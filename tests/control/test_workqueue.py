"""The work queue's semantics without any server: dedup, one worker per key, backoff, requeue_after, rate limit."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.workqueue import Backoff, Result, Runner, TokenBucket, WorkQueue, key_of, split_key


def test_key_of_and_split_key():
    assert key_of({"metadata": {"name": "a"}}) == "a"
    assert key_of({"metadata": {"name": "a", "namespace": "ns"}}) == "ns/a"
    assert split_key("ns/a") == ("ns", "a")
    assert split_key("a") == (None, "a")


def test_backoff_doubles_up_to_the_cap_and_forgets():
    b = Backoff(base=0.1, cap=1.0)
    assert [b.next_delay("k") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.next_delay("other") == 0.1
    b.forget("k")
    assert b.next_delay("k") == 0.1
    for _ in range(5000):
        b.next_delay("storm")
    assert b.next_delay("storm") == 1.0


def test_token_bucket_allows_a_burst_then_spaces_tokens():
    now = [0.0]
    bucket = TokenBucket(qps=10, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    now[0] = 10.0
    assert bucket.reserve() == 0.0


async def test_queued_keys_are_deduplicated():
    q = WorkQueue()
    for key in ["a", "b", "a", "a", "b", "c"]:
        q.add(key)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_a_key_added_while_processing_waits_until_done():
    q = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    assert len(q) == 0, "a key being processed must not be handed to a second worker"
    q.done(key)
    assert len(q) == 1
    assert await q.get() == "a"


async def test_add_after_keeps_the_earliest_and_shutdown_cancels_timers():
    q = WorkQueue()
    q.add_after("a", 30.0)
    q.add_after("a", 0.01)
    q.add_after("a", 60.0)
    assert await asyncio.wait_for(q.get(), 2) == "a"
    q.done("a")
    q.add_after("b", 30.0)
    q.shutdown()
    assert not q._timers
    q.add("c")
    assert len(q) == 0


class Recorder:
    name = "recorder"
    watches = ()

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.calls: list[str] = []
        self.active: set[str] = set()
        self.overlap = False
        self.changed = asyncio.Event()

    async def reconcile(self, key):
        if key in self.active:
            self.overlap = True
        self.active.add(key)
        try:
            self.calls.append(key)
            self.changed.set()
            return await self.behaviour(key, len([c for c in self.calls if c == key]))
        finally:
            self.active.discard(key)


async def wait_for_calls(rec: Recorder, n: int, timeout: float = 5.0):
    async def poll():
        while len(rec.calls) < n:
            rec.changed.clear()
            await rec.changed.wait()
    await asyncio.wait_for(poll(), timeout)


async def test_failures_are_retried_with_backoff_then_forgotten():
    async def flaky(key, attempt):
        if attempt < 3:
            raise RuntimeError("boom")
        return Result()

    rec = Recorder(flaky)
    runner = Runner(rec, workers=2, backoff=Backoff(base=0.001, cap=0.01))
    runner.start()
    try:
        runner.queue.add("k")
        await wait_for_calls(rec, 3)
        assert runner.failures == 2
        # The success reset the key's failure count.
        for _ in range(100):
            if runner.queue.backoff.failures("k") == 0:
                break
            await asyncio.sleep(0)
        assert runner.queue.backoff.failures("k") == 0
    finally:
        await runner.stop()


async def test_requeue_after_reconciles_again_without_an_event():
    async def periodic(key, attempt):
        return Result(requeue_after=0.01)

    rec = Recorder(periodic)
    runner = Runner(rec, workers=1)
    runner.start()
    try:
        runner.queue.add("k")
        await wait_for_calls(rec, 3)
        assert set(rec.calls) == {"k"}
    finally:
        await runner.stop()


async def test_one_worker_per_key_even_with_many_workers():
    release = asyncio.Event()

    async def slow(key, attempt):
        await release.wait()
        return Result()

    rec = Recorder(slow)
    runner = Runner(rec, workers=4)
    runner.start()
    try:
        runner.queue.add("k")
        await wait_for_calls(rec, 1)
        for _ in range(10):
            runner.queue.add("k")
            await asyncio.sleep(0)
        assert rec.calls == ["k"]
        release.set()
        await wait_for_calls(rec, 2)
        assert not rec.overlap
    finally:
        await runner.stop()


async def test_stop_cancels_a_reconcile_in_flight():
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever(key, attempt):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rec = Recorder(forever)
    runner = Runner(rec, workers=1)
    runner.start()
    runner.queue.add("k")
    await asyncio.wait_for(started.wait(), 5)
    await runner.stop()
    assert cancelled.is_set()
    assert not runner.running


@given(st.lists(st.tuples(st.sampled_from(["add", "get", "done"]), st.sampled_from("abc")), max_size=60))
@settings(max_examples=200, deadline=None)
def test_queue_invariants_hold_for_any_sequence(ops):
    """Whatever the order of adds, gets and dones: a key is queued at most once, never queued while being
    processed, and a key added during processing comes back after done."""

    async def run():
        q = WorkQueue()
        added_while_processing: set[str] = set()
        for op, key in ops:
            if op == "add":
                if key in q.processing:
                    added_while_processing.add(key)
                q.add(key)
            elif op == "get" and len(q):
                got = await q.get()
                assert got not in added_while_processing
            elif op == "done" and key in q.processing:
                q.done(key)
                if key in added_while_processing:
                    assert key in q._queue
                    added_while_processing.discard(key)
            queued = list(q._queue)
            assert len(queued) == len(set(queued))
            assert not set(queued) & q.processing
        q.shutdown()

    asyncio.run(run())
