"""The authentication.k8s.io and authorization.k8s.io endpoints: TokenRequest, TokenReview and the access reviews.

Each handler takes the request's context (who calls, the namespace and name in the URL, and the auth objects) and
the decoded body, and returns the answer object; bad input raises ApiError with kube-apiserver's code and words.
The core has already authorized the call itself (e.g. `create serviceaccounts/token`, `create tokenreviews`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Protocol

from lab.apiserver.auth.authn import Authenticator
from lab.apiserver.auth.rbac import MASTERS, Authorizer
from lab.apiserver.auth.tokens import BOUND_KINDS, ServiceAccountIssuer
from lab.apiserver.auth.types import Attributes, ListObjects, UserInfo
from lab.apiserver.errors import bad_request, conflict, invalid, not_found

AUTHENTICATION = "authentication.k8s.io"
AUTHORIZATION = "authorization.k8s.io"
MIN_EXPIRATION_SECONDS = 600
DEFAULT_EXPIRATION_SECONDS = 3600
MAX_EXPIRATION_SECONDS = 1 << 32


class ReviewContext(Protocol):
    """What the core hands each handler."""

    user: UserInfo
    namespace: str | None
    name: str | None
    authorizer: Authorizer
    authenticator: Authenticator
    sa_issuer: ServiceAccountIssuer
    list_objects: ListObjects


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_body(body: Any, kind: str, group: str) -> dict:
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a {kind} object of {group}/v1")
    if body.get("kind") not in (None, kind):
        raise bad_request(f"the body is a {body.get('kind')!r}, this endpoint takes a {kind} of {group}/v1")
    if body.get("apiVersion") not in (None, f"{group}/v1"):
        raise bad_request(f"the body's apiVersion is {body.get('apiVersion')!r}, this endpoint takes {group}/v1")
    spec = body.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise bad_request(f"spec of a {kind} must be an object")
    return spec


def _string_list(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"{field} must be an array of strings")
    return list(value)


def _answer(kind: str, group: str, spec: dict, status: dict, metadata: dict | None = None) -> dict:
    # Reviews are never stored: their metadata is empty (kube-apiserver leaves even creationTimestamp out).
    meta = dict(metadata or {})
    return {"kind": kind, "apiVersion": f"{group}/v1", "metadata": meta, "spec": spec, "status": status}


def _user_info(user: UserInfo) -> dict:
    # The wire form of authentication/v1 UserInfo: empty uid and extra are left out, as kube-apiserver does.
    out: dict = {"username": user.username, "groups": list(user.groups)}
    if user.uid:
        out["uid"] = user.uid
    if user.extra:
        out["extra"] = {k: list(v) for k, v in user.extra.items()}
    return out


def _find(objects, name: str) -> dict | None:
    return next((o for o in objects if (o.get("metadata") or {}).get("name") == name), None)


# --- authentication.k8s.io ---------------------------------------------------------------------------------------

async def token_request(ctx: ReviewContext, body: dict) -> dict:
    """POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token: a bound token for that ServiceAccount."""
    spec = _check_body(body, "TokenRequest", AUTHENTICATION)
    namespace, name = ctx.namespace or "", ctx.name or ""
    audiences = _string_list(spec.get("audiences"), "spec.audiences") or ctx.sa_issuer.api_audiences
    seconds = spec.get("expirationSeconds", DEFAULT_EXPIRATION_SECONDS)
    if seconds is None:
        seconds = DEFAULT_EXPIRATION_SECONDS
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise bad_request("spec.expirationSeconds must be an integer number of seconds")
    if seconds < MIN_EXPIRATION_SECONDS:
        raise invalid("TokenRequest", AUTHENTICATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec.expirationSeconds",
            "message": f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"}])
    if seconds > MAX_EXPIRATION_SECONDS:
        raise invalid("TokenRequest", AUTHENTICATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec.expirationSeconds",
            "message": f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"}])

    sa = _find(ctx.list_objects("", "serviceaccounts", namespace), name)
    if sa is None:
        raise not_found("", "serviceaccounts", name)
    sa_meta = sa.get("metadata") or {}
    sa_uid = sa_meta.get("uid", "")

    ref = spec.get("boundObjectRef")
    bound = None
    if ref is not None:
        bound = _bound_object(ctx, ref, namespace, name)

    token, expires_at = ctx.sa_issuer.issue(namespace, name, sa_uid, audiences, seconds, bound)
    answer_spec = {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": ref}
    # The answer's metadata is the ServiceAccount's name, namespace, uid and creation time.
    return _answer("TokenRequest", AUTHENTICATION, answer_spec,
                   {"token": token, "expirationTimestamp": _rfc3339(expires_at)},
                   {"name": name, "namespace": namespace, "uid": sa_uid,
                    "creationTimestamp": sa_meta.get("creationTimestamp")})


def _bound_object(ctx: ReviewContext, ref: Any, namespace: str, sa_name: str) -> dict:
    if not isinstance(ref, dict):
        raise bad_request("spec.boundObjectRef must be an object with kind, apiVersion, name and uid")
    kind, api_version = ref.get("kind", ""), ref.get("apiVersion", "")
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    if kind not in BOUND_KINDS or group != "":
        shown = f"{group}/{kind}" if group else kind
        raise bad_request(f"cannot bind token to object of type {shown or 'unspecified'}: "
                          f"use {', '.join(BOUND_KINDS)} of apiVersion v1")
    ref_name = ref.get("name") or ""
    if not ref_name:
        raise invalid("TokenRequest", AUTHENTICATION, sa_name, [{
            "reason": "FieldValueRequired", "field": "spec.boundObjectRef.name", "message": "Required value"}])
    plural = kind.lower() + "s"
    found = _find(ctx.list_objects("", plural, None if kind == "Node" else namespace), ref_name)
    if found is None:
        raise not_found("", plural, ref_name)
    if kind == "Pod":
        pod_sa = (found.get("spec") or {}).get("serviceAccountName") or "default"
        if pod_sa != sa_name:
            raise bad_request(f'cannot bind token for serviceaccount "{sa_name}" to pod running with different '
                              "serviceaccount name.")
    uid = (found.get("metadata") or {}).get("uid", "")
    if ref.get("uid") and ref["uid"] != uid:
        raise conflict("", kind, ref_name, f"the UID in the bound object reference ({ref['uid']}) does not match "
                                           "the UID in record. The object might have been deleted and then recreated")
    return {"kind": kind, "name": ref_name, "uid": uid}


async def token_review(ctx: ReviewContext, body: dict) -> dict:
    """TokenReview: who a token belongs to, for the audiences asked (status.audiences: those the token has too)."""
    spec = _check_body(body, "TokenReview", AUTHENTICATION)
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise bad_request("token is required for TokenReview in authentication")
    audiences = _string_list(spec.get("audiences"), "spec.audiences")
    result = await ctx.authenticator.authenticate_token(token, audiences or None)
    if result.user is None:
        # authenticated: false is left out of the wire form (omitempty), as kube-apiserver sends it.
        status: dict = {"user": {}, "error": result.error}
    else:
        status = {"authenticated": True, "user": _user_info(result.user), "audiences": list(result.audiences)}
    return _answer("TokenReview", AUTHENTICATION, dict(spec), status)


async def self_subject_review(ctx: ReviewContext, body: dict) -> dict:
    """SelfSubjectReview (kubectl auth whoami): the caller as the API server sees it."""
    _check_body(body, "SelfSubjectReview", AUTHENTICATION)
    return {"kind": "SelfSubjectReview", "apiVersion": f"{AUTHENTICATION}/v1",
            "metadata": {"creationTimestamp": _rfc3339(datetime.now(timezone.utc))},
            "status": {"userInfo": _user_info(ctx.user)}}


# --- authorization.k8s.io ----------------------------------------------------------------------------------------

def _go_struct(value: Any, fields: tuple[str, ...]) -> str:
    """An internal Go struct as field.Invalid prints it: JSON with the Go field names."""
    value = value if isinstance(value, dict) else {}
    return json.dumps({f[0].upper() + f[1:]: value.get(f, "") for f in fields}, separators=(",", ":"))


def _attributes(kind: str, spec: dict, *, local_namespace: str | None = None) -> Attributes:
    # kube-apiserver validates the reviews' internal types, which name no kind: its messages begin
    # `.authorization.k8s.io "" is invalid`, and the details have no kind.
    kind = ""
    res, non_res = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if res is not None and non_res is not None:
        raise invalid(kind, AUTHORIZATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec",
            "message": f"Invalid value: {_go_struct(non_res, ('path', 'verb'))}: exactly one of "
                       "nonResourceAttributes or resourceAttributes must be specified"}])
    if res is None and non_res is None:
        raise invalid(kind, AUTHORIZATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec",
            "message": "Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be "
                       "specified"}])
    if local_namespace is not None and non_res is not None:
        raise invalid(kind, AUTHORIZATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec.nonResourceAttributes",
            "message": "Invalid value: disallowed on this kind of request"}])
    attrs = res if res is not None else non_res
    if not isinstance(attrs, dict) or not all(isinstance(v, str) for v in attrs.values()
                                              if not isinstance(v, dict)):
        raise bad_request("resourceAttributes and nonResourceAttributes must be objects of strings")
    if res is not None:
        namespace = res.get("namespace", "")
        if local_namespace is not None and namespace != local_namespace:
            raise invalid(kind, AUTHORIZATION, "", [{
                "reason": "FieldValueInvalid", "field": "spec.resourceAttributes.namespace",
                "message": f"Invalid value: {namespace!r}: must match metadata.namespace"}])
        return Attributes(verb=res.get("verb", ""), resource_request=True, api_group=res.get("group", ""),
                          resource=res.get("resource", ""), subresource=res.get("subresource", ""),
                          namespace=namespace, name=res.get("name", ""))
    return Attributes(verb=non_res.get("verb", ""), resource_request=False, path=non_res.get("path", ""))


def _access_status(ctx: ReviewContext, user: UserInfo, attrs: Attributes) -> dict:
    decision = ctx.authorizer.authorize(user, attrs)
    status: dict = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    return status


def _spec_user(kind: str, spec: dict) -> UserInfo:
    username = spec.get("user") or ""
    if not isinstance(username, str):
        raise bad_request("spec.user must be a string")
    groups = _string_list(spec.get("groups"), "spec.groups")
    if not username and not groups:
        raise invalid("", AUTHORIZATION, "", [{
            "reason": "FieldValueInvalid", "field": "spec.user",
            "message": 'Invalid value: "": at least one of user or group must be specified'}])
    extra_raw = spec.get("extra") or {}
    if not isinstance(extra_raw, dict):
        raise bad_request("spec.extra must be a map of string arrays")
    extra = {k: tuple(_string_list(v, f"spec.extra[{k}]")) for k, v in extra_raw.items()}
    uid = spec.get("uid") or ""
    # Exactly the user described: a review names groups itself, nothing is added (not even system:authenticated).
    return UserInfo(username=username, groups=tuple(groups), uid=uid if isinstance(uid, str) else "", extra=extra)


async def subject_access_review(ctx: ReviewContext, body: dict) -> dict:
    """SubjectAccessReview: may the described user do this? (what webhooks and proxies ask)."""
    spec = _check_body(body, "SubjectAccessReview", AUTHORIZATION)
    attrs = _attributes("SubjectAccessReview", spec)
    user = _spec_user("SubjectAccessReview", spec)
    return _answer("SubjectAccessReview", AUTHORIZATION, dict(spec), _access_status(ctx, user, attrs))


async def local_subject_access_review(ctx: ReviewContext, body: dict) -> dict:
    """LocalSubjectAccessReview: a SubjectAccessReview confined to the namespace of its URL."""
    spec = _check_body(body, "LocalSubjectAccessReview", AUTHORIZATION)
    attrs = _attributes("LocalSubjectAccessReview", spec, local_namespace=ctx.namespace or "")
    user = _spec_user("LocalSubjectAccessReview", spec)
    return _answer("LocalSubjectAccessReview", AUTHORIZATION, dict(spec), _access_status(ctx, user, attrs),
                   {"namespace": ctx.namespace or ""})


async def self_subject_access_review(ctx: ReviewContext, body: dict) -> dict:
    """SelfSubjectAccessReview (kubectl auth can-i): may the caller do this?"""
    spec = _check_body(body, "SelfSubjectAccessReview", AUTHORIZATION)
    attrs = _attributes("SelfSubjectAccessReview", spec)
    return _answer("SelfSubjectAccessReview", AUTHORIZATION, dict(spec), _access_status(ctx, ctx.user, attrs))


async def self_subject_rules_review(ctx: ReviewContext, body: dict) -> dict:
    """SelfSubjectRulesReview (kubectl auth can-i --list): every rule the caller holds in a namespace."""
    spec = _check_body(body, "SelfSubjectRulesReview", AUTHORIZATION)
    namespace = spec.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise bad_request("no namespace on request")
    rules, incomplete = ctx.authorizer.rules_for(ctx.user, namespace)
    resource_rules: list[dict] = []
    non_resource_rules: list[dict] = []
    if MASTERS in ctx.user.groups:
        # The privileged group is not an RBAC grant; kube-apiserver lists what it allows the same way.
        resource_rules.append({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
        non_resource_rules.append({"verbs": ["*"], "nonResourceURLs": ["*"]})
    for rule in rules:
        if rule.get("resources"):
            out = {"verbs": list(rule.get("verbs") or []), "apiGroups": list(rule.get("apiGroups") or []),
                   "resources": list(rule["resources"])}
            if rule.get("resourceNames"):
                out["resourceNames"] = list(rule["resourceNames"])
            resource_rules.append(out)
        if rule.get("nonResourceURLs"):
            non_resource_rules.append({"verbs": list(rule.get("verbs") or []),
                                       "nonResourceURLs": list(rule["nonResourceURLs"])})
    status: dict = {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                    "incomplete": incomplete}
    if incomplete:
        status["evaluationError"] = "some bindings of the user name roles that do not exist"
    # kube-apiserver answers with the status alone: the spec comes back empty.
    return _answer("SelfSubjectRulesReview", AUTHORIZATION, {}, status)

