"""The lab's Dex (lab/dex.py) answers the token endpoint, discovery and keys as upstream Dex v2.41.1 does: the
same requests to both, side by side on loopback over TLS, and their answers compared (dex_support.py says how).

Upstream Dex is the `dex` command built from its Go module (`python -m lab.real build`); without it the module
skips loudly (`UPSTREAM DEX NOT TESTED`), and fails when PEERING_REQUIRE_REAL_APISERVER=1. The differences kept on
purpose are lab/README.md's table "Where the lab's Dex differs from upstream on purpose"; each has a test here that
checks both sides are still as written there."""

from __future__ import annotations

import base64
import json
import time

import aiohttp
import pytest
import pytest_asyncio
from dex_support import (
    CLIENTS, CLUSTER_APP, CONNECTOR, CONTRACT_SCOPE, FORM, ID_TOKENS_VALID_FOR, ISSUER, KUBERNETES, MODULE_CLIENT,
    MODULE_SECRET, OUTSIDER, OUTSIDER_SECRET, PASSWORD_CONNECTOR, SA_SUB, TOKEN_TYPE_ACCESS, Pair, PeerIssuer,
    Request, Side, b64url, basic, exchange, raw_basic, upstream_config,
)
from jwcrypto import jwk, jwt

from lab import certs
from lab.dex import GRANT_TOKEN_EXCHANGE, TOKEN_TYPE_ID, Dex, opaque_subject
from lab.real.process import StartError
from lab.real.process import free_port as runner_free_port
from lab.real.upstream_dex import UpstreamDex
from lab.testing import upstream_dex_or_skip

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.real]


@pytest.fixture(scope="module")
def dex_binary():
    return upstream_dex_or_skip()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(dex_binary, tmp_path_factory):
    ca = certs.CA("dex differential CA")
    serving = ca.issue_server(["dex.t.lab"], ["127.0.0.1"])
    peer = PeerIssuer(ca)
    await peer.start()
    lab = Dex(ISSUER, certs.server_ssl_context(serving), id_tokens_valid_for=ID_TOKENS_VALID_FOR)
    for client_id, secret, peers in CLIENTS:
        lab.add_client(client_id, secret, list(peers))
    lab.set_connector(CONNECTOR, peer.url, peer.jwks(), "")
    d = tmp_path_factory.mktemp("upstream-dex")
    (d / "peer-ca.crt").write_bytes(ca.cert_pem)
    upstream = UpstreamDex(d, ISSUER, serving=serving, ca_pem=ca.cert_pem, binary=dex_binary,
                           config=upstream_config(peer, str(d / "peer-ca.crt")))
    await lab.start()
    try:
        await upstream.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                p = Pair(Side("lab", lab.port, ca.cert_pem, session), Side("upstream", upstream.port, ca.cert_pem,
                                                                           session), peer)
                for side in (p.lab, p.upstream):
                    keys = await side.send(Request(method="GET", path="/keys", auth=None))
                    assert keys.status == 200, (side.name, keys)
                    side.jwks = keys.body
                yield p
        finally:
            await upstream.stop()
    finally:
        await lab.stop()
        await peer.stop()


def contract(pair: Pair, **fields) -> Request:
    return exchange(pair.peer.token(), **fields)


# --- the token endpoint: requests both must answer alike -------------------------------------------------------

