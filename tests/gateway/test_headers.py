"""The header rules (gateway/headers.py) without a server: what is refused, what never passes, the upstream head."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import Refusal
from gateway.headers import bearer, check_request, forwarded_headers, request_head, response_fields, screen_request


def test_forwarded_headers_drop_identity_proxy_chain_and_hop_by_hop():
    raw = [(b"Accept", b"application/json"), (b"Authorization", b"Bearer peer"), (b"X-Forwarded-For", b"1.2.3.4"),
           (b"X-Forwarded-Proto", b"http"), (b"X-Remote-User", b"admin"), (b"X-Remote-Group", b"system:masters"),
           (b"Forwarded", b"for=1.2.3.4"), (b"Connection", b"keep-alive, X-Secret"), (b"X-Secret", b"s"),
           (b"Keep-Alive", b"5"), (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3"), (b"Host", b"evil"),
           (b"Impersonate-User", b"admin"), (b"Content-Type", b"application/json"), (b"X-Real-IP", b"1.1.1.1"),
           (b"Expect", b"100-continue")]
    assert forwarded_headers(raw) == [(b"Accept", b"application/json"), (b"Content-Type", b"application/json")]


def test_request_head_is_exact_http11():
    head = request_head(b"POST", b"/api/v1/namespaces?x=1", b"api.x.lab", [(b"Accept", b"*/*")], b"Bearer t", 3,
                        False)
    assert head == (b"POST /api/v1/namespaces?x=1 HTTP/1.1\r\nHost: api.x.lab\r\nAccept: */*\r\n"
                    b"Authorization: Bearer t\r\nContent-Length: 3\r\n\r\n")
    assert b"Transfer-Encoding: chunked\r\n" in request_head(b"POST", b"/", b"h", [], b"B", None, True)


@pytest.mark.parametrize("name,value,reason", [
    (b"Impersonate-User", b"x", "ImpersonationRefused"), (b"impersonate-extra-foo", b"x", "ImpersonationRefused"),
    (b"Upgrade", b"websocket", "UpgradeRefused"), (b"Connection", b"keep-alive, Upgrade", "UpgradeRefused")])
def test_check_request_refuses(name, value, reason):
    with pytest.raises(Refusal) as err:
        check_request([(b"Accept", b"*/*"), (name, value)])
    assert err.value.reason == reason


def test_response_headers_drop_hop_by_hop_and_connection_named():
    assert response_fields([(b"Content-Type", b"application/json"), (b"Connection", b"close, X-Hop"),
                            (b"X-Hop", b"1"), (b"Transfer-Encoding", b"chunked"), (b"Audit-Id", b"a")]) == [
        (b"Content-Type", b"application/json"), (b"Audit-Id", b"a")]


def test_bearer_parsing():
    assert bearer("Bearer abc", 10) == "abc"
    for value, reason in [(None, "TokenMissing"), ("Basic abc", "TokenMissing"), ("Bearer ", "TokenMissing"),
                          ("Bearer " + "x" * 11, "TokenTooLarge")]:
        with pytest.raises(Refusal) as err:
            bearer(value, 10)
        assert err.value.reason == reason


_NAMES = st.sampled_from([b"Accept", b"Authorization", b"authorization", b"Connection", b"X-Hop", b"x-hop",
                          b"Impersonate-User", b"Upgrade", b"X-Forwarded-For", b"X-Remote-Group", b"Forwarded",
                          b"Cookie", b"Host", b"Keep-Alive", b"TE", b"Content-Type", b"User-Agent", b"Expect"])
_VALUES = st.sampled_from([b"a", b"close", b"keep-alive, X-Hop", b"Upgrade", b"x-hop, close", b"Bearer t1",
                           b"Bearer t2", b"upgrade, keep-alive", b""])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_the_raw_paths_one_pass_applies_exactly_the_header_rules(fields):
    try:
        check_request(fields)
    except Refusal as expected:
        with pytest.raises(Refusal) as got:
            screen_request(fields)
        assert (got.value.code, got.value.reason, got.value.message) == (expected.code, expected.reason,
                                                                         expected.message)
        return
    forward, authorization, close = screen_request(fields)
    assert forward == forwarded_headers(fields)
    assert authorization == next((v for n, v in fields if n.lower() == b"authorization"), None)
    assert close == any(n.lower() == b"connection" and b"close" in [t.strip().lower() for t in v.split(b",")]
                        for n, v in fields)
