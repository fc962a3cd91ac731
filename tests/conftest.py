"""Suite-wide rules: warnings are errors (pyproject), every test has a timeout, and no test leaves a task behind."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(autouse=True)
async def _no_leaked_tasks():
    """Fail a test that leaves asyncio tasks running once it and its fixtures are done."""
    before = set(asyncio.all_tasks())
    yield
    # Give tasks that were cancelled during teardown one turn of the loop to finish.
    for _ in range(3):
        leftover = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
        if not leftover:
            return
        await asyncio.sleep(0)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leftover))
    pytest.fail(f"test left {len(leftover)} task(s) running: {names}")
