"""Valid inputs to start the harnesses from: for the control loop's, a connection string, a join body, an offer
message, a CSR and a CA, made the way the module makes them; for the gateway's, a peer with a JWKS, this
cluster's registry, and tokens signed with the peer's keys (`peer_material`, `peer_token`)."""

from __future__ import annotations

import base64
import functools
import json
from datetime import datetime, timedelta, timezone

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
A_UUID = "9d1e5c3a-7b2f-4e6d-8a0c-5f3b1d7e9a2c"
B_UUID = "3f0c2f4e-1d5b-4c9a-9b7e-2a6f0e1c3d4b"


def material():
    from control import connstring, pki
    from control.rules import join as join_rules
    from control.rules import offer as offer_rules

    ca = pki.create_ca("fuzz", now=NOW)
    csr = pki.make_key_and_csr(B_UUID).cert_pem
    inv = connstring.Invitation(cluster_uuid=A_UUID, join_url="https://peering.a.example",
                                entrance_host="peering-gateway.a.example:443", ca_pin=pki.spki_pin(ca.cert_pem),
                                token_id="abc123", token_secret="s3cr3t-s3cr3t-s3cr3t-s3cr3t",
                                expires_at=NOW + timedelta(days=3650))
    offer = offer_rules.build_offer(issuer_url="https://kubernetes.default.svc.cluster.local",
                                    jwks='{"keys": [{"kty": "EC", "crv": "P-256", '
                                         '"x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", '
                                         '"y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}',
                                    projects={"shop": ["shop", "shop-db"]},
                                    capabilities=[{"name": "cm", "version": "v1", "scope": ["project"]}],
                                    peering_version="0.1.0")
    body = join_rules.join_request(inv, cluster_uuid=B_UUID, alias="b", entrance="peering-gateway.b.example:443",
                                   ca_pem=ca.cert_pem, csr_pem=csr, offer=offer)
    return {"ca": ca, "csr": csr, "invitation": inv, "connstring": connstring.encode(inv), "offer": offer,
            "join_body": json.dumps(body).encode(), "offer_message": json.dumps({"alias": "a", "offer": offer}).encode()}