CASES = {
    # The module's own exchange, and the request before the contract was fixed.
    "contract": lambda p: contract(p),
    "old form: scope openid and a form audience": lambda p: contract(p, scope="openid", audience=KUBERNETES),
    "form audience never read": lambda p: contract(p, audience=OUTSIDER),
    # Method, grant, body.
    "GET": lambda p: Request(method="GET"),
    "PUT with the form": lambda p: Request(method="PUT", form=contract(p).form),
    "no body": lambda p: Request(),
    "grant password (no password connector)": lambda p: contract(p, grant_type="password"),
    "grant unknown": lambda p: contract(p, grant_type="urn:x"),
    "grant only in the query": lambda p: Request(form=contract(p, grant_type=None).form,
                                                 query=f"grant_type={GRANT_TOKEN_EXCHANGE}"),
    "no Content-Type": lambda p: Request(form=contract(p).form, content_type=None),
    "text/plain body": lambda p: Request(form=contract(p).form, content_type="text/plain"),
    "charset parameter": lambda p: Request(form=contract(p).form, content_type=FORM + "; charset=utf-8"),
    "quoted charset, trailing semicolon": lambda p: Request(form=contract(p).form,
                                                            content_type=FORM + '; charset="utf-8";'),
    "Content-Type upper case": lambda p: Request(form=contract(p).form, content_type=FORM.upper()),
    "Content-Type parameter without value": lambda p: Request(form=contract(p).form, content_type=FORM + "; charset"),
    "Content-Type duplicate parameter": lambda p: Request(form=contract(p).form,
                                                          content_type=FORM + "; a=1; a=2"),
    "Content-Type without a type": lambda p: Request(form=contract(p).form, content_type="; charset=utf-8"),
    "multipart body": lambda p: multipart(contract(p)),
    "body with a broken escape": lambda p: Request(body=contract(p).data() + b"&x=%zz"),
    "body with a semicolon": lambda p: Request(body=contract(p).data() + b";x=1"),
    "query with a broken escape": lambda p: Request(form=contract(p).form, query="x=%zz"),
    "empty fields and bare keys": lambda p: Request(body=b"&&flag&" + contract(p).data() + b"&="),
    "a body of 10 MiB": lambda p: padded(contract(p), 10 << 20),
    "a body one byte over 10 MiB": lambda p: padded(contract(p), (10 << 20) + 1),
    "a text/plain body over 10 MiB (not read)": lambda p: Request(
        body=padded(contract(p), (10 << 20) + 1).body, content_type="text/plain"),
    "10,000 fields": lambda p: Request(body=contract(p).data() + b"&x" * (10000 - len(contract(p).form))),
    "10,001 fields": lambda p: Request(body=contract(p).data() + b"&x" * (10001 - len(contract(p).form))),
    "a field given twice: the first counts": lambda p: contract(p, extra=(("subject_token", "junk"),)),
    "exchange fields from the query": lambda p: Request(form=contract(p, connector_id=None).form,
                                                        query=f"connector_id={CONNECTOR}"),
    "the body before the query": lambda p: Request(form=contract(p).form, query="connector_id=nobody"),
    # Client authentication.
    "form client_id and client_secret": lambda p: contract(
        p, auth=None, client_id=MODULE_CLIENT, client_secret=MODULE_SECRET),
    "form credentials only in the query": lambda p: Request(
        form=contract(p).form, auth=None,
        query=f"client_id={MODULE_CLIENT}&client_secret={MODULE_SECRET}".replace("+", "%2B").replace(" ", "+")),
    "Basic with the id unescaped": lambda p: with_auth(
        contract(p), raw_basic(f"{MODULE_CLIENT}:s3cret%2F%2B%3D+%25%3A%C3%A9")),
    "Basic with a raw + in the secret (a space once unescaped)": lambda p: with_auth(
        contract(p), raw_basic(f"{MODULE_CLIENT}:s3cret/+=%20%25%3A%C3%A9")),
    "Basic with a colon in the secret": lambda p: with_auth(
        contract(p, scope="openid"), raw_basic(f"{OUTSIDER}:{OUTSIDER_SECRET}")),
    "basic in lower case": lambda p: with_auth(contract(p), "basic " + basic(MODULE_CLIENT, MODULE_SECRET)[6:]),
    "Basic id badly escaped": lambda p: with_auth(contract(p), raw_basic("dex%zz:x")),
    "Basic secret badly escaped": lambda p: with_auth(contract(p), raw_basic(f"{MODULE_CLIENT}:bad%")),
    "Basic not base64, form credentials": lambda p: with_auth(
        contract(p, client_id=MODULE_CLIENT, client_secret=MODULE_SECRET), "Basic !!!"),
    "Basic without a colon, no form credentials": lambda p: with_auth(contract(p), raw_basic("no-colon")),
    "Bearer, form credentials": lambda p: with_auth(
        contract(p, client_id=MODULE_CLIENT, client_secret=MODULE_SECRET), "Bearer xyz"),
    "Basic wrong, form right: Basic counts": lambda p: exchange(
        p.peer.token(), auth=(MODULE_CLIENT, "wrong"), client_id=MODULE_CLIENT, client_secret=MODULE_SECRET),
    "no client authentication": lambda p: contract(p, auth=None),
    "wrong secret": lambda p: contract(p, auth=(MODULE_CLIENT, "wrong")),
    "empty secret": lambda p: contract(p, auth=(MODULE_CLIENT, "")),
    "unknown client": lambda p: contract(p, auth=("nobody", MODULE_SECRET)),
    "the DexClient's name is not its id": lambda p: contract(p, auth=("peering", MODULE_SECRET)),
    "client id in another case": lambda p: contract(p, auth=("Kubernetes", "k8s-secret")),
    "form secret wrong": lambda p: contract(p, auth=None, client_id=MODULE_CLIENT, client_secret="wrong"),
    "form id without secret": lambda p: contract(p, auth=None, client_id=MODULE_CLIENT),
    # The exchange's own fields, in Dex's order of checks.
    "no subject_token_type": lambda p: contract(p, subject_token_type=None),
    "subject_token_type jwt": lambda p: contract(p, subject_token_type="urn:ietf:params:oauth:token-type:jwt"),
    "no subject_token": lambda p: contract(p, subject_token=""),
    "bad type before missing token": lambda p: contract(p, subject_token=None, subject_token_type="urn:x"),
    "no connector_id": lambda p: contract(p, connector_id=None),
    "unknown connector": lambda p: contract(p, connector_id="peering-unknown"),
    "missing token before unknown connector": lambda p: contract(p, subject_token=None, connector_id="x"),
    "a connector that cannot exchange": lambda p: contract(p, connector_id=PASSWORD_CONNECTOR),
    "access_token subject token (no userinfo)": lambda p: contract(p, subject_token_type=TOKEN_TYPE_ACCESS),
    "requested_token_type defaults to access_token": lambda p: contract(p, requested_token_type=None),
    "requested access_token": lambda p: contract(p, requested_token_type=TOKEN_TYPE_ACCESS),
    "requested refresh_token": lambda p: contract(
        p, requested_token_type="urn:ietf:params:oauth:token-type:refresh_token"),
    "bad requested type, bad token: the token first": lambda p: exchange("x", requested_token_type="urn:x"),
    # Scopes and the claims each brings.
    **{f"scope {s!r}": (lambda s: lambda p: contract(p, scope=s))(s) for s in (
        "openid", "openid email", "openid profile", "openid groups", "openid federated:id", "", "email",
        "openid unknown-scope email", "openid offline_access", "email email profile",
        "openid email profile groups federated:id",
        "openid Audience:server:client_id:kubernetes",
        "openid\temail\nprofile", "openid\xa0email", "openid\u2003profile",
        "openid\x1femail",   # not a space to Go's strings.Fields, while Python's split takes it for one
    )},
    # aud from cross-client scopes, checked against trustedPeers.
    "trusted peer": lambda p: contract(p, scope="openid audience:server:client_id:kubernetes"),
    "two trusted peers": lambda p: contract(
        p, scope=f"openid audience:server:client_id:kubernetes audience:server:client_id:{CLUSTER_APP}"),
    "a peer twice": lambda p: contract(
        p, scope="openid audience:server:client_id:kubernetes audience:server:client_id:kubernetes"),
    "the client itself": lambda p: contract(p, scope=f"openid audience:server:client_id:{MODULE_CLIENT}"),
    "itself and a peer": lambda p: contract(
        p, scope=f"openid audience:server:client_id:{MODULE_CLIENT} audience:server:client_id:kubernetes"),
    "untrusted: kubernetes does not trust outsider": lambda p: contract(
        p, auth=(OUTSIDER, OUTSIDER_SECRET), scope=CONTRACT_SCOPE),
    "trusted by cluster-app, not by kubernetes": lambda p: contract(
        p, auth=(OUTSIDER, OUTSIDER_SECRET), scope=f"openid audience:server:client_id:{CLUSTER_APP}"),
    "no such peer": lambda p: contract(p, scope="openid email audience:server:client_id:nobody"),
    "a peer that trusts no one": lambda p: contract(p, scope=f"openid audience:server:client_id:{OUTSIDER}"),
    "an empty peer name": lambda p: contract(p, scope="openid audience:server:client_id:"),
    "untrusted with an access token asked for": lambda p: contract(
        p, scope=f"audience:server:client_id:{OUTSIDER}", requested_token_type=TOKEN_TYPE_ACCESS),
}


