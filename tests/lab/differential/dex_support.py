"""The Dex differential test's machinery: upstream Dex (built from its Go module) and the lab's Dex, configured
alike and served over TLS on loopback; a peer issuer whose tokens both trust; one request sent to both, and the
answers reduced to what a client reads.

The lab's connector verifies subject tokens against an inline JWKS (the TokenExchangeProvider the module assumes
of user-authn), which upstream Dex has no connector for. Upstream gets its `oidc` connector instead, pointed at
`PeerIssuer` (OIDC discovery and the same keys, on loopback) and told to name the identity as the lab's connector
does with an empty usernamePrefix: user id, `name`, `email` and `preferred_username` all the token's `sub`,
`email_verified` true, no groups. So one subject token is valid for both or for neither.

An answer is compared as the status, the Content-Type, the cache headers and the body. An issued token is
compared by its verified header and claims, with what must differ replaced by what it is, key by key: the `kid`
(each Dex's own key, checked against its /keys), `iat` (now, checked), `exp` (as `iat` + the lifetime),
`at_hash` (checked for its form), `expires_in` (checked against `exp`).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import ssl
import time
import urllib.parse
from typing import Any, Mapping

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from jwcrypto import jwk, jwt

from lab import certs
from lab.dex import GRANT_TOKEN_EXCHANGE, SUBJECT_ALGS, TOKEN_TYPE_ID

ISSUER = "https://dex.t.lab/"   # with the slash, as Deckhouse configures its Dex
DEX_HOST = "dex.t.lab"
MODULE_CLIENT, MODULE_SECRET = "dex-client-peering@d8-peering", "s3cret/+= %:é"
KUBERNETES, KUBERNETES_SECRET = "kubernetes", "k8s-secret"
OUTSIDER, OUTSIDER_SECRET = "outsider", "oth:er"          # trusted by nobody; its secret has a colon
CLUSTER_APP, CLUSTER_APP_SECRET = "cluster-app", "app-secret"
CONNECTOR = "peering-b"
# A connector upstream that cannot exchange tokens (a password connector): "does not exist" for the exchange.
PASSWORD_CONNECTOR = "local-users"
# Not Dex's default (24h) nor user-authn's (10m): the setting is seen to apply.
ID_TOKENS_VALID_FOR = 420
CONTRACT_SCOPE = "openid email profile groups audience:server:client_id:kubernetes"
SA_SUB = "system:serviceaccount:d8-example:controller"
FORM = "application/x-www-form-urlencoded"
TOKEN_TYPE_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
# (id, secret, trustedPeers): the same clients on both.
CLIENTS = (
    (MODULE_CLIENT, MODULE_SECRET, ()),
    (KUBERNETES, KUBERNETES_SECRET, (MODULE_CLIENT,)),
    (OUTSIDER, OUTSIDER_SECRET, ()),
    (CLUSTER_APP, CLUSTER_APP_SECRET, (MODULE_CLIENT, OUTSIDER)),
)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class PeerIssuer:
    """The peer cluster's token issuer: discovery and JWKS over TLS on 127.0.0.1, and the keys that sign its
    tokens (RSA `peer-rsa`, EC P-256 `peer-ec`). Its URL is `https://127.0.0.1:<port>`, the `iss` of its tokens."""

    def __init__(self, ca: certs.CA) -> None:
        self.serving = ca.issue_server([], ["127.0.0.1"])
        self.rsa = jwk.JWK.generate(kty="RSA", size=2048, kid="peer-rsa", use="sig")
        self.ec = jwk.JWK.generate(kty="EC", crv="P-256", kid="peer-ec", use="sig")
        self.port = 0
        self.fetched: list[str] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def jwks(self) -> dict:
        return {"keys": [self.rsa.export_public(as_dict=True), self.ec.export_public(as_dict=True)]}

    def discovery(self) -> dict:
        u = self.url
        return {"issuer": u, "jwks_uri": f"{u}/keys", "authorization_endpoint": f"{u}/authorize",
                "token_endpoint": f"{u}/token", "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                # What the lab's connector accepts: go-oidc then accepts exactly these.
                "id_token_signing_alg_values_supported": list(SUBJECT_ALGS)}

    async def start(self) -> None:
        async def serve(request: web.Request) -> web.Response:
            self.fetched.append(request.path)
            doc = self.discovery() if request.path.startswith("/.well-known/") else self.jwks()
            return web.json_response(doc)

        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", serve)
        app.router.add_get("/keys", serve)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=certs.server_ssl_context(self.serving)).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def claims(self, **overrides) -> dict:
        """A ServiceAccount token's claims (kube-apiserver's), `overrides` replacing them; None removes one."""
        now = int(time.time())
        claims = {"iss": self.url, "sub": SA_SUB, "aud": ["peering.deckhouse.io/x/cap"], "iat": now, "nbf": now,
                  "exp": now + 600, "kubernetes.io": {"namespace": "d8-example"}}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, key: jwk.JWK | None = None, *, header: Mapping | None = None, **overrides) -> str:
        """A signed token: `key` (the RSA one by default), a header of `alg` and `kid` (or `header`)."""
        key = key or self.rsa
        alg = "ES256" if key.get("kty") == "EC" else "RS256"
        t = jwt.JWT(header=dict(header) if header is not None else {"alg": alg, "kid": key.kid},
                    claims=self.claims(**overrides))
        t.make_signed_token(key)
        return t.serialize()

    def raw_token(self, header: Mapping, payload: bytes, encode=b64url) -> str:
        """A token RS256-signed by the RSA key over exactly the segments `encode` makes of `header` and `payload`
        (the JWT libraries make only canonical ones)."""
        signing_input = f"{encode(json.dumps(header).encode())}.{encode(payload)}"
        private = self.rsa.get_op_key("sign")
        sig = private.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{encode(sig)}"


def upstream_config(peer: PeerIssuer, ca_file: str) -> dict:
    """Upstream Dex's configuration: the clients of CLIENTS, the `oidc` connector naming identities as the lab's
    does, a password connector, tokens living ID_TOKENS_VALID_FOR."""
    return {
        "expiry": {"idTokens": f"{ID_TOKENS_VALID_FOR}s"},
        "oauth2": {"skipApprovalScreen": True},
        "staticClients": [{"id": i, "secret": s, "name": i, "trustedPeers": list(p)} for i, s, p in CLIENTS],
        "connectors": [
            {"type": "oidc", "id": CONNECTOR, "name": "peer b", "config": {
                "issuer": peer.url, "rootCAs": [ca_file], "clientID": "unused", "clientSecret": "unused",
                "redirectURI": f"{ISSUER}callback",
                "userNameKey": "sub", "overrideClaimMapping": True,
                "claimMapping": {"email": "sub", "preferred_username": "sub"},
                "insecureSkipEmailVerified": True}},
            {"type": "mockPassword", "id": PASSWORD_CONNECTOR, "name": "local users",
             "config": {"username": "admin", "password": "password"}},
        ],
    }


@dataclasses.dataclass(frozen=True)
class Request:
    """One request to a Dex. `form` is encoded as a browser would (pairs, so fields can repeat); `body` is sent
    as it is instead. `auth` is HTTP Basic with the id and secret form-urlencoded (RFC 6749 §2.3.1), or
    `authorization` the header as it is."""

    method: str = "POST"
    path: str = "/token"
    form: tuple[tuple[str, str], ...] | None = None
    body: bytes | None = None
    content_type: str | None = FORM
    auth: tuple[str, str] | None = (MODULE_CLIENT, MODULE_SECRET)
    authorization: str | None = None
    query: str = ""

    def data(self) -> bytes | None:
        if self.body is not None:
            return self.body
        return urllib.parse.urlencode(self.form).encode() if self.form is not None else None

    def headers(self) -> dict[str, str]:
        h = {}
        if self.authorization is not None:
            h["Authorization"] = self.authorization
        elif self.auth is not None:
            h["Authorization"] = basic(*self.auth)
        if self.content_type is not None and self.data() is not None:
            h["Content-Type"] = self.content_type
        return h


def basic(client_id: str, secret: str) -> str:
    return "Basic " + base64.b64encode(
        f"{urllib.parse.quote_plus(client_id)}:{urllib.parse.quote_plus(secret)}".encode()).decode()


def raw_basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def exchange(token: str | None, *, auth=(MODULE_CLIENT, MODULE_SECRET), extra=(), **fields) -> Request:
    """The contract's token exchange (docs/user-authn-contract.md); `fields` replace its fields (None removes
    one), `extra` pairs are added after them."""
    f: dict[str, str | None] = {
        "grant_type": GRANT_TOKEN_EXCHANGE, "connector_id": CONNECTOR, "subject_token": token,
        "subject_token_type": TOKEN_TYPE_ID, "requested_token_type": TOKEN_TYPE_ID, "scope": CONTRACT_SCOPE,
    }
    f.update(fields)
    pairs = tuple((k, v) for k, v in f.items() if v is not None) + tuple(extra)
    return Request(form=pairs, auth=auth)


@dataclasses.dataclass
class Answer:
    status: int
    content_type: str
    cache: dict[str, str]
    body: Any
    at: float  # when it was asked

    def comparable(self) -> dict:
        return {"status": self.status, "content_type": self.content_type, "cache": self.cache, "body": self.body}


class Side:
    """One Dex (the lab's or upstream) as a client on loopback sees it, over TLS for `dex.t.lab`."""

    def __init__(self, name: str, port: int, ca_pem: bytes, session: aiohttp.ClientSession) -> None:
        self.name = name
        self.port = port
        self._ctx: ssl.SSLContext = certs.client_ssl_context(ca_pem)
        self._session = session
        self.jwks: dict = {}

    async def send(self, req: Request) -> Answer:
        url = f"https://127.0.0.1:{self.port}{req.path}" + (f"?{req.query}" if req.query else "")
        at = time.time()
        data = req.data()
        if data is not None and len(data) > 1 << 20:
            data = io.BytesIO(data)  # aiohttp sends a big body from a file-like object without blocking its loop
        async with self._session.request(req.method, url, data=data, headers=req.headers(), ssl=self._ctx,
                                         server_hostname=DEX_HOST, allow_redirects=False) as r:
            raw = await r.read()
            cache = {h: r.headers[h] for h in ("Cache-Control", "Pragma") if h in r.headers}
            ctype = r.headers.get("Content-Type", "")
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        return Answer(r.status, ctype, cache, body, at)

    def reduce(self, answer: Answer) -> dict:
        """`answer` as compared: an issued token by its verified header and claims, volatile values by form."""
        out = answer.comparable()
        body = answer.body
        if answer.status != 200 or not isinstance(body, dict) or "access_token" not in body:
            return out
        body = dict(body)
        header, claims = verify(self.jwks, body.pop("access_token"))
        keys = self.jwks["keys"]
        assert header.get("kid") in {k["kid"] for k in keys}, (self.name, header, keys)
        header["kid"] = "<the kid of a key of /keys>"
        assert abs(claims["iat"] - answer.at) <= 5, (self.name, claims, answer.at)
        lifetime = claims["exp"] - claims["iat"]
        claims["iat"], claims["exp"] = "<now>", f"<iat + {lifetime}>"
        if "at_hash" in claims:
            assert re.fullmatch(r"[A-Za-z0-9_-]{22}", claims["at_hash"]), (self.name, claims["at_hash"])
            claims["at_hash"] = "<at_hash: 16 bytes>"
        if "expires_in" in body:
            # Go's int(time.Until(expiry).Seconds()): the whole seconds left when the answer was written.
            assert lifetime - 3 <= body["expires_in"] <= lifetime, (self.name, body["expires_in"], lifetime)
            body["expires_in"] = "<seconds left of exp>"
        body["access_token"] = {"header": header, "claims": claims}
        out["body"] = body
        return out


def verify(jwks: dict, token: str) -> tuple[dict, dict]:
    keys = jwk.JWKSet.from_json(json.dumps(jwks))
    t = jwt.JWT(jwt=token, key=keys, algs=["RS256"], check_claims=False)
    return json.loads(t.token.objects["protected"]), json.loads(t.claims)


class Pair:
    """The lab's Dex and upstream Dex, asked the same."""

    def __init__(self, lab: Side, upstream: Side, peer: PeerIssuer) -> None:
        self.lab = lab
        self.upstream = upstream
        self.peer = peer

    async def ask(self, req: Request) -> tuple[dict, dict]:
        """Both reduced answers to `req`, the lab's first."""
        lab = self.lab.reduce(await self.lab.send(req))
        upstream = self.upstream.reduce(await self.upstream.send(req))
        return lab, upstream

    async def same(self, req: Request) -> dict:
        """Both answer `req` alike; the answer. A difference fails showing both in full."""
        lab, upstream = await self.ask(req)
        assert lab == upstream, (f"the lab's Dex and upstream Dex differ on {req}:\n  "
                                 + "\n  ".join(differences(lab, upstream)) + "\n"
                                 f"lab:      {json.dumps(lab, indent=1, sort_keys=True, default=str)}\n"
                                 f"upstream: {json.dumps(upstream, indent=1, sort_keys=True, default=str)}")
        return lab


def differences(lab: Any, upstream: Any, where: str = "") -> list[str]:
    """Where two reduced answers differ: `path: lab value != upstream value`, one line each."""
    if isinstance(lab, dict) and isinstance(upstream, dict):
        return [d for k in sorted(set(lab) | set(upstream), key=str)
                for d in differences(lab.get(k, "<absent>"), upstream.get(k, "<absent>"), f"{where}/{k}")]
    return [] if lab == upstream else [f"{where or '/'}: lab {lab!r} != upstream {upstream!r}"]