#: The peer's issuer, this cluster, and the time its tokens are checked at (a second count, as `time.time()`).
ISSUER = "https://issuer.peer.fuzz"
CLUSTER = "11111111-1111-4111-8111-111111111111"
PEER_UUID = "22222222-2222-4222-8222-222222222222"
NOW_S = 1_796_000_000.0
SKEW = 30.0
MAX_TOKEN = 16 * 1024


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@functools.lru_cache(maxsize=None)
def peer_material():
    """A peer whose JWKS holds three keys, with fixed private values so that a corpus stays valid from one run to
    the next: `p256` (kid p256, no alg: ES256), `p384` (kid p384, alg ES384 bound in its JWK) and `ed` (kid ed,
    EdDSA); this cluster's registry, where the capabilities `read-pods` (consumer mod/controller) and `write`
    (consumer mod/writer) are effective for the peer and `closed` exists but is not; and `sign`, which signs any
    header and payload bytes as a compact JWS with one of the keys."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from jwcrypto import jwk

    from gateway.registry import LocalCapability, Peer, Registry

    keys = {"p256": ec.derive_private_key(0x5EED_0001 << 200, ec.SECP256R1()),
            "p384": ec.derive_private_key(0x5EED_0002 << 300, ec.SECP384R1()),
            "ed": ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))}
    jwks = []
    for kid, key in keys.items():
        public = jwk.JWK.from_pyca(key.public_key()).export_public(as_dict=True)
        jwks.append({**public, "kid": kid, **({"alg": "ES384"} if kid == "p384" else {})})
    peer = Peer(name="peer-a", uuid=PEER_UUID, fingerprints=frozenset({"f" * 64}), issuer_url=ISSUER,
                jwks_json=json.dumps({"keys": jwks}), effective=frozenset({"read-pods", "write"}),
                connector_id="peering-peer-a", entrance="peering-gateway.a.fuzz:443", peer_ca_pem=b"ca",
                client_cert_pem=b"cert", client_key_pem=b"key", opened=frozenset({"read-pods", "write", "closed"}))
    caps = {"read-pods": LocalCapability("read-pods", "v1", frozenset({("mod", "controller")}), True),
            "write": LocalCapability("write", "v1", frozenset({("mod", "writer")}), True),
            "closed": LocalCapability("closed", "v1", frozenset({("mod", "controller")}), True)}
    registry = Registry(cluster_uuid=CLUSTER, peers={peer.name: peer}, by_fingerprint={"f" * 64: peer},
                        capabilities=caps, generation=1)
    return {"keys": keys, "peer": peer, "registry": registry}


def sign(header: bytes, payload: bytes, kid: str = "p256") -> str:
    """A compact JWS of `header` and `payload` (any bytes), signed with the key `kid` of `peer_material` in its own
    algorithm, whatever the header says."""
    return sign_with(peer_material()["keys"][kid], header, payload)


def sign_with(key, header: bytes, payload: bytes) -> str:
    """A compact JWS of `header` and `payload` signed with `key`: an EC key in ECDSA with the hash of its size, an
    Ed25519 key in EdDSA, an RSA key in RS256, bytes in HS256 (as a secret)."""
    import hashlib
    import hmac

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, utils

    signing_input = f"{b64url(header)}.{b64url(payload)}".encode()
    if isinstance(key, bytes):
        signature = hmac.new(key, signing_input, hashlib.sha256).digest()
    elif isinstance(key, ed25519.Ed25519PrivateKey):
        signature = key.sign(signing_input)
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        size = (key.curve.key_size + 7) // 8
        digest = hashes.SHA256() if size == 32 else hashes.SHA384() if size == 48 else hashes.SHA512()
        r, s = utils.decode_dss_signature(key.sign(signing_input, ec.ECDSA(digest)))
        signature = r.to_bytes(size, "big") + s.to_bytes(size, "big")
    else:
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input.decode()}.{b64url(signature)}"


ALGS = {"p256": "ES256", "p384": "ES384", "ed": "EdDSA"}


def peer_claims(**overrides) -> dict:
    """Claims of a token that verifies: the peer's issuer, mod/controller, the audience of `read-pods` here."""
    claims = {"iss": ISSUER, "sub": "system:serviceaccount:mod:controller",
              "aud": [f"peering.deckhouse.io/{CLUSTER}/read-pods"], "exp": int(NOW_S) + 600, "nbf": int(NOW_S) - 5,
              "iat": int(NOW_S) - 5, "kubernetes.io": {"namespace": "mod", "serviceaccount": {"name": "controller"}}}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not ...}


def peer_token(kid: str = "p256", **overrides) -> str:
    """A token of the peer that verifies (`peer_claims` with `overrides`; a value of ... drops the claim)."""
    header = json.dumps({"alg": ALGS[kid], "kid": kid}).encode()
    return sign(header, json.dumps(peer_claims(**overrides)).encode(), kid)


#: The capabilities each ServiceAccount of the peer consumes here that are effective for it (`closed` is not).
CONSUMES = {"system:serviceaccount:mod:controller": frozenset({"read-pods"}),
            "system:serviceaccount:mod:writer": frozenset({"write"})}


def granted(claims: object) -> frozenset[str]:
    """What the token rules (DESIGN.md 7, step 2) grant a token of the peer with these claims, signed by the key
    its kid names in that key's algorithm: the peer's issuer, an expiry still ahead (no allowance), any nbf that
    holds with the skew, and the effective capabilities its audiences name that its subject consumes. Empty: refused."""
    from gateway.tokens import numeric_date

    if not isinstance(claims, dict) or claims.get("iss") != ISSUER:
        return frozenset()
    exp, nbf = numeric_date(claims.get("exp")), claims.get("nbf")
    if exp is None or exp <= NOW_S:
        return frozenset()
    if nbf is not None and ((not_before := numeric_date(nbf)) is None or not_before - SKEW > NOW_S):
        return frozenset()
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []
    prefix = f"peering.deckhouse.io/{CLUSTER}/"
    sub = claims.get("sub")
    return frozenset(a[len(prefix):] for a in auds if a.startswith(prefix)) & CONSUMES.get(sub, frozenset()) \
        if isinstance(sub, str) else frozenset()