def multipart(req: Request) -> Request:
    boundary = "dexdiffboundary"
    parts = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                     for k, v in req.form)
    return Request(body=parts + f"--{boundary}--\r\n".encode(),
                   content_type=f"multipart/form-data; boundary={boundary}", auth=req.auth)


def padded(req: Request, size: int) -> Request:
    """`req` with a field `pad` that makes its body `size` bytes long."""
    body = req.data() + b"&pad="
    return Request(body=body + b"a" * (size - len(body)), auth=req.auth)


def with_auth(req: Request, authorization: str) -> Request:
    return Request(form=req.form, authorization=authorization)


@pytest.mark.parametrize("case", list(CASES))
async def test_the_token_endpoint_answers_alike(pair, case):
    await pair.same(CASES[case](pair))


# --- subject tokens: valid for both or for neither --------------------------------------------------------------

def _now() -> int:
    return int(time.time())


SUBJECTS = {
    "RS256": lambda p: p.peer.token(),
    "ES256": lambda p: p.peer.token(p.peer.ec),
    "RS384": lambda p: p.peer.token(header={"alg": "RS384", "kid": "peer-rsa"}),
    "PS256": lambda p: p.peer.token(header={"alg": "PS256", "kid": "peer-rsa"}),
    "PS384 (not offered)": lambda p: p.peer.token(header={"alg": "PS384", "kid": "peer-rsa"}),
    "no kid": lambda p: p.peer.token(header={"alg": "RS256"}),
    "unknown kid": lambda p: p.peer.token(header={"alg": "RS256", "kid": "other"}),
    "the EC key's kid on an RSA signature": lambda p: p.peer.token(header={"alg": "RS256", "kid": "peer-ec"}),
    "a typ header": lambda p: p.peer.token(header={"alg": "RS256", "kid": "peer-rsa", "typ": "JWT"}),
    "wrong issuer": lambda p: p.peer.token(iss="https://api.elsewhere.lab"),
    "issuer with a slash": lambda p: p.peer.token(iss=p.peer.url + "/"),
    "issuer not a string": lambda p: p.peer.token(iss=5),
    "expired": lambda p: p.peer.token(exp=_now() - 1),
    "expires in 30 s": lambda p: p.peer.token(exp=_now() + 30),
    "expires in a day": lambda p: p.peer.token(exp=_now() + 86400),
    "no exp": lambda p: p.peer.token(exp=None),
    "exp a float": lambda p: p.peer.token(exp=_now() + 600.75),
    "exp a numeric string": lambda p: p.peer.token(exp=str(_now() + 600)),
    "exp a word": lambda p: p.peer.token(exp="soon"),
    "exp null": lambda p: p.raw_null("exp"),
    "nbf within the leeway": lambda p: p.peer.token(nbf=_now() + 200),
    "nbf beyond the leeway": lambda p: p.peer.token(nbf=_now() + 400),
    "nbf a word": lambda p: p.peer.token(nbf="later"),
    "nbf null": lambda p: p.raw_null("nbf"),
    "iat a word": lambda p: p.peer.token(iat="now"),
    "iat null": lambda p: p.raw_null("iat"),
    "iat in the future": lambda p: p.peer.token(iat=_now() + 3600),
    "no iat, no nbf": lambda p: p.peer.token(iat=None, nbf=None),
    "aud a string": lambda p: p.peer.token(aud="somebody-else"),
    "no aud": lambda p: p.peer.token(aud=None),
    "aud a number": lambda p: p.peer.token(aud=7),
    "aud a list with a number": lambda p: p.peer.token(aud=["a", 7]),
    "aud an object": lambda p: p.peer.token(aud={"a": 1}),
    "nonce a number": lambda p: p.peer.token(nonce=1),
    "at_hash a string": lambda p: p.peer.token(at_hash="abc"),
    "at_hash a list": lambda p: p.peer.token(at_hash=["abc"]),
    "distributed claims, consistent": lambda p: p.peer.token(
        _claim_names={"groups": "src1"}, _claim_sources={"src1": {"endpoint": "https://127.0.0.1:1/groups"}}),
    "distributed claims, no source": lambda p: p.peer.token(_claim_names={"groups": "src1"}),
    "distributed claims, empty source name": lambda p: p.peer.token(_claim_names={"groups": ""}),
    "distributed claims, names not an object": lambda p: p.peer.token(_claim_names=["groups"]),
    "distributed claims, a source not an object": lambda p: p.peer.token(
        _claim_names={"groups": "src1"}, _claim_sources={"src1": "https://x"}),
    "no sub": lambda p: p.peer.token(sub=None),
    "sub a number": lambda p: p.peer.token(sub=12),
    "sub null": lambda p: p.raw_null("sub"),
    "a name, email and preferred_username of its own": lambda p: p.peer.token(
        name="Eve", email="eve@example.com", preferred_username="eve"),
    "email_verified a string": lambda p: p.peer.token(email_verified="yes"),
    "groups of its own": lambda p: p.peer.token(groups=["system:masters"]),
    "hand-signed, canonical": lambda p: p.raw(p.peer.claims()),
    "claims not an object": lambda p: p.peer.raw_token({"alg": "RS256", "kid": "peer-rsa"}, b'["a"]'),
    "claims null": lambda p: p.peer.raw_token({"alg": "RS256", "kid": "peer-rsa"}, b"null"),
    "exp NaN": lambda p: p.raw(p.peer.claims(), exp="NaN"),
    "exp Infinity": lambda p: p.raw(p.peer.claims(), exp="Infinity"),
    "exp 1e300": lambda p: p.raw(p.peer.claims(), exp="1e300"),
    "exp 1e400": lambda p: p.raw(p.peer.claims(), exp="1e400"),
    "exp past int64": lambda p: p.raw(p.peer.claims(), exp="99999999999999999999"),
    "exp in exponent form": lambda p: p.raw(p.peer.claims(), exp=f"{_now() + 600}e0"),
    "exp a string in exponent form": lambda p: p.peer.token(exp=f"{_now() + 600}e0"),
    "exp true": lambda p: p.peer.token(exp=True),
    "EXP instead of exp": lambda p: p.raw(p.peer.claims(exp=None), EXP=str(_now() + 600)),
    "ISS after iss": lambda p: p.raw(p.peer.claims(), ISS='"https://api.elsewhere.lab"'),
    "Iss before iss": lambda p: p.raw({"Iss": "https://api.elsewhere.lab", **p.peer.claims()}),
    "Sub only (no sub)": lambda p: p.raw(p.peer.claims(sub=None), Sub='"x"'),
    "a long s in sub": lambda p: p.raw(p.peer.claims(), **{"\u017fub": "5"}),
    "sub twice: the last counts": lambda p: p.raw(p.peer.claims(), sub='"system:serviceaccount:x:y"'),
    "padded segments": lambda p: p.peer.raw_token(
        {"alg": "RS256", "kid": "peer-rsa"}, json.dumps(p.peer.claims(x="a")).encode(),
        encode=lambda b: base64.urlsafe_b64encode(b).decode()),
    "standard base64 segments": lambda p: p.peer.raw_token(
        {"alg": "RS256", "kid": "peer-rsa"}, json.dumps(p.peer.claims(x="??>>")).encode(),
        encode=lambda b: base64.b64encode(b).decode().rstrip("=")),
    "a crit header": lambda p: p.peer.raw_token({"alg": "RS256", "kid": "peer-rsa", "crit": ["exp"], "exp": 1},
                                                json.dumps(p.peer.claims()).encode()),
    "alg none": lambda p: p.unsigned(),
    "HS256 keyed with the public key": lambda p: p.hs256(),
    "another key, same kid": lambda p: p.other_key_token(),
    "not a JWT": lambda p: "not-a-token",
    "two segments": lambda p: ".".join(p.peer.token().split(".")[:2]),
    "four segments": lambda p: p.peer.token() + ".x",
}


