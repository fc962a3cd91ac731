"""Who is asking at the join listener (gateway/joinlimit.py `client_address`, `trusted_networks`), under arbitrary
X-Forwarded-For and X-Real-IP: the answer is an address in canonical form (or the socket's own text), never an
exception; a client that is not a trusted proxy is its socket's address whatever it sends; behind a trusted proxy
the hop the proxy appended wins over anything the client wrote before it; the trusted proxies are networks or a
ValueError naming the entry."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from gateway.joinlimit import client_address, trusted_networks

from tests.fuzz.strategies import FUZZ

TRUSTED = trusted_networks(["10.111.0.0/16", "fd00:10::/64"])
_v4 = st.ip_addresses(v=4).map(str)
_v6 = st.ip_addresses(v=6).map(str)
_proxies = st.sampled_from(["10.111.0.7", "10.111.255.255", "fd00:10::1", "fd00:10::ffff"])
_outside = st.sampled_from(["203.0.113.9", "2001:db8::9", "10.112.0.1", "fd00:11::1"]) | _v4 | _v6
_hops = (_v4 | _v6 | _proxies | _outside
         | st.builds(lambda ip, port: f"{ip}:{port}", _v4, st.integers(0, 70000))
         | st.builds(lambda ip, port: f"[{ip}]:{port}", _v6, st.integers(0, 70000))
         | st.sampled_from(["", " ", "unknown", "_hidden", "[::1", "::1]", "1.2.3.4:", "fe80::1%eth0", "[fe80::1%2]:80",
                            "::ffff:10.111.0.7", "010.111.0.7", "1.2.3.4/24", "\x00", "1.2.3.4\r\nX: y"])
         | st.text(max_size=30))
_headers = st.none() | st.lists(_hops, max_size=6).map(", ".join) | st.lists(_hops, max_size=6).map(",".join) | st.text(
    max_size=60)
_peers = st.none() | _proxies | _outside | st.sampled_from(["", "-", "unix", "::1", "127.0.0.1"]) | st.text(max_size=20)


def _canonical(answer: str) -> bool:
    try:
        return str(ipaddress.ip_address(answer)) == answer
    except ValueError:
        return False


@FUZZ
@given(_peers, _headers, _headers)
def test_the_client_is_an_address_the_socket_or_a_header_names(peer, forwarded_for, real_ip):
    answer = client_address(peer, forwarded_for, real_ip, TRUSTED)
    assert isinstance(answer, str) and answer
    if not _canonical(answer):
        assert answer == (peer or "-")  # a socket address that is none (a unix socket): its own text
        return
    named = {str(ip) for text in (peer, forwarded_for, real_ip) if text for hop in text.split(",")
             if (ip := _parse(hop)) is not None}
    assert answer in named


def _parse(hop: str):
    hop = hop.strip()
    for text in (hop, hop.partition(":")[0], hop[1:hop.find("]")] if hop.startswith("[") else hop):
        try:
            return ipaddress.ip_address(text)
        except ValueError:
            continue
    return None


@FUZZ
@given(_outside, _headers, _headers)
def test_a_client_that_is_no_trusted_proxy_is_its_socket_whatever_it_sends(peer, forwarded_for, real_ip):
    assert client_address(peer, forwarded_for, real_ip, TRUSTED) == str(ipaddress.ip_address(peer))
    # Without trusted proxies, no header is believed from anyone.
    assert client_address(peer, forwarded_for, real_ip, ()) == str(ipaddress.ip_address(peer))


@FUZZ
@given(_proxies, st.lists(_hops, max_size=5), _outside, _headers, st.sampled_from([", ", ",", " , "]))
def test_behind_a_trusted_proxy_the_hop_it_appended_wins(proxy, written, client, real_ip, comma):
    """The Ingress appends the address it saw to whatever X-Forwarded-For the client sent: that last hop is the
    answer, whatever the client wrote before it or in X-Real-IP."""
    forwarded_for = comma.join([*written, client])
    assert client_address(proxy, forwarded_for, real_ip, TRUSTED) == str(ipaddress.ip_address(client))
    # A chain of trusted proxies: the nearest hop that is none of them.
    chained = comma.join([*written, client, "10.111.3.4", "fd00:10::7"])
    assert client_address(proxy, chained, real_ip, TRUSTED) == str(ipaddress.ip_address(client))


@FUZZ
@given(st.lists(st.text(max_size=30) | _v4 | _v6 | st.builds("{}/{}".format, _v4 | _v6, st.integers(-1, 200)), max_size=5))
def test_trusted_proxies_are_networks_or_a_value_error_naming_the_entry(proxies):
    try:
        networks = trusted_networks(proxies)
    except ValueError as err:
        bad = [p for p in proxies if not _network(p)]
        assert bad and repr(bad[0]) in str(err) and "CIDR" in str(err)
        return
    assert len(networks) == len(proxies)
    for proxy, network in zip(proxies, networks):
        assert network == ipaddress.ip_network(proxy.strip(), strict=False)


def _network(text: str) -> bool:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return False
    return True
