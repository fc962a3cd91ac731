"""Request authentication: client certificates, ServiceAccount tokens (revoked by deletion) and OIDC tokens."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from jwcrypto import jwk, jws

from lab.apiserver.auth.authn import ANONYMOUS, Authenticator, bearer_token
from lab.apiserver.auth.oidc import OIDCAuthenticator
from lab.apiserver.auth.tokens import ServiceAccountIssuer
from lab.apiserver.auth.types import UserInfo

ISSUER = "https://api.a.lab:6443"
DEX = "https://dex.a.lab"
NOW = datetime.now(timezone.utc)


def _name(cn: str | None = None, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    if cn is not None:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - timedelta(days=1)).not_valid_after(NOW + timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca, cn: str | None, orgs=(), *, eku=ExtendedKeyUsageOID.CLIENT_AUTH, days=(-1, 1), issuer_name=None):
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs))
               .issuer_name(issuer_name or ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(NOW + timedelta(days=days[0])).not_valid_after(NOW + timedelta(days=days[1])))
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def client_ca():
    return _ca("lab client CA")


@pytest.fixture(scope="module")
def sa_issuer() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(ISSUER)


class Store:
    """Stored objects by (group, plural): what the core's list_objects reads."""

    def __init__(self) -> None:
        self.objects: list[tuple[str, str, dict]] = []

    def add(self, plural: str, name: str, uid: str, namespace: str | None = None, **meta) -> None:
        md = {"name": name, "uid": uid, **meta}
        if namespace:
            md["namespace"] = namespace
        self.objects.append(("", plural, {"metadata": md}))

    def remove(self, plural: str, name: str) -> None:
        self.objects = [o for o in self.objects if not (o[1] == plural and o[2]["metadata"]["name"] == name)]

    def list_objects(self, group: str, plural: str, namespace: str | None):
        return [o for g, p, o in self.objects
                if g == group and p == plural and (namespace is None or o["metadata"].get("namespace") == namespace)]


@pytest.fixture
def store() -> Store:
    s = Store()
    s.add("serviceaccounts", "peering", "sa-uid", "d8-peering")
    s.add("pods", "peering-0", "pod-uid", "d8-peering")
    return s


@pytest.fixture
def authn(client_ca, sa_issuer, store) -> Authenticator:
    pem = client_ca[0].public_bytes(serialization.Encoding.PEM)
    return Authenticator(pem, sa_issuer, [], store.list_objects)


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


# --- certificates ------------------------------------------------------------------------------------------------

async def test_client_certificate_cn_and_orgs(authn, client_ca):
    der = _leaf(client_ca, "kubernetes-admin", ("system:masters", "ops"))
    assert await authn.authenticate({}, der) == UserInfo(
        "kubernetes-admin", ("system:masters", "ops", "system:authenticated"),
        extra={"authentication.kubernetes.io/credential-id": (f"X509SHA256={hashlib.sha256(der).hexdigest()}",)})


@pytest.mark.parametrize("case", ["other-ca", "forged-issuer-name", "expired", "not-yet", "server-only", "no-cn"])
async def test_bad_client_certificates_are_refused(authn, client_ca, case):
    other = _ca("someone else")
    der = {
        "other-ca": lambda: _leaf(other, "admin", ("system:masters",)),
        # Claims our CA's name but is signed by another key: the signature check catches it.
        "forged-issuer-name": lambda: _leaf(other, "admin", ("system:masters",), issuer_name=client_ca[0].subject),
        "expired": lambda: _leaf(client_ca, "admin", days=(-3, -1)),
        "not-yet": lambda: _leaf(client_ca, "admin", days=(1, 3)),
        "server-only": lambda: _leaf(client_ca, "admin", eku=ExtendedKeyUsageOID.SERVER_AUTH),
        "no-cn": lambda: _leaf(client_ca, None, ("system:masters",)),
    }[case]()
    assert await authn.authenticate({}, der) is None


async def test_certificate_without_eku_and_garbage(authn, client_ca):
    assert (await authn.authenticate({}, _leaf(client_ca, "u", eku=None))).username == "u"
    assert await authn.authenticate({}, b"not a certificate") is None


async def test_a_refused_certificate_falls_back_to_the_token(authn, sa_issuer):
    token, _ = sa_issuer.issue("d8-peering", "peering", "sa-uid", [], 600)
    other = _ca("someone else")
    user = await authn.authenticate(_bearer(token), _leaf(other, "admin", ("system:masters",)))
    assert user.username == "system:serviceaccount:d8-peering:peering"


# --- ServiceAccount tokens ---------------------------------------------------------------------------------------

async def test_service_account_token(authn, sa_issuer):
    token, _ = sa_issuer.issue("d8-peering", "peering", "sa-uid", [], 600,
                               bound_object={"kind": "Pod", "name": "peering-0", "uid": "pod-uid"})
    user = await authn.authenticate(_bearer(token), None)
    assert user.username == "system:serviceaccount:d8-peering:peering"
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:d8-peering", "system:authenticated")
    assert user.uid == "sa-uid"
    assert user.extra["authentication.kubernetes.io/pod-name"] == ("peering-0",)
    assert user.extra["authentication.kubernetes.io/pod-uid"] == ("pod-uid",)
    assert user.extra["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")


