"""ServiceAccount tokens: issuing and verifying bound tokens, and the issuer's OIDC discovery, as kube-apiserver.

The issuer signs with an ES256 key (P-256) generated at start: each emulated cluster has its own key, as each real
cluster has its own `--service-account-signing-key-file`, and of the kind the real backend's lab gives kube-apiserver
(lab/real/runner.py), which then signs ES256 too. An RSA key would cost a tenth of a second of CPU per emulated
cluster, and the suite makes hundreds. The claims follow kube-apiserver's bound tokens so that code
reading them (the gateway checks `iss`, `aud`, `sub`, `exp`, `nbf`) sees what it would see in production.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable

from cryptography.hazmat.primitives import serialization
from jwcrypto import jwk, jws
from jwcrypto.common import JWException

SIGNING_ALG = "ES256"
# go-jose's default leeway, which kube-apiserver uses when it checks exp and nbf of its own tokens.
LEEWAY = timedelta(seconds=60)
SA_USERNAME_PREFIX = "system:serviceaccount:"
# Kinds a token may be bound to (TokenRequest's boundObjectRef), and the claim key each one gets.
BOUND_KINDS = {"Pod": "pod", "Secret": "secret", "Node": "node"}


class TokenInvalid(Exception):
    """A token was refused. The reason says why in words fit for a log; it never contains the token."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def sa_username(namespace: str, name: str) -> str:
    return f"{SA_USERNAME_PREFIX}{namespace}:{name}"


def parse_sa_username(username: str) -> tuple[str, str] | None:
    """(namespace, name) of a `system:serviceaccount:<ns>:<name>` user, None for any other user."""
    if not username.startswith(SA_USERNAME_PREFIX):
        return None
    parts = username[len(SA_USERNAME_PREFIX):].split(":")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def is_compact_jws(token: str) -> bool:
    """Three base64url parts joined by dots: the only form kube-apiserver's token authenticators read (one that
    starts with `{`, the JWS JSON serialization jwcrypto would also take, is refused there)."""
    parts = token.split(".")
    return len(parts) == 3 and all(_B64URL.fullmatch(p) for p in parts)


