"""Real TLS fixtures for the gateway: a peering CA, a peer with its client cert and token issuer, a small
kube-apiserver stand-in (echo, chunked watch stream, TokenReview) and a small Dex stand-in (RFC 8693)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import ssl
import time
import uuid
from dataclasses import dataclass, field

import aiohttp
import pytest
import trustme
from aiohttp import web
from jwcrypto import jwk, jwt

from gateway.config import GatewayConfig, Limits
from gateway.protocol import JoinCall, PeerCall
from contract.errors import Refusal
from gateway.registry import Registry
from gateway.resolve import OverrideResolver
from gateway.server import Gateway

CLUSTER = "11111111-1111-1111-1111-111111111111"
PEER_UUID = "22222222-2222-2222-2222-222222222222"
ISSUER = "https://issuer.peer.lab"
ENTRANCE_HOST = "peering-gateway.x.lab"
REVIEW_LEEWAY = 60.0


async def close_stream(writer: asyncio.StreamWriter) -> None:
    """Close a client's stream; a TLS or connection error on the way out is the other end's business."""
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, ssl.SSLError):
        pass


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class Upstream:
    """What the API server stand-in saw and how it behaves."""

    requests: list[dict] = field(default_factory=list)
    watch_interval: float = 0.05
    watch_events: int = 5
    watch_started: asyncio.Event = field(default_factory=asyncio.Event)
    watch_closed: asyncio.Event = field(default_factory=asyncio.Event)
    reviews: int = 0
    port: int = 0
    #: Requests still to fail by closing the connection without an answer (a crashed API server).
    fail_next: int = 0
    #: A watch's connection is cut after its events instead of ending cleanly (an API server going away).
    watch_cut: bool = False


@dataclass
class DexState:
    calls: int = 0
    down: bool = False
    forms: list[dict] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    secret: str = "s3cret"
    gate: asyncio.Event | None = None
    port: int = 0
    #: An answer of upstream Dex to give instead of a token: (status, body), e.g. (500, {"error": "server_error"}).
    answer: tuple[int, dict] | None = None


class Handlers:
    """A control-loop stand-in recording the typed calls it gets."""

    def __init__(self) -> None:
        self.calls: list[PeerCall | JoinCall] = []

    async def peer_call(self, call: PeerCall) -> dict:
        self.calls.append(call)
        if call.op == "notify" and call.body and call.body.get("refuse"):
            raise Refusal(409, "OfferStale", "the offer changed meanwhile")
        return {"op": call.op, "peer": call.peer.name}

    async def join(self, call: JoinCall) -> dict:
        self.calls.append(call)
        token = str(call.body.get("token"))
        verifies = token == "good" or token.partition(".")[2] == "good"  # "good", or "<token ID>.good"
        if call.token_limited and not verifies:
            raise Refusal(429, "TooManyAttempts", "too many refused join attempts for this token in a minute")
        if not verifies:
            raise Refusal(403, "InvalidToken", "the connection string is not valid")
        return {"joined": True}


@pytest.fixture(scope="session")
def pki():
    peering_ca = trustme.CA()
    other_ca = trustme.CA()
    api_ca = trustme.CA()
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "ca": peering_ca,
        "entrance": peering_ca.issue_cert(ENTRANCE_HOST),
        "egress": peering_ca.issue_cert("peering-gateway.d8-peering.svc"),
        "peer": peering_ca.issue_cert(f"{PEER_UUID}.peer"),
        "peer2": peering_ca.issue_cert(f"peer2.peer"),
        "expired": peering_ca.issue_cert("expired.peer", not_before=now - datetime.timedelta(days=2),
                                         not_after=now - datetime.timedelta(days=1)),
        "foreign": other_ca.issue_cert(f"{PEER_UUID}.peer"),
        "api_ca": api_ca,
        "api": api_ca.issue_cert("api.x.lab", "dex.x.lab"),
    }


@pytest.fixture(scope="session")
def issuer_key():
    return jwk.JWK.generate(kty="EC", crv="P-256", kid="peer-key-1")


def make_token(key: jwk.JWK, *, sub: str = "system:serviceaccount:mod:controller",
               aud: list[str] | str | None = None, iss: str = ISSUER, exp_in: float = 600, nbf_in: float = -5,
               alg: str = "ES256", kid: str | None = None, extra: dict | None = None) -> str:
    now = time.time()
    claims = {"iss": iss, "sub": sub, "aud": aud if aud is not None else [f"peering.deckhouse.io/{CLUSTER}/read-pods"],
              "exp": int(now + exp_in), "nbf": int(now + nbf_in), "iat": int(now), "jti": uuid.uuid4().hex,
              **(extra or {})}
    token = jwt.JWT(header={"alg": alg, "kid": kid or key.get("kid")}, claims=claims)
    token.make_signed_token(key)
    return token.serialize()


def registry_for(pki, issuer_key, *, generation: int = 1, peers: tuple[str, ...] = ("peer",),
                 effective: tuple[str, ...] = ("read-pods",), entrance: str | None = None) -> Registry:
    cps, secrets = [], []
    for name in peers:
        cps.append({"metadata": {"name": name}, "status": {
            "effectiveCapabilities": list(effective),
            "peer": {"clusterUUID": PEER_UUID, "issuer": {"url": ISSUER,
                                                          "jwks": json.dumps({"keys": [issuer_key.export_public(
                                                              as_dict=True)]})}}}})
        data = {"issued.crt": b64(pki[name].cert_chain_pems[0].bytes()),
                "peer-ca.crt": b64(pki["ca"].cert_pem.bytes()),
                "client.crt": b64(pki[name].cert_chain_pems[0].bytes()),
                "client.key": b64(pki[name].private_key_pem.bytes())}
        if entrance:
            data["peer-entrance"] = b64(entrance.encode())
        secrets.append({"metadata": {"name": f"peer-{name}"}, "data": data})
    caps = [{"metadata": {"name": "read-pods"},
             "spec": {"version": "v1", "consumers": [{"namespace": "mod", "name": "controller"}]},
             "status": {"conditions": [{"type": "Accepted", "status": "True"}]}}]
    return Registry.from_objects(cluster_uuid=CLUSTER, clusterpeers=cps, peer_secrets=secrets, capabilities=caps,
                                 generation=generation)


async def _tls_site(app: web.Application, cert: trustme.LeafCert) -> tuple[web.AppRunner, int]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    return runner, runner.addresses[0][1]


def api_app(state: Upstream) -> web.Application:
    async def any_path(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        state.requests.append({"method": request.method, "path": request.path_qs,
                               "headers": list(request.headers.items()), "body": body})
        if state.fail_next > 0:
            state.fail_next -= 1
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if request.query.get("watch") in ("true", "1"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            state.watch_started.set()
            try:
                for i in range(state.watch_events):
                    event = {"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1",
                                                         "metadata": {"name": f"pod-{i}", "namespace": "default",
                                                                      "resourceVersion": str(i + 1)}}}
                    await resp.write(json.dumps(event).encode() + b"\n")
                    await asyncio.sleep(state.watch_interval)
                if state.watch_cut:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                await resp.write_eof()
            finally:
                state.watch_closed.set()
            return resp
        if request.path.endswith("/big"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(16):
                await resp.write(b"x" * 65536)
            await resp.write_eof()
            return resp
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                  "items": [], "seen": {"auth": request.headers.get("Authorization"),
                                                        "length": len(body)}})

    async def tokenreview(request: web.Request) -> web.Response:
        state.reviews += 1
        review = await request.json()
        token = review["spec"]["token"]
        if request.headers.get("Authorization") != "Bearer gateway-sa-token":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        try:
            claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        except (ValueError, IndexError):
            claims = {}
        # kube-apiserver authenticates its own tokens until a minute past their exp (go-jose's default leeway, as
        # lab/apiserver/auth/tokens.py has it): the egress must not take that for a grant.
        if claims.get("iss") != ISSUER or claims.get("exp", 0) + REVIEW_LEEWAY < time.time():
            return web.json_response({**review, "status": {"authenticated": False}}, status=201)
        aud = claims.get("aud") or []
        return web.json_response({**review, "status": {
            "authenticated": True, "user": {"username": claims["sub"]},
            "audiences": [a for a in review["spec"]["audiences"] if a in aud]}}, status=201)

    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", tokenreview)
    app.router.add_route("*", "/{tail:.*}", any_path)
    return app


def dex_app(state: DexState) -> web.Application:
    async def token(request: web.Request) -> web.Response:
        if state.down:  # what an ingress answers with Dex's pods gone
            return web.Response(status=503, text="no healthy upstream")
        state.calls += 1
        form = dict(await request.post())
        state.forms.append(form)
        state.auth.append(request.headers.get("Authorization", ""))
        if state.gate is not None:
            async with asyncio.timeout(20):
                await state.gate.wait()
        if request.headers.get("Authorization") != "Basic " + base64.b64encode(f"gateway:{state.secret}".encode()).decode():
            return web.json_response({"error": "invalid_client", "error_description": "Invalid client credentials."},
                                     status=401)
        if state.answer is not None:
            return web.json_response(state.answer[1], status=state.answer[0])
        return web.json_response({"access_token": f"exchanged-{state.calls}", "token_type": "bearer",
                                  "issued_token_type": form.get("requested_token_type"), "expires_in": 300})

    app = web.Application()
    app.router.add_post("/token", token)
    return app


@pytest.fixture
async def upstream(pki):
    state = Upstream()
    runner, state.port = await _tls_site(api_app(state), pki["api"])
    yield state
    await runner.cleanup()


@pytest.fixture
async def dex(pki):
    state = DexState()
    runner, state.port = await _tls_site(dex_app(state), pki["api"])
    yield state
    await runner.cleanup()


def gateway_config(pki, upstream: Upstream, dex: DexState, **limits) -> GatewayConfig:
    return GatewayConfig(
        public_domain_template="%s.x.lab", api_server="https://api.x.lab", api_ca_pem=pki["api_ca"].cert_pem.bytes(),
        api_token=lambda: "gateway-sa-token", dex_url="https://dex.x.lab", dex_ca_pem=pki["api_ca"].cert_pem.bytes(),
        dex_client_id="gateway", dex_client_secret=lambda: "s3cret",
        resolve={"api.x.lab": f"127.0.0.1:{upstream.port}", "dex.x.lab": f"127.0.0.1:{dex.port}"},
        limits=Limits(**limits), access_log=False)


def load_certs(gw: Gateway, pki) -> None:
    gw.reload_certificates(entrance_cert_pem=pki["entrance"].cert_chain_pems[0].bytes(),
                           entrance_key_pem=pki["entrance"].private_key_pem.bytes(),
                           ca_pem=pki["ca"].cert_pem.bytes(),
                           egress_cert_pem=pki["egress"].cert_chain_pems[0].bytes(),
                           egress_key_pem=pki["egress"].private_key_pem.bytes())


@pytest.fixture
async def handlers():
    return Handlers()


@contextlib.asynccontextmanager
async def started_gateway(pki, issuer_key, upstream, dex, handlers, **limits):
    """A Gateway in this process with `limits`, its certificates and registry loaded."""
    gw = Gateway(gateway_config(pki, upstream, dex, **limits), handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key))
        yield gw
    finally:
        await gw.stop()


@pytest.fixture
async def gateway(pki, issuer_key, upstream, dex, handlers):
    async with started_gateway(pki, issuer_key, upstream, dex, handlers) as gw:
        yield gw


@contextlib.asynccontextmanager
async def started_pool(pki, issuer_key, upstream, dex, handlers, *, workers: int = 2, **limits):
    """A Gateway with `workers` worker processes, its certificates and registry loaded, once every worker is ready."""
    cfg = gateway_config(pki, upstream, dex, **limits)
    cfg.workers = workers
    gw = Gateway(cfg, handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key))
        async with asyncio.timeout(10):
            while gw.readiness() != (True, "ok"):
                await asyncio.sleep(0.01)
        yield gw
    finally:
        await gw.stop()


def client_ssl(pki, cert: str | None = "peer") -> ssl.SSLContext:
    """A client trusting the test CA only (not the system's store too), as a peer's client trusts one CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    pki["ca"].configure_trust(ctx)
    if cert is not None:
        pki[cert].configure_cert(ctx)
    return ctx


@pytest.fixture
async def session_for(pki):
    """Factory of client sessions reaching the entrance by its real name with a given client certificate."""
    sessions: list[aiohttp.ClientSession] = []

    def make(gw: Gateway, cert: str | None = "peer", *, port: int | None = None, **kwargs) -> aiohttp.ClientSession:
        resolver = OverrideResolver({ENTRANCE_HOST: f"127.0.0.1:{port or gw.entrance_port}",
                                     "peering-gateway.d8-peering.svc": f"127.0.0.1:{gw.egress_port}"})
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki, cert), resolver=resolver,
                                                                       **kwargs))
        sessions.append(session)
        return session

    yield make
    for s in sessions:
        await s.close()


def access_lines(records: list, listener: str | None = None) -> list[dict]:
    """The gateway.access lines among log `records` (caplog.records), of `listener` or all, as parsed JSON."""
    lines = [json.loads(r.getMessage()) for r in records if r.name == "gateway.access"]
    return [line for line in lines if listener is None or line["listener"] == listener]


def request_counts(gw: Gateway, listener: str) -> dict[tuple[str, str, str, str], float]:
    """peering_gateway_requests_total of `listener` on `gw`: (peer, capability, code, outcome) -> count."""
    return {(s.labels["peer"], s.labels["capability"], s.labels["code"], s.labels["outcome"]): s.value
            for family in gw.metrics.requests.collect() for s in family.samples
            if s.name.endswith("_total") and s.labels["listener"] == listener}
