"""The refusal table of gateway/README.md, row by row: each cause is driven, over real TLS through real gateways, on
every listener its row says can meet it (the entrance and the egress), and each answer must be the row's: the same
code and reason on every listener (`contract.reasons.CODES`),
repeated in details.causes, with one access log line (`outcome` refused, the reason) and the matching count of
peering_gateway_requests_total. The join listener's refusals are the join's (test_server, test_join_limit_keys)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import pathlib
import re
import ssl
from typing import Awaitable, Callable

import aiohttp
import pytest
import trustme
from jwcrypto import jwk

from contract import reasons
from gateway.server import Gateway
from tests.gateway.support import (CLUSTER, ENTRANCE_HOST, Handlers, access_lines, client_ssl, close_stream,
                                   gateway_config, load_certs, make_token, registry_for, request_counts)
from tests.gateway.test_egress import EGRESS, _egress_gateway
from tests.ports import closed_port

README = pathlib.Path(__file__).resolve().parents[2] / "gateway" / "README.md"
EGRESS_HOST = "peering-gateway.d8-peering.svc"
PODS = "/api/v1/namespaces/default/pods"
AUDIENCE = f"peering.deckhouse.io/{CLUSTER}/read-pods"


def readme_table() -> dict[str, tuple[int, frozenset[str]]]:
    """reason -> (code, the listeners of its `on` column), from the refusal table of gateway/README.md."""
    text = README.read_text()
    table = text[text.index("## Refusals"):text.index("## Threats")]
    rows: dict[str, tuple[int, frozenset[str]]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        on = frozenset(c.strip() for c in cells[2].split(","))
        for reason in (r.strip() for r in cells[1].split(",")):
            assert reason not in rows, f"{reason} is in two rows of the refusal table"
            rows[reason] = (int(cells[0]), on)
    return rows


# ----- the rig: a peer's entrance, and this cluster's egress in front of it ------------------------------------
@dataclasses.dataclass
class Rig:
    entrance: Gateway
    egress: Gateway
    upstream: object
    dex: object
    pki: dict
    issuer_key: object
    entrance_http: aiohttp.ClientSession
    egress_http: aiohttp.ClientSession

    def token(self, **claims) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(self.issuer_key, **claims)}"}

    async def connect(self, listener: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TLS connection to `listener` as its clients make one (a peer's certificate on the entrance)."""
        if listener == "entrance":
            port, name, cert = self.entrance.entrance_port, ENTRANCE_HOST, "peer"
        else:
            port, name, cert = self.egress.egress_port, EGRESS_HOST, None
        return await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl(self.pki, cert), server_hostname=name)

    async def raw(self, listener: str, data: bytes) -> tuple[int, dict]:
        """Send `data` as it is to `listener` and read the one answer (a Status) that comes back."""
        reader, writer = await self.connect(listener)
        try:
            writer.write(data)
            await writer.drain()
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
                return int(head.split(b" ", 2)[1]), json.loads(await reader.readexactly(length))
        finally:
            await close_stream(writer)

    def republish(self, gw: Gateway, **peer_fields) -> None:
        """`gw`'s registry again, its peer changed by `peer_fields`."""
        reg = gw.state.registry
        peer = dataclasses.replace(reg.peers["peer"], **peer_fields)
        gw.publish(dataclasses.replace(reg, generation=reg.generation + 1, peers={"peer": peer},
                                       by_fingerprint={fp: peer for fp in peer.fingerprints}))


async def _answer(resp: aiohttp.ClientResponse) -> tuple[int, dict]:
    return resp.status, await resp.json(content_type=None)


Drive = Callable[[Rig], Awaitable[tuple[int, dict]]]


def get(path: str = PODS, method: str = "GET", **headers) -> Callable[..., Drive]:
    """A driver that sends one request with a good token (unless `headers` say otherwise) on `listener`."""
    def make(listener: str) -> Drive:
        async def drive(rig: Rig) -> tuple[int, dict]:
            sent = {**rig.token(), **headers}
            sent = {k: v for k, v in sent.items() if v is not None}
            if listener == "entrance":
                url = f"https://{ENTRANCE_HOST}{path}"
                http = rig.entrance_http
            else:
                url = f"{EGRESS}/peers/peer{path}" if path.startswith(("/api", "/logs")) else EGRESS + path
                http = rig.egress_http
            async with http.request(method, url, headers=sent) as resp:
                return await _answer(resp)
        return drive
    return make