@pytest.mark.parametrize("case", list(SUBJECTS))
async def test_a_subject_token_is_valid_for_both_or_neither(pair, case):
    await pair.same(exchange(SUBJECTS[case](_Tokens(pair))))


class _Tokens:
    """What the SUBJECTS cases make tokens with: the peer issuer and a few hand-made forms."""

    def __init__(self, pair: Pair) -> None:
        self.peer = pair.peer

    def raw(self, claims: dict, **literals: str) -> str:
        """A hand-signed token of `claims`, then each of `literals` as a claim whose JSON text is given as it is
        (a number Python would not write, a repeated name)."""
        text = json.dumps(claims)[:-1] + "".join(f", {json.dumps(k)}: {v}" for k, v in literals.items()) + "}"
        return self.peer.raw_token({"alg": "RS256", "kid": "peer-rsa"}, text.encode())

    def raw_null(self, claim: str) -> str:
        claims = self.peer.claims()
        claims[claim] = None
        return self.peer.raw_token({"alg": "RS256", "kid": "peer-rsa"}, json.dumps(claims).encode())

    def unsigned(self) -> str:
        header = b64url(b'{"alg":"none"}')
        return f"{header}.{b64url(json.dumps(self.peer.claims()).encode())}."

    def hs256(self) -> str:
        pem = self.peer.rsa.export_to_pem()
        secret = jwk.JWK(kty="oct", k=b64url(pem))
        t = jwt.JWT(header={"alg": "HS256", "kid": "peer-rsa"}, claims=self.peer.claims())
        t.make_signed_token(secret)
        return t.serialize()

    def other_key_token(self) -> str:
        other = jwk.JWK.generate(kty="RSA", size=2048, kid="peer-rsa")
        return self.peer.token(other)