def unverified_claims(token: str) -> dict | None:
    """The payload of a compact JWS without checking anything, to route a token to the issuer that can check it."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError):
        return None
    return claims if isinstance(claims, dict) else None


def audiences_of(claims: dict) -> list[str]:
    """`aud` is a string or a list of strings (RFC 7519 4.1.3)."""
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    if isinstance(aud, list):
        return [a for a in aud if isinstance(a, str)]
    return []


def intersect(token_audiences: list[str], wanted: list[str]) -> list[str]:
    """Audiences of the token that are also wanted, in the order they were wanted (as TokenReview answers them)."""
    have = set(token_audiences)
    return [a for a in dict.fromkeys(wanted) if a in have]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _key_id(key: jwk.JWK) -> str:
    # kube-apiserver's key ID: unpadded base64url of the SHA-256 of the public key's DER (SubjectPublicKeyInfo).
    der = serialization.load_pem_public_key(key.export_to_pem(private_key=False)).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode("ascii")


class ServiceAccountIssuer:
    """Signs and verifies ServiceAccount tokens of one emulated cluster.

    `issuer_url` may be changed after construction (the API server knows its URL only once it has bound its
    port); tokens carry the URL that was current when they were issued. `api_audiences` are kube-apiserver's
    `--api-audiences`: the audiences a token gets when none are requested and those a bearer token must name
    to authenticate to the API; by default the issuer URL.
    """

    def __init__(self, issuer_url: str, *, api_audiences: list[str] | None = None,
                 clock: Callable[[], datetime] = _utcnow) -> None:
        self.issuer_url = issuer_url
        self._api_audiences = list(api_audiences) if api_audiences else None
        self._clock = clock
        self._key = jwk.JWK.generate(kty="EC", crv="P-256")
        self.key_id = _key_id(self._key)

    @property
    def api_audiences(self) -> list[str]:
        return list(self._api_audiences) if self._api_audiences else [self.issuer_url]

    def issue(self, namespace: str, name: str, uid: str, audiences: list[str], expiration_seconds: int,
              bound_object: dict | None = None) -> tuple[str, datetime]:
        """A signed token for the ServiceAccount `namespace/name` with that uid; returns it and its expiry.

        bound_object is a TokenRequest boundObjectRef (`kind` Pod, Secret or Node, `name`, `uid`): the token then
        names it and is valid only while that object exists with that uid.
        """
        if expiration_seconds <= 0:
            raise ValueError("expiration_seconds must be positive")
        now = self._clock().replace(microsecond=0)
        expires_at = now + timedelta(seconds=expiration_seconds)
        k8s: dict = {
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": uid},
        }
        if bound_object is not None:
            kind = bound_object.get("kind", "")
            if kind not in BOUND_KINDS:
                raise ValueError(f"a token cannot be bound to a {kind or 'object without kind'}; "
                                 f"use one of {', '.join(BOUND_KINDS)}")
            k8s[BOUND_KINDS[kind]] = {"name": bound_object.get("name", ""), "uid": bound_object.get("uid", "")}
        claims = {
            "aud": list(audiences) if audiences else self.api_audiences,
            "exp": int(expires_at.timestamp()),
            "iat": int(now.timestamp()),
            "iss": self.issuer_url,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": k8s,
            "nbf": int(now.timestamp()),
            "sub": sa_username(namespace, name),
        }
        token = jws.JWS(json.dumps(claims, separators=(",", ":")).encode("utf-8"))
        token.add_signature(self._key, alg=SIGNING_ALG,
                            protected=json.dumps({"alg": SIGNING_ALG, "kid": self.key_id}))
        return token.serialize(compact=True), expires_at

    def verify(self, token: str, audiences: list[str] | None) -> dict:
        """The claims of a token this issuer signed, still valid, for one of the audiences; else TokenInvalid.

        audiences None means the API audiences (a bearer token presented to the API). The token's `aud` must
        intersect them. Checks that need stored objects (does the ServiceAccount still exist) are the
        authenticator's.
        """
        wanted = self.api_audiences if audiences is None else list(audiences)
        if not is_compact_jws(token):
            raise TokenInvalid("token is not a compact JWS")
        parsed = jws.JWS()
        try:
            parsed.deserialize(token)
            header = parsed.jose_header
        except (JWException, ValueError, TypeError):
            raise TokenInvalid("token is not a compact JWS") from None
        if not isinstance(header, dict) or header.get("alg") != SIGNING_ALG:
            # Anything but our algorithm, `none` and HMAC with the public key included, is refused before use.
            raise TokenInvalid(f"signing algorithm must be {SIGNING_ALG}")
        if header.get("kid") not in (None, self.key_id):
            raise TokenInvalid("token is signed by an unknown key")
        parsed.allowed_algs = [SIGNING_ALG]
        try:
            parsed.verify(self._key)
        except (JWException, ValueError, TypeError):
            raise TokenInvalid("token signature is invalid") from None
        try:
            claims = json.loads(parsed.payload)
        except ValueError:
            raise TokenInvalid("token payload is not JSON") from None
        if not isinstance(claims, dict):
            raise TokenInvalid("token payload is not a JSON object")
        if claims.get("iss") != self.issuer_url:
            raise TokenInvalid("token issuer is not this API server")
        self._check_times(claims)
        token_auds = audiences_of(claims)
        if not intersect(token_auds, wanted):
            raise TokenInvalid(f"token audiences {json.dumps(token_auds)} is invalid for the target audiences "
                               f"{json.dumps(wanted)}")
        k8s = claims.get("kubernetes.io")
        if not (isinstance(k8s, dict) and isinstance(k8s.get("serviceaccount"), dict)
                and isinstance(k8s.get("namespace"), str)):
            raise TokenInvalid("token does not name a ServiceAccount")
        if claims.get("sub") != sa_username(k8s["namespace"], k8s["serviceaccount"].get("name", "")):
            raise TokenInvalid("token subject does not match its ServiceAccount")
        return claims

    def _check_times(self, claims: dict) -> None:
        now = self._clock()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, (int, float)):
            raise TokenInvalid("token has no expiry")
        if now > datetime.fromtimestamp(exp, timezone.utc) + LEEWAY:
            raise TokenInvalid("token has expired")
        if isinstance(nbf, (int, float)) and now < datetime.fromtimestamp(nbf, timezone.utc) - LEEWAY:
            raise TokenInvalid("token is not valid yet")

    def discovery_document(self) -> dict:
        """What kube-apiserver serves at `/.well-known/openid-configuration`."""
        return {
            "issuer": self.issuer_url,
            "jwks_uri": self.issuer_url.rstrip("/") + "/openid/v1/jwks",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [SIGNING_ALG],
        }

    def jwks(self) -> dict:
        """What kube-apiserver serves at `/openid/v1/jwks`: the public key only."""
        public = self._key.export_public(as_dict=True)
        public.update({"use": "sig", "alg": SIGNING_ALG, "kid": self.key_id})
        return {"keys": [public]}
