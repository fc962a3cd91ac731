"""The time the control loop reads: wall time for what it writes (status times, certificate validity, invite
expiry) and a monotonic clock for what it schedules (pull intervals, backoffs, cache lifetimes).

Every reconciler takes its time from the `Clock` of its `Context`, never from `time` or `datetime` directly, so a
test can run a reconciler twice at chosen moments (a fake clock) and count what the second pass writes.
"""

from __future__ import annotations

import datetime
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime.datetime:
        """The wall time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()