# --- lifetimes, discovery, keys ---------------------------------------------------------------------------------

async def test_the_token_lives_id_tokens_valid_for_not_the_subjects_exp(pair):
    for exp in (_now() + 30, _now() + 86400):
        answer = await pair.same(exchange(pair.peer.token(exp=exp)))
        assert answer["status"] == 200
        assert answer["body"]["access_token"]["claims"]["exp"] == f"<iat + {ID_TOKENS_VALID_FOR}>"


async def test_the_contract_token_is_what_the_api_server_needs(pair):
    """Not only alike: what both give the module's exchange is the token the contract promises."""
    answer = await pair.same(exchange(pair.peer.token()))
    claims = answer["body"]["access_token"]["claims"]
    assert claims["aud"] == [KUBERNETES, MODULE_CLIENT] and claims["azp"] == MODULE_CLIENT
    assert (claims["email"], claims["email_verified"], claims["name"]) == (SA_SUB, True, SA_SUB)
    assert claims["iss"] == ISSUER
    assert answer["body"]["issued_token_type"] == TOKEN_TYPE_ID


async def test_discovery_is_the_same_document(pair):
    await pair.same(Request(method="GET", path="/.well-known/openid-configuration", auth=None))


async def test_the_keys_are_alike(pair):
    lab, upstream = await pair.ask(Request(method="GET", path="/keys", auth=None))

    def form(answer):
        (key,) = answer["body"]["keys"]
        assert len(key["kid"]) == 40 and int(key["kid"], 16) >= 0, key
        max_age, _, rest = answer["cache"]["Cache-Control"].partition(", ")
        seconds = int(max_age.removeprefix("max-age="))
        assert 120 <= seconds <= 6 * 3600 and rest == "must-revalidate", answer["cache"]
        return {"status": answer["status"], "content_type": answer["content_type"], "fields": sorted(key),
                "kty": key["kty"], "alg": key["alg"], "use": key["use"], "e": key["e"]}

    assert form(lab) == form(upstream)


