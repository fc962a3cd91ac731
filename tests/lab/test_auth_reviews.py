"""TokenRequest, TokenReview and the access reviews, called as the core calls them: a context and a body."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

from lab.apiserver.auth.authn import Authenticator
from lab.apiserver.auth.bootstrap import bootstrap_objects
from lab.apiserver.auth.rbac import Authorizer
from lab.apiserver.auth.reviews import (
    local_subject_access_review,
    self_subject_access_review,
    self_subject_review,
    self_subject_rules_review,
    subject_access_review,
    token_request,
    token_review,
)
from lab.apiserver.auth.tokens import ServiceAccountIssuer, unverified_claims
from lab.apiserver.auth.types import UserInfo
from lab.apiserver.errors import ApiError

ISSUER = "https://api.a.lab:6443"
RBAC = "rbac.authorization.k8s.io"
AUD = "peering.deckhouse.io/6f1c/metrics"


class Store:
    def __init__(self, objects: list[dict]) -> None:
        self.objects = objects

    def list_objects(self, group: str, plural: str, namespace: str | None):
        for obj in self.objects:
            api_group = obj["apiVersion"].rpartition("/")[0]
            if api_group == group and obj["kind"].lower() + "s" == plural and (
                    namespace is None or obj["metadata"].get("namespace") == namespace):
                yield obj


def _obj(api_version: str, kind: str, name: str, namespace: str | None = None, uid: str = "", **rest) -> dict:
    meta = {"name": name, "uid": uid or f"{kind.lower()}-{name}-uid"}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **rest}


@dataclass
class Ctx:
    user: UserInfo
    authorizer: Authorizer
    authenticator: Authenticator
    sa_issuer: ServiceAccountIssuer
    list_objects: object
    namespace: str | None = None
    name: str | None = None
    store: Store = field(default=None)


@pytest.fixture(scope="module")
def sa_issuer() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(ISSUER)


@pytest.fixture
def ctx(sa_issuer) -> Ctx:
    store = Store(bootstrap_objects() + [
        _obj("v1", "ServiceAccount", "ctl", "d8-x", uid="sa-uid"),
        _obj("v1", "Pod", "ctl-0", "d8-x", uid="pod-uid", spec={"serviceAccountName": "ctl"}),
        _obj("v1", "Pod", "other-0", "d8-x", spec={}),
        _obj("v1", "Secret", "s", "d8-x", uid="secret-uid"),
        _obj(f"{RBAC}/v1", "ClusterRole", "cm-reader",
             rules=[{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["configmaps"]},
                    {"verbs": ["get"], "nonResourceURLs": ["/metrics"]}]),
        _obj(f"{RBAC}/v1", "RoleBinding", "jane-cm", "ns-1",
             roleRef={"apiGroup": RBAC, "kind": "ClusterRole", "name": "cm-reader"},
             subjects=[{"kind": "User", "apiGroup": RBAC, "name": "jane@example.com"}]),
        _obj(f"{RBAC}/v1", "RoleBinding", "broken", "ns-1",
             roleRef={"apiGroup": RBAC, "kind": "Role", "name": "missing"},
             subjects=[{"kind": "User", "apiGroup": RBAC, "name": "jane@example.com"}]),
    ])
    authenticator = Authenticator(b"", sa_issuer, [], store.list_objects)
    return Ctx(user=UserInfo("jane@example.com", ("devs", "system:authenticated")),
               authorizer=Authorizer(store.list_objects), authenticator=authenticator, sa_issuer=sa_issuer,
               list_objects=store.list_objects, namespace="d8-x", name="ctl", store=store)


def _tr(**spec) -> dict:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


# --- TokenRequest --------------------------------------------------------------------------------------------------

async def test_token_request_defaults(ctx):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    answer = await token_request(ctx, _tr())
    assert answer["kind"] == "TokenRequest" and answer["metadata"]["name"] == "ctl"
    assert answer["spec"] == {"audiences": [ISSUER], "expirationSeconds": 3600, "boundObjectRef": None}
    claims = unverified_claims(answer["status"]["token"])
    assert claims["aud"] == [ISSUER] and claims["sub"] == "system:serviceaccount:d8-x:ctl"
    assert claims["kubernetes.io"]["serviceaccount"] == {"name": "ctl", "uid": "sa-uid"}
    expires = datetime.strptime(answer["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc)
    assert before + timedelta(seconds=3600) <= expires <= before + timedelta(seconds=3630)
    assert claims["exp"] == int(expires.timestamp())
    # The issued token authenticates to the API.
    assert (await ctx.authenticator.authenticate_token(answer["status"]["token"])).user.uid == "sa-uid"


async def test_token_request_audiences_expiry_and_pod_binding(ctx):
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "ctl-0", "uid": "pod-uid"}
    answer = await token_request(ctx, _tr(audiences=[AUD], expirationSeconds=600, boundObjectRef=ref))
    claims = unverified_claims(answer["status"]["token"])
    assert claims["aud"] == [AUD] and claims["exp"] - claims["iat"] == 600
    assert claims["kubernetes.io"]["pod"] == {"name": "ctl-0", "uid": "pod-uid"}
    assert answer["spec"]["boundObjectRef"] == ref
    # Binding without a uid takes the stored one; a Secret works too.
    answer = await token_request(ctx, _tr(boundObjectRef={"kind": "Secret", "apiVersion": "v1", "name": "s"}))
    assert unverified_claims(answer["status"]["token"])["kubernetes.io"]["secret"] == {"name": "s",
                                                                                       "uid": "secret-uid"}


@pytest.mark.parametrize("seconds,code,words", [
    (599, 422, "may not specify a duration less than 10 minutes"),
    (0, 422, "less than 10 minutes"),
    (-5, 422, "less than 10 minutes"),
    ((1 << 32) + 1, 422, "larger than 2^32 seconds"),
    ("3600", 400, "integer"),
    (True, 400, "integer"),
])
async def test_token_request_expiration_bounds(ctx, seconds, code, words):
    with pytest.raises(ApiError) as err:
        await token_request(ctx, _tr(expirationSeconds=seconds))
    assert err.value.code == code and words in err.value.message
    if code == 422:
        assert err.value.reason == "Invalid" and "spec.expirationSeconds" in err.value.message


async def test_token_request_bounds_are_inclusive(ctx):
    for seconds in (600, 1 << 32):
        assert (await token_request(ctx, _tr(expirationSeconds=seconds)))["spec"]["expirationSeconds"] == seconds


@pytest.mark.parametrize("ref,code,words", [
    ({"kind": "ConfigMap", "apiVersion": "v1", "name": "x"}, 400, "cannot bind token to object of type ConfigMap"),
    ({"kind": "Pod", "apiVersion": "apps/v1", "name": "x"}, 400, "apps/Pod"),
    ({"kind": "Pod", "apiVersion": "v1", "name": "gone"}, 404, 'pods "gone" not found'),
    ({"kind": "Pod", "apiVersion": "v1", "name": "other-0"}, 400, "different serviceaccount name"),
    ({"kind": "Pod", "apiVersion": "v1", "name": "ctl-0", "uid": "old"}, 409, "does not match the UID in record"),
    ({"kind": "Pod", "apiVersion": "v1"}, 422, "spec.boundObjectRef.name"),
    ("Pod/ctl-0", 400, "boundObjectRef must be an object"),
])
async def test_token_request_bad_bound_objects(ctx, ref, code, words):
    with pytest.raises(ApiError) as err:
        await token_request(ctx, _tr(boundObjectRef=ref))
    assert err.value.code == code and words in err.value.message


async def test_token_request_for_a_missing_service_account(ctx):
    ctx.name = "nobody"
    with pytest.raises(ApiError) as err:
        await token_request(ctx, _tr())
    assert err.value.code == 404 and err.value.message == 'serviceaccounts "nobody" not found'


@pytest.mark.parametrize("body,words", [
    ([], "must be a TokenRequest"),
    ({"kind": "TokenReview"}, "takes a TokenRequest"),
    ({"apiVersion": "authentication.k8s.io/v1beta1", "kind": "TokenRequest"}, "apiVersion"),
    ({"spec": []}, "spec of a TokenRequest must be an object"),
    ({"spec": {"audiences": "one"}}, "spec.audiences must be an array of strings"),
])
async def test_token_request_malformed_bodies(ctx, body, words):
    with pytest.raises(ApiError) as err:
        await token_request(ctx, body)
    assert err.value.code == 400 and words in err.value.message


# --- TokenReview -------------------------------------------------------------------------------------------------

def _review(token: str | None, audiences: list[str] | None = None) -> dict:
    spec: dict = {}
    if token is not None:
        spec["token"] = token
    if audiences is not None:
        spec["audiences"] = audiences
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


async def test_token_review_audience_intersection(ctx):
    token = (await token_request(ctx, _tr(audiences=[AUD, "other"])))["status"]["token"]
    answer = await token_review(ctx, _review(token, ["x", AUD, "other"]))
    assert answer["status"]["authenticated"] is True
    # The intersection, in the order the reviewer asked for them.
    assert answer["status"]["audiences"] == [AUD, "other"]
    assert answer["status"]["user"] == {
        "username": "system:serviceaccount:d8-x:ctl", "uid": "sa-uid",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:d8-x", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/credential-id": [
            answer["status"]["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]]},
    }


async def test_token_review_without_common_audience_is_unauthenticated(ctx):
    token = (await token_request(ctx, _tr(audiences=[AUD])))["status"]["token"]
    answer = await token_review(ctx, _review(token, ["peering.deckhouse.io/6f1c/other"]))
    assert "authenticated" not in answer["status"]   # false is left out of the wire form
    assert "invalid for the target audiences" in answer["status"]["error"]
    assert token not in answer["status"]["error"]
    assert "audiences" not in answer["status"]
    # Without spec.audiences the API audiences apply: this token is not for the API either.
    assert "authenticated" not in (await token_review(ctx, _review(token)))["status"]


async def test_token_review_without_audiences_for_an_api_token(ctx):
    token = (await token_request(ctx, _tr()))["status"]["token"]
    answer = await token_review(ctx, _review(token))
    assert answer["status"]["authenticated"] is True and answer["status"]["audiences"] == [ISSUER]


async def test_token_review_of_a_deleted_service_account(ctx):
    token = (await token_request(ctx, _tr(audiences=[AUD])))["status"]["token"]
    ctx.store.objects = [o for o in ctx.store.objects if o["kind"] != "ServiceAccount"]
    answer = await token_review(ctx, _review(token, [AUD]))
    assert answer["status"] == {"user": {},
                                "error": "[invalid bearer token, service account d8-x/ctl has been deleted]"}


async def test_token_review_needs_a_token(ctx):
    for body in (_review(None), _review("")):
        with pytest.raises(ApiError) as err:
            await token_review(ctx, body)
        assert err.value.code == 400 and "token is required" in err.value.message


async def test_token_review_of_garbage(ctx):
    answer = await token_review(ctx, _review("garbage-SECRET"))
    assert "authenticated" not in answer["status"] and "SECRET" not in answer["status"]["error"]


# --- self reviews and access reviews -------------------------------------------------------------------------------

async def test_self_subject_review(ctx):
    answer = await self_subject_review(ctx, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert answer["status"]["userInfo"] == {"username": "jane@example.com", "groups": ["devs", "system:authenticated"]}


def _ssar(**attrs) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": attrs}


async def test_self_subject_access_review(ctx):
    allowed = await self_subject_access_review(ctx, _ssar(resourceAttributes={
        "namespace": "ns-1", "verb": "list", "resource": "configmaps"}))
    assert allowed["status"]["allowed"] is True
    assert "RoleBinding" in allowed["status"]["reason"]
    denied = await self_subject_access_review(ctx, _ssar(resourceAttributes={
        "namespace": "ns-2", "verb": "list", "resource": "configmaps"}))
    assert denied["status"] == {"allowed": False}
    url = await self_subject_access_review(ctx, _ssar(nonResourceAttributes={"path": "/apis", "verb": "get"}))
    assert url["status"]["allowed"] is True
    sensitive = await self_subject_access_review(ctx, _ssar(resourceAttributes={
        "verb": "get", "group": "peering.deckhouse.io", "resource": "clusterpeers", "subresource": "sensitive"}))
    assert sensitive["status"]["allowed"] is False
    assert allowed["spec"]["resourceAttributes"]["resource"] == "configmaps"


@pytest.mark.parametrize("spec,words", [
    ({}, "exactly one of nonResourceAttributes or resourceAttributes"),
    ({"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"verb": "get", "path": "/"}},
     "exactly one of nonResourceAttributes or resourceAttributes"),
])
async def test_self_subject_access_review_needs_exactly_one_kind(ctx, spec, words):
    with pytest.raises(ApiError) as err:
        await self_subject_access_review(ctx, _ssar(**spec))
    assert err.value.code == 422 and words in err.value.message


def _sar(**spec) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


async def test_subject_access_review_evaluates_exactly_the_described_user(ctx):
    attrs = {"namespace": "ns-1", "verb": "get", "resource": "configmaps", "name": "x"}
    assert (await subject_access_review(ctx, _sar(user="jane@example.com", resourceAttributes=attrs)))[
        "status"]["allowed"] is True
    assert (await subject_access_review(ctx, _sar(user="joe", resourceAttributes=attrs)))["status"] == {
        "allowed": False}
    # Groups are taken as given: without system:authenticated, discovery is not granted.
    discovery = {"path": "/apis", "verb": "get"}
    assert (await subject_access_review(ctx, _sar(user="joe", nonResourceAttributes=discovery)))[
        "status"]["allowed"] is False
    assert (await subject_access_review(ctx, _sar(groups=["system:authenticated"],
                                                  nonResourceAttributes=discovery)))["status"]["allowed"] is True
    assert (await subject_access_review(ctx, _sar(groups=["system:masters"], resourceAttributes=attrs)))[
        "status"]["allowed"] is True


async def test_subject_access_review_needs_a_subject(ctx):
    with pytest.raises(ApiError) as err:
        await subject_access_review(ctx, _sar(resourceAttributes={"verb": "get", "resource": "pods"}))
    assert err.value.code == 422 and "at least one of user or group" in err.value.message
    with pytest.raises(ApiError) as err:
        await subject_access_review(ctx, _sar(user="x", groups="g", resourceAttributes={"verb": "get"}))
    assert err.value.code == 400 and "spec.groups" in err.value.message


async def test_local_subject_access_review_is_confined_to_its_namespace(ctx):
    ctx.namespace = "ns-1"
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
            "spec": {"user": "jane@example.com",
                     "resourceAttributes": {"namespace": "ns-1", "verb": "get", "resource": "configmaps"}}}
    answer = await local_subject_access_review(ctx, body)
    assert answer["status"]["allowed"] is True and answer["metadata"]["namespace"] == "ns-1"
    body["spec"]["resourceAttributes"]["namespace"] = "ns-2"
    with pytest.raises(ApiError, match="must match metadata.namespace"):
        await local_subject_access_review(ctx, body)
    body["spec"] = {"user": "x", "nonResourceAttributes": {"path": "/", "verb": "get"}}
    with pytest.raises(ApiError, match="disallowed"):
        await local_subject_access_review(ctx, body)


def _ssrr(namespace: str | None) -> dict:
    spec = {} if namespace is None else {"namespace": namespace}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": spec}


async def test_self_subject_rules_review(ctx):
    answer = await self_subject_rules_review(ctx, _ssrr("ns-1"))
    status = answer["status"]
    assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["configmaps"]} in status["resourceRules"]
    assert {"verbs": ["get"], "nonResourceURLs": ["/metrics"]} in status["nonResourceRules"]
    assert any("/apis/*" in r["nonResourceURLs"] for r in status["nonResourceRules"])
    assert any("selfsubjectaccessreviews" in r["resources"] for r in status["resourceRules"])
    # The binding to a missing Role makes the list incomplete, and says so.
    assert status["incomplete"] is True and "do not exist" in status["evaluationError"]
    elsewhere = (await self_subject_rules_review(ctx, _ssrr("ns-2")))["status"]
    assert not any("configmaps" in r["resources"] for r in elsewhere["resourceRules"])
    assert elsewhere["incomplete"] is False


async def test_self_subject_rules_review_of_masters_and_without_namespace(ctx):
    ctx.user = UserInfo("admin", ("system:masters", "system:authenticated"))
    status = (await self_subject_rules_review(ctx, _ssrr("default")))["status"]
    assert status["resourceRules"][0] == {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
    assert status["nonResourceRules"][0] == {"verbs": ["*"], "nonResourceURLs": ["*"]}
    with pytest.raises(ApiError) as err:
        await self_subject_rules_review(ctx, _ssrr(None))
    assert err.value.code == 400 and "no namespace on request" in err.value.message