async def test_deleted_or_recreated_service_account_revokes_its_tokens(authn, sa_issuer, store):
    token, _ = sa_issuer.issue("d8-peering", "peering", "sa-uid", [], 600)
    assert await authn.authenticate(_bearer(token), None)
    store.remove("serviceaccounts", "peering")
    result = await authn.authenticate_token(token)
    assert result.user is None and "service account d8-peering/peering has been deleted" in result.error
    store.add("serviceaccounts", "peering", "new-uid", "d8-peering")
    result = await authn.authenticate_token(token)
    assert result.user is None and "does not match claim" in result.error
    # Being deleted counts as deleted.
    store.remove("serviceaccounts", "peering")
    store.add("serviceaccounts", "peering", "sa-uid", "d8-peering", deletionTimestamp="2026-01-01T00:00:00Z")
    assert await authn.authenticate(_bearer(token), None) is None


async def test_deleted_bound_pod_revokes_the_token(authn, sa_issuer, store):
    token, _ = sa_issuer.issue("d8-peering", "peering", "sa-uid", [], 600,
                               bound_object={"kind": "Pod", "name": "peering-0", "uid": "pod-uid"})
    store.remove("pods", "peering-0")
    result = await authn.authenticate_token(token)
    assert result.user is None and "pod d8-peering/peering-0 has been deleted" in result.error


async def test_service_account_in_another_namespace_does_not_match(authn, sa_issuer):
    token, _ = sa_issuer.issue("other", "peering", "sa-uid", [], 600)
    assert await authn.authenticate(_bearer(token), None) is None


async def test_token_for_another_audience_does_not_authenticate_to_the_api(authn, sa_issuer):
    token, _ = sa_issuer.issue("d8-peering", "peering", "sa-uid", ["peering.deckhouse.io/U/C"], 600)
    assert await authn.authenticate(_bearer(token), None) is None
    result = await authn.authenticate_token(token, ["peering.deckhouse.io/U/C", "x"])
    assert result.user is not None and result.audiences == ("peering.deckhouse.io/U/C",)
    refused = await authn.authenticate_token(token, ["x"])
    assert refused.user is None and "invalid for the target audiences" in refused.error
    assert token not in refused.error


async def test_token_of_another_cluster_is_refused(authn, store):
    foreign = ServiceAccountIssuer("https://api.b.lab:6443")
    token, _ = foreign.issue("d8-peering", "peering", "sa-uid", [ISSUER], 600)
    result = await authn.authenticate_token(token)
    # No authenticator takes a token of an issuer nobody trusts: kube-apiserver's generic error alone.
    assert result.user is None and result.error == "invalid bearer token"


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": ""}, {"Authorization": "Bearer"}, {"Authorization": "Bearer "},
    {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer not-a-jwt"},
])
async def test_no_usable_credentials_is_none(authn, headers):
    assert await authn.authenticate(headers, None) is None


def test_bearer_header_parsing():
    assert bearer_token({"authorization": "bearer abc"}) == "abc"
    assert bearer_token({"AUTHORIZATION": "Bearer abc extra"}) == "abc"
    assert bearer_token({"Authorization": "Token abc"}) is None
    assert ANONYMOUS == UserInfo("system:anonymous", ("system:unauthenticated",))


# --- OIDC ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dex_key() -> jwk.JWK:
    return jwk.JWK.generate(kty="RSA", size=2048, kid="dex-1")


def _id_token(key: jwk.JWK, **overrides) -> str:
    now = int(NOW.timestamp())
    claims = {"iss": DEX, "aud": "kubernetes", "sub": "x", "email": "jane@example.com", "email_verified": True,
              "groups": ["admins"], "iat": now, "exp": now + 600, **overrides}
    token = jws.JWS(json.dumps(claims).encode())
    token.add_signature(key, alg="RS256", protected=json.dumps({"alg": "RS256", "kid": "dex-1"}))
    return token.serialize(compact=True)


async def test_oidc_added_at_run_time(authn, dex_key):
    token = _id_token(dex_key)
    assert await authn.authenticate(_bearer(token), None) is None

    async def fetch():
        return {"keys": [dex_key.export_public(as_dict=True)]}

    # The token's times are the module's NOW: judged by that clock, however long after collection this runs.
    authn.add_oidc(OIDCAuthenticator(DEX, ["kubernetes"], jwks_fetcher=fetch, clock=lambda: NOW))
    assert await authn.authenticate(_bearer(token), None) == UserInfo(
        "jane@example.com", ("admins", "system:authenticated"))
    # Through TokenReview: valid only for the API audiences, which it reports.
    assert (await authn.authenticate_token(token)).audiences == (ISSUER,)
    other_audience = await authn.authenticate_token(token, ["peering.deckhouse.io/U/C"])
    assert other_audience.user is None and "API audiences" in other_audience.error
    bad = await authn.authenticate_token(_id_token(dex_key, aud="other"))
    assert bad.user is None and "expected audience" in bad.error