@pytest.mark.parametrize("path", ["/token/", "/keys/", "/nothing", "/.well-known/openid-configuration/"])
async def test_unknown_paths_are_404_alike(pair, path):
    await pair.same(Request(method="GET", path=path, auth=None))


@pytest.mark.parametrize("method", ["POST", "HEAD"])
async def test_discovery_and_keys_answer_any_method(pair, method):
    for path in ("/.well-known/openid-configuration", "/keys"):
        lab, upstream = await pair.ask(Request(method=method, path=path, auth=None))
        assert (lab["status"], lab["content_type"]) == (upstream["status"], upstream["content_type"]), (lab, upstream)


# --- the differences kept on purpose (lab/README.md, "Where the lab's Dex differs from upstream on purpose") -----

@pytest.mark.parametrize("grant, extra, upstream", [
    ("authorization_code", {"code": "abc", "redirect_uri": "https://x"},
     (400, {"error": "invalid_grant", "error_description": "Invalid or expired code parameter."})),
    ("refresh_token", {"refresh_token": "abc"},
     (400, {"error": "invalid_request",
            "error_description": "Refresh token is invalid or has already been claimed by another client."})),
    ("urn:ietf:params:oauth:grant-type:device_code", {"device_code": "abc"},
     (400, {"error": "invalid_request", "error_description": "Invalid Device code."})),
])
async def test_the_lab_serves_only_the_token_exchange_grant(pair, grant, extra, upstream):
    """Upstream serves and advertises four grants (discovery, alike on both, lists them); the lab only token
    exchange: the others are refused, never granted."""
    lab, up = await pair.ask(contract(pair, grant_type=grant, **extra))
    assert (lab["status"], lab["body"]) == (400, {"error": "unsupported_grant_type"})
    assert (up["status"], up["body"]) == upstream


