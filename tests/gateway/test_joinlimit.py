"""The join listener's rate limit (gateway/joinlimit.py) on a fake clock."""

from __future__ import annotations

from gateway.joinlimit import JoinRateLimit


def test_refusals_within_a_minute_block_an_address_until_the_oldest_is_a_minute_old():
    now = [1000.0]
    limit = JoinRateLimit(3, clock=lambda: now[0])
    for _ in range(3):
        assert limit.allows("10.0.0.1")
        limit.refused("10.0.0.1")
        now[0] += 10
    assert not limit.allows("10.0.0.1") and limit.allows("10.0.0.2")
    now[0] = 1060.5  # the first refusal is now more than a minute old
    assert limit.allows("10.0.0.1")


def test_the_table_of_addresses_is_bounded():
    limit = JoinRateLimit(1, clock=lambda: 0.0, max_keys=2)
    for address in ("a", "b", "c"):
        limit.refused(address)
    # Full, it forgets the least recently refused address only, never every one at once.
    assert len(limit) == 2 and limit.allows("a") and not limit.allows("b") and not limit.allows("c")
