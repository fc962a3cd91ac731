"""Nobody can block all joins: the failed-join limit is keyed on the client address the trusted
Ingress reports and on the attempt's token ID, never on the Ingress's own address; a client locked out does not
lock out another joiner; the table stays bounded without forgetting everyone at once."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.joinlimit import JoinRateLimit, client_address, token_id, trusted_networks
from gateway.server import Gateway
from tests.gateway.support import gateway_config

INGRESS = trusted_networks(["10.111.0.0/16", "127.0.0.1"])


@pytest.mark.parametrize("peer,xff,real,expected", [
    ("203.0.113.9", "6.6.6.6", "7.7.7.7", "203.0.113.9"),  # not from a trusted proxy: the headers are not believed
    ("10.111.3.4", "6.6.6.6, 198.51.100.7", None, "198.51.100.7"),  # the Ingress appends the client it saw
    ("10.111.3.4", "198.51.100.7, 10.111.9.9", None, "198.51.100.7"),  # through two trusted hops
    ("10.111.3.4", None, "198.51.100.8", "198.51.100.8"),
    ("10.111.3.4", "not-an-address", None, "10.111.3.4"),  # a header naming nobody: the proxy stands for it
    ("10.111.3.4", None, None, "10.111.3.4"),
    ("10.111.3.4", "[2001:db8::1]:4711", None, "2001:db8::1"),
    ("127.0.0.1", "198.51.100.9:5000", None, "198.51.100.9"),
])
def test_the_client_is_the_one_the_trusted_ingress_reports(peer, xff, real, expected):
    assert client_address(peer, xff, real, INGRESS) == expected


def test_without_trusted_proxies_the_socket_address_is_the_client():
    assert client_address("10.111.3.4", "198.51.100.7", "198.51.100.8", ()) == "10.111.3.4"


def test_a_trusted_proxy_that_is_not_an_address_is_refused_by_name():
    with pytest.raises(ValueError, match="'ingress' is not an IP address or CIDR"):
        trusted_networks(["10.0.0.0/8", "ingress"])


def test_the_token_id_of_an_attempt():
    assert token_id({"token": "abcd1234.secret"}) == "abcd1234"
    assert token_id({"token": "nodot"}) is None and token_id({"token": 5}) is None and token_id([]) is None
    assert token_id({"token": "x" * 17 + ".s"}) is None


def test_a_locked_out_client_locks_out_nobody_else():
    now = [0.0]
    limit = JoinRateLimit(3, clock=lambda: now[0])
    for i in range(3):
        assert limit.allows("198.51.100.1", f"guess{i}")
        limit.refused("198.51.100.1", f"guess{i}")
    assert not limit.allows("198.51.100.1") and not limit.allows("198.51.100.1", "real")
    assert limit.allows("198.51.100.2", "real")  # another joiner, another token ID
    now[0] = 61.0
    assert limit.allows("198.51.100.1")


def test_a_token_id_guessed_at_from_many_addresses_is_locked_for_all_of_them():
    limit = JoinRateLimit(3, clock=lambda: 0.0)
    for i in range(3):
        limit.refused(f"198.51.100.{i}", "target")
    assert not limit.allows("198.51.100.200", "target")
    assert limit.allows("198.51.100.200", "other") and limit.allows("198.51.100.200")


def test_the_table_forgets_the_least_recently_refused_one_at_a_time():
    limit = JoinRateLimit(1, clock=lambda: 0.0, max_keys=100)
    limit.refused("victim-of-nothing")
    for i in range(99):
        limit.refused(f"flood-{i}")
    assert len(limit) == 100 and not limit.allows("victim-of-nothing")
    limit.refused("flood-99")
    assert len(limit) == 100 and limit.allows("victim-of-nothing")  # the oldest only
    assert not any(limit.allows(f"flood-{i}") for i in range(100))


async def test_behind_the_ingress_an_attacker_is_locked_out_and_a_joiner_is_not(pki, upstream, dex, handlers):
    cfg = gateway_config(pki, upstream, dex, join_failures_per_minute=3)
    cfg.trusted_proxies = ("127.0.0.1",)  # the Ingress controller, as the join listener sees it here
    gw = Gateway(cfg, handlers)
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.join_port}/v1/join"
        async with aiohttp.ClientSession() as http:
            async def join(client: str, token: str, spoof: str | None = None) -> int:
                xff = f"{spoof}, {client}" if spoof else client
                async with http.post(url, json={"token": token}, headers={"X-Forwarded-For": xff}) as r:
                    if r.status == 429:
                        body = await r.json()
                        assert body["reason"] == "TooManyAttempts" and token not in body["message"]
                    return r.status

            for i in range(3):
                assert await join("198.51.100.66", f"guess{i}.x") == 403
            # The attacker is locked out, whatever it claims in the header it sends...
            assert await join("198.51.100.66", "guess9.x", spoof="192.0.2.1") == 429
            # ...and a joiner behind the same Ingress is not.
            assert await join("198.51.100.7", "good") == 200
            assert handlers.calls[-1].remote == "198.51.100.7"
    finally:
        await gw.stop()


async def test_without_a_trusted_ingress_a_forged_header_does_not_escape_the_limit(pki, upstream, dex, handlers):
    gw = Gateway(gateway_config(pki, upstream, dex, join_failures_per_minute=3), handlers)
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.join_port}/v1/join"
        async with aiohttp.ClientSession() as http:
            statuses = []
            for i in range(5):
                async with http.post(url, json={"token": f"guess{i}.x"},
                                     headers={"X-Forwarded-For": f"192.0.2.{i}"}) as r:
                    statuses.append(r.status)
        assert statuses == [403, 403, 403, 429, 429]
    finally:
        await gw.stop()


async def test_guesses_at_a_token_id_from_many_addresses_never_stall_the_string_s_holder(pki, upstream, dex,
                                                                                         handlers):
    """The token ID is no secret (viewers read status.invite.tokenID, an Event names it): ten wrong guesses at it
    from ten addresses lock the token ID for wrong secrets only; its holder, from an address of its own, passes
    at once and keeps passing while the guessing goes on."""
    cfg = gateway_config(pki, upstream, dex, join_failures_per_minute=10)
    cfg.trusted_proxies = ("127.0.0.1",)
    gw = Gateway(cfg, handlers)
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.join_port}/v1/join"
        async with aiohttp.ClientSession() as http:
            async def join(client: str, token: str) -> int:
                async with http.post(url, json={"token": token}, headers={"X-Forwarded-For": client}) as r:
                    return r.status

            assert [await join(f"198.51.100.{i}", f"target.junk{i}") for i in range(10)] == [403] * 10
            assert await join("198.51.100.50", "target.junk") == 429  # the limit holds for what is wrong
            assert await join("203.0.113.7", "target.good") == 200
            assert handlers.calls[-1].token_limited is True  # it was over the limit, and verified
            for i in range(10):
                assert await join(f"198.51.100.{100 + i}", f"target.junk{i}") == 429
                assert await join("203.0.113.7", "target.good") == 200
            assert await join("198.51.100.60", "other.junk") == 403  # another token ID is not limited
    finally:
        await gw.stop()