@pytest.mark.parametrize("method, path, upstream_status", [
    ("GET", "/auth", 200), ("GET", "/userinfo", 401), ("POST", "/token/introspect", 400),
    ("POST", "/device/code", 200), ("GET", "/device", 200), ("GET", "/healthz", 200), ("GET", "/robots.txt", 200),
])
async def test_the_lab_serves_only_discovery_keys_and_token(pair, method, path, upstream_status):
    """The login flows, userinfo, introspection, the device flow and the health check are upstream's; the lab's
    Dex answers them as unknown paths."""
    form = (("client_id", KUBERNETES),) if method == "POST" else None
    lab, up = await pair.ask(Request(method=method, path=path, form=form, auth=None))
    assert (lab["status"], lab["body"]) == (404, "404 page not found\n")
    assert up["status"] == upstream_status, up


async def test_an_empty_sub_is_refused_by_the_lab_only(pair):
    """Upstream's oidc connector takes `"sub": ""` as a user with no id and issues a token with no `email` or
    `name`; the lab's connector refuses it (a TokenExchangeProvider's identity is usernamePrefix + sub, and a
    prefix alone names no ServiceAccount)."""
    lab, up = await pair.ask(exchange(pair.peer.token(sub="")))
    assert (lab["status"], lab["body"]) == (401, {"error": "access_denied"})
    assert up["status"] == 200
    claims = up["body"]["access_token"]["claims"]
    assert "email" not in claims and "name" not in claims and claims["email_verified"] is True
    assert claims["sub"] == opaque_subject("", CONNECTOR)


# --- the runner of upstream Dex -----------------------------------------------------------------------------------

def _runner(tmp_path, binary, config=None) -> UpstreamDex:
    ca = certs.CA("runner CA")
    return UpstreamDex(tmp_path, ISSUER, serving=ca.issue_server(["dex.t.lab"], ["127.0.0.1"]), ca_pem=ca.cert_pem,
                       binary=binary, config=config or {
                           "staticClients": [{"id": KUBERNETES, "secret": "x", "name": KUBERNETES}],
                           "connectors": [{"type": "mockPassword", "id": PASSWORD_CONNECTOR, "name": "users",
                                           "config": {"username": "a", "password": "b"}}]})


async def test_a_dex_that_cannot_start_says_why(tmp_path, dex_binary):
    dex = _runner(tmp_path, dex_binary, {"connectors": [{"type": "no-such-type", "id": "x", "name": "x"}]})
    with pytest.raises(StartError, match=r"dex exited with code \d+ while starting; the end of .*dex\.log:\n"
                                         r"(.|\n)*no-such-type"):
        await dex.start()
    assert dex._process is None


async def test_a_port_taken_meanwhile_is_retried_with_another(tmp_path, dex_binary, monkeypatch):
    import socket

    from lab.real import upstream_dex

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    monkeypatch.setattr(upstream_dex, "free_port", lambda: next(ports, None) or runner_free_port())
    dex = _runner(tmp_path, dex_binary)
    try:
        await dex.start()
        assert dex.port != taken.getsockname()[1]
        assert "address already in use" in dex.log_path.read_text()
    finally:
        await dex.stop()
        taken.close()
