"""The loop watchdog of tests/conftest.py: a loop blocked by time.sleep is caught, with the time and the blocking
line; an honest loop and a loop that is merely not running (between a test's phases) are not; a whole pytest run
fails a blocking test (in a loop of its own or a module's), leaves a marked one alone, and refuses a bad bound
saying what to set."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from tests.conftest import (BLOCK_BOUND_DEFAULT, BLOCK_BOUND_ENV, BLOCK_BOUND_REAL_DEFAULT, LoopWatchdog,
                            block_bound)

pytest_plugins = ["pytester"]

CONFTEST = pathlib.Path(__file__).with_name("conftest.py")
BOUND = 0.2


def _watch(coro_fn) -> LoopWatchdog:
    loop = asyncio.new_event_loop()
    try:
        watchdog = LoopWatchdog(loop, BOUND).start()
        try:
            loop.run_until_complete(coro_fn())
        finally:
            watchdog.stop()
    finally:
        loop.close()
    return watchdog


@pytest.mark.parametrize("then_awaits", [True, False], ids=["then-awaits", "then-ends"])
def test_a_loop_blocked_by_time_sleep_is_caught_with_the_time_and_the_line(then_awaits):
    async def blocks_with_time_sleep():
        await asyncio.sleep(0.05)
        time.sleep(BOUND * 4)
        if then_awaits:  # else the watchdog is stopped before the loop ever got control back
            await asyncio.sleep(0.05)

    watchdog = _watch(blocks_with_time_sleep)
    assert len(watchdog.stalls) == 1, watchdog.stalls
    stall = watchdog.stalls[0]
    assert stall.seconds >= BOUND * 4 * 0.9
    assert "blocks_with_time_sleep" in stall.stack and "time.sleep(BOUND * 4)" in stall.stack
    report = watchdog.report()
    assert f"{stall.seconds:.2f}s" in report and BLOCK_BOUND_ENV in report and "blocks_loop" in report


def test_an_honest_loop_that_waits_long_is_not_blocked():
    async def waits():
        for _ in range(4):
            await asyncio.sleep(BOUND)

    watchdog = _watch(waits)
    assert watchdog.stalls == []
    assert 0 < watchdog.longest < BOUND


def test_time_in_which_the_loop_does_not_run_is_not_counted():
    loop = asyncio.new_event_loop()
    try:
        watchdog = LoopWatchdog(loop, BOUND).start()
        try:
            for _ in range(4):
                loop.run_until_complete(asyncio.sleep(0.03))
                time.sleep(BOUND * 2)  # the loop is stopped here, as between a test's phases: nobody is blocked
        finally:
            watchdog.stop()
    finally:
        loop.close()
    assert watchdog.stalls == []


def test_a_bound_that_is_not_positive_is_refused():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="positive number of seconds"):
            LoopWatchdog(loop, 0)
    finally:
        loop.close()


def test_the_bound_is_the_default_the_real_backends_or_the_environments(monkeypatch):
    monkeypatch.delenv(BLOCK_BOUND_ENV, raising=False)
    assert (block_bound(), block_bound(real=True)) == (BLOCK_BOUND_DEFAULT, BLOCK_BOUND_REAL_DEFAULT)
    monkeypatch.setenv(BLOCK_BOUND_ENV, "0.5")
    assert (block_bound(), block_bound(real=True)) == (0.5, 0.5)
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv(BLOCK_BOUND_ENV, bad)
        with pytest.raises(pytest.UsageError, match=f"{BLOCK_BOUND_ENV}=.* is not a positive number of seconds"):
            block_bound()


def _suite(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
                     "filterwarnings = error\naddopts = --strict-markers\n")
    pytester.makepyfile(test_blocking="""
        import asyncio, time
        import pytest

        async def test_blocks():
            time.sleep(1.0)

        @pytest.mark.blocks_loop(reason="shows that a marked test may block")
        async def test_blocks_on_purpose():
            time.sleep(1.0)

        async def test_awaits():
            await asyncio.sleep(1.0)

        @pytest.mark.asyncio(loop_scope="module")
        async def test_blocks_in_a_module_loop():
            time.sleep(1.0)

        def test_sync_code_may_sleep():
            time.sleep(1.0)
    """)


def test_a_pytest_run_fails_the_tests_that_block_and_only_them(pytester, monkeypatch):
    _suite(pytester)
    monkeypatch.setenv(BLOCK_BOUND_ENV, "0.3")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*_ test_blocks _*",
                                 "*the event loop did not get control back for *s (bound 0.3s*",
                                 '*test_blocking.py", line 5, in test_blocks',
                                 "*time.sleep(1.0)*"])
    assert "base_events.py" not in result.stdout.str()
    summary = result.stdout.str().split("short test summary")[-1]
    assert "FAILED test_blocking.py::test_blocks_in_a_module_loop" in summary
    assert "test_blocks_on_purpose" not in summary and "test_awaits" not in summary


def test_a_bad_bound_stops_the_run_saying_what_to_set(pytester, monkeypatch):
    _suite(pytester)
    monkeypatch.setenv(BLOCK_BOUND_ENV, "soon")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{BLOCK_BOUND_ENV}='soon' is not a positive number of seconds*"])