def token(**claims) -> Callable[..., Drive]:
    """A request with a token of these claims (make_token's keywords)."""
    def make(listener: str) -> Drive:
        async def drive(rig: Rig) -> tuple[int, dict]:
            return await get(Authorization=rig.token(**claims)["Authorization"])(listener)(rig)
        return drive
    return make


def raw(data: bytes) -> Callable[..., Drive]:
    def make(listener: str) -> Drive:
        async def drive(rig: Rig) -> tuple[int, dict]:
            return await rig.raw(listener, data)
        return drive
    return make


def then(prepare: Callable[[Rig], None], request: Callable[..., Drive]) -> Callable[..., Drive]:
    """`request` after `prepare(rig)` set the cause up (a stand-in failing, a registry changed)."""
    def make(listener: str) -> Drive:
        async def drive(rig: Rig) -> tuple[int, dict]:
            prepare(rig)
            return await request(listener)(rig)
        return drive
    return make


def _resolve(gw: Gateway, host: str, port: int) -> None:
    gw.state.resolver._overrides[host] = ("127.0.0.1", port)


def rate_limited(listener: str) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        first = await get()(listener)(rig)  # the burst's one exchange
        assert first[0] == 200, first
        return await get()(listener)(rig)   # a second new token: beyond the bound
    return drive


def peer_calls_limited(listener: str) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        first = await get("/peering/v1/offer")(listener)(rig)  # the burst's one call
        assert first[0] == 200, first
        return await get("/peering/v1/offer")(listener)(rig)  # a second at once: beyond the bound
    return drive


def dated_certificate(days: int) -> Callable[..., Drive]:
    """A request with a live peering's client certificate outside its dates, expired (`days` < 0) or valid only
    from `days` on: past the handshake, refused by admission."""
    start = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days)
    return lambda listener: _dated(listener, start)


def _dated(listener: str, start: datetime.datetime) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        leaf = rig.pki["ca"].issue_cert("peer.dated", not_before=start, not_after=start + datetime.timedelta(days=1))
        dated = {**rig.pki, "peer": leaf}
        rig.entrance.publish(registry_for(dated, rig.issuer_key, generation=5))
        head = (f"GET {PODS} HTTP/1.1\r\nHost: x\r\n{rig.token()['Authorization'].join(('Authorization: ', ''))}"
                "\r\n\r\n").encode()
        return await dataclasses.replace(rig, pki=dated).raw(listener, head)
    return drive


def foreign_certificate(rig: Rig) -> None:
    """Our egress presents a client certificate of another CA: the peer's entrance refuses it at the handshake."""
    leaf = trustme.CA().issue_cert("peer.foreign")
    rig.republish(rig.egress, client_cert_pem=leaf.cert_chain_pems[0].bytes(),
                  client_key_pem=leaf.private_key_pem.bytes())


def withdrawn_while_exchanging(listener: str) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        rig.dex.gate = asyncio.Event()
        answer = asyncio.ensure_future(get()(listener)(rig))
        try:
            async with asyncio.timeout(5):
                while rig.dex.calls == 0:
                    await asyncio.sleep(0.01)
            rig.republish(rig.entrance, effective=frozenset())  # the capability closed meanwhile
        finally:
            rig.dex.gate.set()
        return await answer
    return drive


def timed_out(listener: str) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        # On the entrance a peer call is served first, then a head never completes; on the egress, only that head.
        prefix = b"POST /peering/v1/notify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" \
            if listener == "entrance" else b""
        reader, writer = await rig.connect(listener)
        try:
            async with asyncio.timeout(10):
                if prefix:
                    writer.write(prefix)
                    head = await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1)))
                writer.write(b"GET /api HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                await writer.drain()
                answer = await reader.read()  # to the end: 408, and the connection closes
        finally:
            await close_stream(writer)
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), json.loads(body)
    return drive


