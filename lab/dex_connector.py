"""The Dex connector the peering module assumes user-authn makes of a TokenExchangeProvider: it verifies a subject
id_token against the provider's inline JWKS and issuer, and names the identity behind it.

Upstream Dex has no such connector (no inline JWKS, no username prefix); its `oidc` connector is the nearest, and
this verifies as that one's `TokenIdentity` does for an id_token, with go-oidc v3.11's `Verify`
(SkipClientIDCheck), the keys given inline instead of discovered:

- the payload is the JWT's second segment in unpadded base64url, a JSON object; go-oidc decodes it into its
  `idToken` struct first, which refuses a claim of the wrong JSON type: `iss`, `sub`, `nonce`, `at_hash` must be
  strings, `aud` a string or a list of strings, `exp` and `iat` numbers (or strings holding one; null is
  refused), `nbf` a number when not null, `_claim_names` an object of strings each naming an entry of
  `_claim_sources`. Go matches these names case-insensitively (`EXP` is `exp`, `ſub` is `sub`) and the last
  one written wins;
- `iss` is the provider's issuer; `exp` not before now (a number past int64 is before any time, as Go's
  conversion makes it); `nbf`, when present, not after now + 5 minutes; the audience is NOT checked;
- the signature: one of SUBJECT_ALGS (what the provider's discovery would list), by the key of the header's `kid`
  (any key without one);
- the identity reads the claims as a JSON object (names as written): `sub` must be a non-empty string.

An access_token subject token is refused: upstream's connectors verify one only through the issuer's userinfo
endpoint, which a provider given as inline JWKS does not have. Every refusal is SubjectTokenRefused, with the
reason for the log only (Dex answers 401 `access_denied` with no description).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from jwcrypto import jwk, jwt
from jwcrypto.common import JWException

log = logging.getLogger("lab.dex")

TOKEN_TYPE_ID = "urn:ietf:params:oauth:token-type:id_token"
# go-oidc's algorithms that a ServiceAccount issuer may use (RS256, ES256) and their kin; the differential test
# offers upstream exactly these in the provider's discovery document.
SUBJECT_ALGS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"]
# go-oidc allows this much clock skew on `nbf` and none on `exp`.
NBF_LEEWAY = 300
_INT64 = 1 << 63
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class SubjectTokenRefused(Exception):
    """The connector does not accept the subject token; the message is the reason, for the log."""


@dataclass(frozen=True)
class Identity:
    """What a connector says about the user behind a subject token (Dex's connector.Identity)."""

    user_id: str
    username: str
    preferred_username: str
    email: str
    email_verified: bool
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Connector:
    """The assumed TokenExchangeProvider connector: whose tokens it accepts and how it names their subjects."""

    id: str
    issuer: str
    jwks: Mapping  # a JWK Set as a dict: {"keys": [...]}
    username_prefix: str = ""

    def identity(self, subject: Mapping) -> Identity:
        """The exchanged identity of a verified subject token, per the user-authn contract:
        email and name = usernamePrefix + `sub`, preferred_username = `sub`, email verified, no groups."""
        sub = subject["sub"]
        name = self.username_prefix + sub
        return Identity(user_id=sub, username=name, preferred_username=sub, email=name, email_verified=True)


def _b64url(segment: str, what: str) -> bytes:
    """Go's base64.RawURLEncoding: no padding, no other alphabet."""
    if not _B64URL.fullmatch(segment) or len(segment) % 4 == 1:
        raise SubjectTokenRefused(f"malformed jwt: {what} is not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise SubjectTokenRefused(f"malformed jwt: {what} is not unpadded base64url") from None


class _Object(list):
    """A JSON object as its members in order, repeats kept: what Go's decoder walks."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_object(payload: bytes) -> _Object:
    try:
        doc = json.loads(payload, object_pairs_hook=_Object, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise SubjectTokenRefused(f"failed to unmarshal claims: {e}") from None
    if not isinstance(doc, _Object):
        raise SubjectTokenRefused("failed to unmarshal claims: not a JSON object")
    return doc


def _fold(name: str) -> str:
    """Go's case folding of a JSON member name onto a struct field's (ASCII names; ſ is s, K is k)."""
    return name.replace("\u017f", "s").replace("\u212a", "k").lower()


def _as_dict(value: Any) -> Any:
    """A decoded value with its objects as dicts (the last of repeated names wins, as in a Go map)."""
    if isinstance(value, _Object):
        return {k: _as_dict(v) for k, v in value}
    if isinstance(value, list):
        return [_as_dict(v) for v in value]
    return value


def _is_object(value: Any) -> bool:
    return isinstance(value, _Object)


def _go_time(value: Any, name: str, *, null_ok: bool) -> float | None:
    """go-oidc's jsonTime: a JSON number or a string holding one, as whole seconds (int64; past it, Go's
    conversion gives the most negative); null is None when `null_ok` (a pointer field), else refused."""
    if value is None and null_ok:
        return None
    if isinstance(value, str) and _JSON_NUMBER.fullmatch(value):
        value = json.loads(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not
                                                                          math.isfinite(value)):
        raise SubjectTokenRefused(f"failed to unmarshal claims: {name} is not a number")
    if isinstance(value, float):
        value = math.trunc(value) if abs(value) < _INT64 else -_INT64
    return float(value) if -_INT64 <= value < _INT64 else float(-_INT64)


def _check_struct(pairs: _Object) -> dict[str, Any]:
    """go-oidc's idToken fields as Go decodes them (case-insensitive names, the last wins), types checked."""
    fields: dict[str, Any] = {}
    for key, value in pairs:
        name = _fold(key)
        if name in ("iss", "sub", "nonce", "at_hash"):
            if value is not None and not isinstance(value, str):
                raise SubjectTokenRefused(f"failed to unmarshal claims: {key} is not a string")
        elif name == "aud":
            if not (value is None or isinstance(value, str) or (isinstance(value, list) and not _is_object(value)
                                                                 and all(v is None or isinstance(v, str)
                                                                         for v in value))):
                raise SubjectTokenRefused("failed to unmarshal claims: aud is not a string or a list of strings")
        elif name in ("exp", "iat", "nbf"):
            value = _go_time(value, key, null_ok=name == "nbf")
        elif name == "_claim_names":
            if value is not None and not (_is_object(value) and all(v is None or isinstance(v, str)
                                                                    for _, v in value)):
                raise SubjectTokenRefused("failed to unmarshal claims: _claim_names is not an object of strings")
            value = dict(value or [])
        elif name == "_claim_sources":
            if value is not None and not (_is_object(value) and all(_is_source(v) for _, v in value)):
                raise SubjectTokenRefused("failed to unmarshal claims: _claim_sources is not an object of sources")
            value = dict(value or [])
        else:
            continue
        fields[name] = value
    for claim, source in fields.get("_claim_names", {}).items():
        if not source:
            raise SubjectTokenRefused("failed to obtain source from claim name")
        if source not in fields.get("_claim_sources", {}):
            raise SubjectTokenRefused("source does not exist")
    return fields


def _is_source(value: Any) -> bool:
    return value is None or (_is_object(value) and all(
        v is None or isinstance(v, str) for k, v in value if _fold(k) in ("endpoint", "access_token")))


def verify_subject_token(connector: Connector, token: str, now: float) -> dict:
    """The subject token's claims if go-oidc's Verify accepts it against the connector's issuer and keys
    (module docstring); SubjectTokenRefused saying why otherwise."""
    parts = token.split(".")
    if len(parts) < 2:
        raise SubjectTokenRefused(f"malformed jwt, expected 3 parts got {len(parts)}")
    pairs = _json_object(_b64url(parts[1], "the payload"))
    fields = _check_struct(pairs)
    if fields.get("iss") != connector.issuer:
        raise SubjectTokenRefused(f"issued by {fields.get('iss')!r}, not the connector's {connector.issuer!r}")
    exp = fields.get("exp")
    if exp is None or exp < now:
        raise SubjectTokenRefused("token expired or carries no exp")
    nbf = fields.get("nbf")
    if nbf is not None and nbf > now + NBF_LEEWAY:
        raise SubjectTokenRefused("token not valid yet")
    if len(parts) != 3:
        raise SubjectTokenRefused(f"malformed jwt: {len(parts)} segments")
    for i, what in ((0, "the header"), (2, "the signature")):
        _b64url(parts[i], what)
    try:
        keys = jwk.JWKSet.from_json(json.dumps(dict(connector.jwks)))
    except (JWException, ValueError, TypeError) as e:
        raise SubjectTokenRefused(f"connector keys are not a JWK Set ({e})") from None
    try:
        jwt.JWT(jwt=token, key=keys, algs=SUBJECT_ALGS, expected_type="JWS", check_claims=False)
    except (JWException, ValueError, TypeError) as e:
        raise SubjectTokenRefused(f"signature not verified with the connector's keys ({type(e).__name__})") from None
    claims = _as_dict(pairs)
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise SubjectTokenRefused('missing "sub" claim')
    return claims


def token_identity(connector: Connector, subject_token_type: str, token: str, now: float) -> Identity:
    """The connector's TokenIdentity: verify the subject token, then name its user; SubjectTokenRefused else."""
    if subject_token_type != TOKEN_TYPE_ID:
        raise SubjectTokenRefused("only id_token subject tokens can be verified against inline keys (an "
                                  "access_token needs the issuer's userinfo endpoint)")
    return connector.identity(verify_subject_token(connector, token, now))