async def _hang_up_server(pki) -> tuple[asyncio.AbstractServer, int]:
    """A peer's entrance that takes the TLS connection and the request, then closes without an answer."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pki["entrance"].configure_cert(ctx)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


def hung_up(listener: str) -> Drive:
    async def drive(rig: Rig) -> tuple[int, dict]:
        server, port = await _hang_up_server(rig.pki)
        try:
            _resolve(rig.egress, ENTRANCE_HOST, port)
            return await get()(listener)(rig)
        finally:
            server.close()
            await server.wait_closed()
    return drive


def broken_inside(listener: str) -> Drive:
    """A fault inside the gateway: the control loop's handler fails (entrance), the egress's pool fails
    (injected, as a bug would)."""
    async def drive(rig: Rig) -> tuple[int, dict]:
        if listener == "entrance":
            return await raw(b"POST /peering/v1/notify HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n"
                             b'{"fail": true}')(listener)(rig)

        def broken(peer):
            raise RuntimeError("a fault injected into the egress")
        rig.egress.state.peer_pool = broken  # type: ignore[method-assign]
        return await get()(listener)(rig)
    return drive


class FailingHandlers(Handlers):
    async def peer_call(self, call):
        if call.body and call.body.get("fail"):
            raise RuntimeError("a fault injected into the control loop's handler")
        return await super().peer_call(call)


OVERSIZED_HEAD = b"GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n"

# reason -> {listener: the driver}; `limits` below per reason.
CASES: dict[str, dict[str, Callable[..., Drive]]] = {
    reasons.TOKEN_MISSING: {"entrance": get(Authorization=None), "egress": get(Authorization=None)},
    reasons.TOKEN_TOO_LARGE: {"entrance": token(extra={"pad": "x" * 17000}),
                              "egress": token(extra={"pad": "x" * 17000})},
    # Within the minute kube-apiserver's TokenReview still authenticates it, and the old 30 s allowance.
    reasons.TOKEN_EXPIRED: {"entrance": token(exp_in=-20), "egress": token(exp_in=-20)},
    reasons.TOKEN_AUDIENCE_MISMATCH: {
        "entrance": token(aud=[f"peering.deckhouse.io/{CLUSTER}/write-secrets"]),
        "egress": token(aud=["peering.deckhouse.io/x/read-pods"])},
    reasons.TOKEN_MALFORMED: {"entrance": get(Authorization="Bearer not.a.jwt")},
    reasons.TOKEN_ALGORITHM_REFUSED: {"entrance": get(Authorization="Bearer e30.e30.eA")},
    reasons.TOKEN_KEY_UNKNOWN: {"entrance": token(kid="unknown-kid")},
    reasons.TOKEN_SIGNATURE_INVALID: {"entrance": get(Authorization="Bearer " + make_token(jwk.JWK.generate(
        kty="EC", crv="P-256", kid="peer-key-1")))},
    reasons.TOKEN_ISSUER_MISMATCH: {"entrance": token(iss="https://evil.example")},
    reasons.TOKEN_NOT_YET_VALID: {"entrance": token(nbf_in=600)},
    reasons.PEER_ISSUER_UNKNOWN: {"entrance": then(lambda rig: rig.republish(
        rig.entrance, issuer_url=None, jwks_json=None), get())},
    reasons.NOT_A_CONSUMER: {"entrance": token(sub="system:serviceaccount:mod:other"),
                             "egress": token(sub="system:serviceaccount:mod:other")},
    reasons.TOKEN_EXCHANGE_REFUSED: {"entrance": then(lambda rig: setattr(
        rig.dex, "answer", (401, {"error": "access_denied"})), get())},
    reasons.TOKEN_EXCHANGE_MISCONFIGURED: {"entrance": then(lambda rig: setattr(
        rig.dex, "secret", "rotated"), get())},
    reasons.TOKEN_INVALID: {"egress": token(iss="https://other.example")},
    reasons.TOKEN_REVIEW_UNAVAILABLE: {"egress": then(lambda rig: _resolve(rig.egress, "api.x.lab",
                                                                                 closed_port()), get())},
    reasons.NO_EFFECTIVE_CAPABILITY: {"entrance": withdrawn_while_exchanging,
                                      "egress": then(lambda rig: rig.republish(
                                          rig.egress, effective=frozenset()), get())},
    reasons.PEER_UNKNOWN: {"entrance": then(lambda rig: rig.entrance.publish(registry_for(
        rig.pki, rig.issuer_key, generation=5, peers=("peer2",))), get())},
    reasons.IMPERSONATION_REFUSED: {"entrance": get(**{"Impersonate-User": "admin"}),
                                    "egress": get(**{"Impersonate-User": "admin"})},
    reasons.UPGRADE_REFUSED: {"entrance": get(Connection="Upgrade", Upgrade="SPDY/3.1"),
                              "egress": get(Connection="Upgrade", Upgrade="SPDY/3.1")},
    reasons.AMBIGUOUS_BODY_LENGTH: {
        "entrance": raw(b"POST /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                       b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        "egress": raw(b"POST /peers/peer/api/v1/namespaces HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")},
    reasons.MALFORMED_REQUEST: {"entrance": raw(b"GET /api HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n"),
                                "egress": raw(b"GET /peers/peer/api HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n")},
    reasons.MALFORMED_BODY: {"entrance": raw(
        b"POST /peering/v1/notify HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nnot json")},
    reasons.NOT_FOUND: {"egress": get("/v1/pods")},
    reasons.PEER_NOT_FOUND: {"egress": get("/peers/nobody/api")},
    reasons.UNKNOWN_OPERATION: {"entrance": get("/peering/v1/nothing")},
    reasons.METHOD_NOT_ALLOWED: {"entrance": get(method="TRACE"),
                                 "egress": get(method="TRACE")},
    reasons.PATH_NOT_ALLOWED: {"egress": get("/logs/kube-apiserver.log")},
    reasons.TOKEN_AUDIENCE_TOO_BROAD: {"egress": token(aud=[AUDIENCE, "https://kubernetes.default.svc"])},
    reasons.REQUEST_TIMEOUT: {"entrance": timed_out, "egress": timed_out},
    reasons.REQUEST_ENTITY_TOO_LARGE: {
        "entrance": raw(b"PUT /api/v1/namespaces/default/configmaps/x HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Length: 2000\r\n\r\n"),
        "egress": raw(b"PUT /peers/peer/api/v1/namespaces/default/configmaps/x HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: 2000\r\n\r\n")},
    reasons.TOKEN_EXCHANGE_RATE_LIMITED: {"entrance": rate_limited},
    reasons.PEER_CALLS_RATE_LIMITED: {"entrance": peer_calls_limited},
    reasons.REQUEST_HEADER_FIELDS_TOO_LARGE: {"entrance": raw(OVERSIZED_HEAD),
                                              "egress": raw(OVERSIZED_HEAD)},
    reasons.UPSTREAM_FAILED: {"entrance": then(lambda rig: setattr(rig.upstream, "fail_next", 5), get()),
                              "egress": hung_up},
    reasons.UPSTREAM_UNAVAILABLE: {
        "entrance": then(lambda rig: _resolve(rig.entrance, "api.x.lab", closed_port()), get()),
        "egress": then(lambda rig: _resolve(rig.egress, ENTRANCE_HOST, closed_port()), get())},
    reasons.TOKEN_EXCHANGE_UNAVAILABLE: {"entrance": then(lambda rig: setattr(rig.dex, "down", True), get())},
    reasons.PEER_NOT_CONNECTED: {"egress": then(lambda rig: rig.republish(rig.egress, entrance=None), get())},
    reasons.PEER_CREDENTIALS_INVALID: {"egress": then(lambda rig: rig.republish(
        rig.egress, client_key_pem=b"not a key"), get())},
    reasons.PEER_REFUSED_CERTIFICATE: {"egress": then(foreign_certificate, get())},
    reasons.CERTIFICATE_EXPIRED: {"entrance": dated_certificate(-2)},
    reasons.CERTIFICATE_NOT_YET_VALID: {"entrance": dated_certificate(1)},
    reasons.INTERNAL_ERROR: {"entrance": broken_inside, "egress": broken_inside},
}
LIMITS = {reasons.REQUEST_TIMEOUT: {"request_head_timeout": 0.3},
          reasons.REQUEST_ENTITY_TOO_LARGE: {"max_body_bytes": 1000},
          reasons.TOKEN_EXCHANGE_RATE_LIMITED: {"exchanges_per_peer_per_second": 0.001, "exchange_burst_per_peer": 1},
          reasons.PEER_CALLS_RATE_LIMITED: {"peer_calls_per_second": 0.001, "peer_call_burst": 1}}

PARAMS = [pytest.param(reason, listener, id=f"{reason}-{listener}") for reason, on in CASES.items() for listener in on]


def test_every_row_of_the_table_is_driven_on_every_listener_it_names():
    table = readme_table()
    assert set(table) >= set(CASES), sorted(set(CASES) - set(table))
    for reason, (code, on) in table.items():
        assert reasons.CODES[reason] == code, f"{reason}: {code} in the README, {reasons.CODES[reason]} in the contract"
        driven = set(CASES.get(reason, {}))
        assert driven == on - {"join"}, f"{reason}: the table says {sorted(on)}, the test drives {sorted(driven)}"


@pytest.fixture
async def rig_for(pki, issuer_key, upstream, dex, session_for):
    made: list[Gateway] = []

    async def make(limits: dict) -> Rig:
        entrance = Gateway(gateway_config(pki, upstream, dex, registry_catch_up=0.0, **limits), FailingHandlers())
        await entrance.start()
        made.append(entrance)
        load_certs(entrance, pki)
        entrance.publish(registry_for(pki, issuer_key))
        egress = await _egress_gateway(pki, issuer_key, upstream, dex, Handlers(), entrance, registry_catch_up=0.0,
                                       **limits)
        made.append(egress)
        for gw in (entrance, egress):
            gw.config.access_log = True
        return Rig(entrance, egress, upstream, dex, pki, issuer_key, session_for(entrance),
                   session_for(egress, None))

    yield make
    for gw in made:
        await gw.stop()


@pytest.mark.parametrize("reason, listener", PARAMS)
async def test_each_refusal_is_the_tables_on_every_listener(rig_for, caplog, reason, listener):
    caplog.set_level(logging.INFO, logger="gateway.access")
    rig = await rig_for(LIMITS.get(reason, {}))
    make = CASES[reason][listener]
    status, body = await make(listener)(rig)
    code = reasons.CODES[reason]
    assert (status, body.get("kind"), body.get("code"), body.get("reason")) == (code, "Status", code, reason), body
    assert body["details"]["causes"][0]["reason"] == reason and body["message"]
    gw = rig.entrance if listener == "entrance" else rig.egress
    async with asyncio.timeout(5):  # a refusal is accounted as it is answered; a timed-out head as it is cut
        while not any(line.get("reason") == reason for line in access_lines(caplog.records, listener)):
            await asyncio.sleep(0.01)
    outcome = "error" if reason == reasons.INTERNAL_ERROR else "refused"
    refused = [line for line in access_lines(caplog.records, listener) if line["outcome"] == outcome]
    assert len(refused) == 1, refused
    [line] = refused
    assert (line["code"], line["reason"]) == (code, reason)
    counts = request_counts(gw, listener)
    assert counts[(line["peer"], line["capabilities"], f"{code // 100}xx", outcome)] == 1.0, counts
    assert sum(n for (_, _, _, o), n in counts.items() if o == outcome) == 1.0, counts
    # What the gateway refused itself never reached the API server (but the one request a case let through).
    if reason not in (reasons.UPSTREAM_FAILED, reasons.TOKEN_EXCHANGE_RATE_LIMITED):
        assert rig.upstream.requests == []
