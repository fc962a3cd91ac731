"""`peering check --peer P --consumer NS/SA --capability C [--verb V --resource R --namespace N --name X]`:
a module's access proved end to end, as its controller would use it.

1. A token of the ServiceAccount NS/SA with the capability's audience (from `status.access.audiences` of the
   ClusterPeer), by TokenRequest (10 minutes; the one right this needs beyond the viewer role). It is never shown.
2. One request with it through this cluster's egress (`status.access.endpoint`, trusting `status.access.caBundle`)
   and the peer's entrance to the peer's API server: `list` (the default; with `?limit=1`), `get` (with `--name`)
   and `watch` (its first answer only) are made for real; any other verb is asked as a SelfSubjectAccessReview
   through both gateways, so that nothing is written on the peer. Without `--resource` the request is `GET /api`,
   which proves the token, the exchange and both gateways.
3. The answer: its code, and when refused the Status reason (the gateways' or the peer's RBAC) and the fix.

The egress is an in-cluster Service: from outside the cluster, forward it first
(`d8 k -n d8-peering port-forward svc/peering-gateway 9443:443`) and pass
`--resolve peering-gateway.d8-peering.svc=127.0.0.1:9443`; or run the check in a Pod of the cluster.
"""

from __future__ import annotations

from contract import reasons

import asyncio
import re
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp

from control.check import fixes
from control.check.report import Line, fail, ok
from control.kube import ApiError, KubeSession
from gateway.resolve import OverrideResolver

TOKEN_SECONDS = 600
TIMEOUT = 15.0
READ_VERBS = ("list", "get", "watch")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class ConsumerRequest:
    namespace: str
    service_account: str
    capability: str
    verb: str = "list"
    resource: str | None = None
    target_namespace: str | None = None
    name: str | None = None


def parse(consumer: str, capability: str | None, verb: str | None, resource: str | None, namespace: str | None,
          name: str | None) -> ConsumerRequest:
    """The request from the flags; ValueError saying which flag is wrong and what to give."""
    ns, sep, sa = (consumer or "").partition("/")
    if not sep or not _DNS_LABEL.match(ns) or not _DNS_SUBDOMAIN.match(sa):
        raise ValueError(f"--consumer {consumer!r}: give NAMESPACE/SERVICEACCOUNT of the module's controller, for "
                         "example d8-mirror/mirror-controller")
    if not capability:
        raise ValueError("--consumer needs --capability: the PeeringCapability the controller uses")
    verb = (verb or "list").lower()
    if verb not in VERBS:
        raise ValueError(f"--verb {verb!r}: give one of {', '.join(VERBS)}")
    if verb == "get" and not name:
        raise ValueError("--verb get needs --name: the object to read")
    if (verb != "list" or namespace or name) and not resource:
        raise ValueError(f"--verb {verb}, --namespace and --name need --resource (RESOURCE or RESOURCE.GROUP, as "
                         "kubectl names it, for example configmaps or deployments.apps)")
    for flag, value in (("--namespace", namespace), ("--name", name)):
        if value is not None and not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"{flag} {value!r} is not a Kubernetes name")
    return ConsumerRequest(ns, sa, capability, verb, resource, namespace, name)


def _status(body: Any) -> tuple[str, str]:
    if isinstance(body, dict) and body.get("kind") == "Status":
        return str(body.get("reason") or ""), str(body.get("message") or "")[:400]
    return "", str(body)[:200] if body else ""


class _Egress:
    def __init__(self, endpoint: str, ca_pem: str, overrides: dict[str, str], token: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.resolver = OverrideResolver(overrides)
        context = ssl.create_default_context(cadata=ca_pem)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, resolver=self.resolver),
                                             timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        async with self.session.request(method, self.endpoint + path, json=body, headers=self._headers) as resp:
            if "watch=1" in path:
                return resp.status, None if resp.status == 200 else await _json(resp)
            return resp.status, await _json(resp)

    async def close(self) -> None:
        await self.session.close()
        await self.resolver.close()


async def _json(resp: aiohttp.ClientResponse) -> Any:
    raw = await resp.read()
    try:
        return await resp.json(content_type=None)
    except ValueError:
        return raw[:300].decode(errors="replace")


async def _path(egress: _Egress, req: ConsumerRequest) -> tuple[str, str]:
    """(API path of the resource, group) through the gateways' discovery."""
    resource, _, group = (req.resource or "").partition(".")
    if not group:
        base = "/api/v1"
    else:
        code, body = await egress.call("GET", f"/apis/{urllib.parse.quote(group)}")
        preferred = ((body or {}).get("preferredVersion") or {}).get("groupVersion") if code == 200 else None
        if not preferred:
            raise LookupError(code, body, group)
        base = f"/apis/{preferred}"
    if req.target_namespace:
        base += f"/namespaces/{urllib.parse.quote(req.target_namespace)}"
    return f"{base}/{urllib.parse.quote(resource)}", group


async def consumer_lines(kube: KubeSession, cp: dict, req: ConsumerRequest, overrides: dict[str, str]) -> list[Line]:
    peer = cp["metadata"]["name"]
    access = (cp.get("status") or {}).get("access") or {}
    audience = next((a.get("audience") for a in access.get("audiences") or []
                     if isinstance(a, dict) and a.get("capability") == req.capability), None)
    who = f"{req.namespace}/{req.service_account}"
    if not audience or not access.get("endpoint") or not access.get("caBundle"):
        effective = ", ".join((cp.get("status") or {}).get("effectiveCapabilities") or []) or "none"
        return [fail("consumer", f"{req.capability} is not an effective capability of peering {peer} (effective: "
                                 f"{effective}), so no token can be asked for it", fixes.consumer_fix(
                                     reasons.NO_EFFECTIVE_CAPABILITY), reason=reasons.NO_EFFECTIVE_CAPABILITY, peer=peer)]
    path = f"/api/v1/namespaces/{req.namespace}/serviceaccounts/{req.service_account}/token"
    try:
        answer = await kube.request("POST", path, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [audience], "expirationSeconds": TOKEN_SECONDS}})
    except ApiError as exc:
        if exc.code == 404:
            return [fail("consumer token", f"there is no ServiceAccount {who}", "give the ServiceAccount of the "
                         "module's controller, as spec.consumers of the PeeringCapability names it",
                         reason=reasons.NOT_FOUND, peer=peer)]
        if exc.code in (401, 403):
            return [fail("consumer token", f"this role may not create tokens for {who}", "the check needs `create` "
                         f"on serviceaccounts/token in {req.namespace} (beyond the viewer role) for --consumer",
                         reason="Forbidden", peer=peer)]
        return [fail("consumer token", f"TokenRequest for {who} failed: {exc.code} {exc.reason}",
                     "run the check again", reason=exc.reason, peer=peer)]
    token = (answer.get("status") or {}).get("token")
    if not token:
        return [fail("consumer token", "the API server answered the TokenRequest without a token",
                     "check the API server", reason="NoToken", peer=peer)]
    out = [ok("consumer token", f"a token of {who} with the audience {audience} (TokenRequest, "
                                f"{TOKEN_SECONDS // 60} minutes; not shown)", peer=peer)]
    egress = _Egress(access["endpoint"], access["caBundle"], overrides, token)
    try:
        out.append(await _request(egress, req, peer))
    finally:
        await egress.close()
    return out


async def _request(egress: _Egress, req: ConsumerRequest, peer: str) -> Line:
    what = f"{req.verb} {req.resource}" + (f" {req.name}" if req.name else "") + (
        f" in {req.target_namespace}" if req.target_namespace else "") if req.resource else "GET /api"
    check = "consumer request"
    try:
        if not req.resource:
            code, body = await egress.call("GET", "/api")
        else:
            path, group = await _path(egress, req)
            if req.verb == "list":
                code, body = await egress.call("GET", path + "?limit=1")
            elif req.verb == "get":
                code, body = await egress.call("GET", f"{path}/{urllib.parse.quote(req.name or '')}")
            elif req.verb == "watch":
                code, body = await egress.call("GET", path + "?watch=1&timeoutSeconds=1")
            else:
                attributes = {"verb": req.verb, "group": group, "resource": req.resource.split(".", 1)[0]}
                attributes.update({k: v for k, v in (("namespace", req.target_namespace), ("name", req.name)) if v})
                code, body = await egress.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes}})
                if code == 201 or code == 200:
                    status = (body or {}).get("status") or {}
                    if status.get("allowed"):
                        return ok(check, f"{what} on {peer} is allowed (asked as a SelfSubjectAccessReview through "
                                         "both gateways; nothing was written)", peer=peer)
                    why = status.get("reason") or "no rule of the capability grants it"
                    return fail(check, f"{what} on {peer} is not allowed: {why}", fixes.consumer_fix("Forbidden"),
                                reason="Forbidden", peer=peer)
    except LookupError as exc:
        code, body, group = exc.args
        reason, message = _status(body)
        return fail(check, f"the peer does not serve the API group {group} through the gateways (HTTP {code}"
                           + (f" {reason}" if reason else "") + ")", fixes.consumer_fix(reason or reasons.NOT_FOUND),
                    reason=reason or reasons.NOT_FOUND, peer=peer)
    except (aiohttp.ClientConnectorError, asyncio.TimeoutError, OSError) as exc:
        return fail(check, f"the egress {egress.endpoint} cannot be reached from here ({type(exc).__name__})",
                    "run the check in a Pod of the cluster, or forward the egress: `d8 k -n d8-peering port-forward "
                    "svc/peering-gateway 9443:443` and add `--resolve peering-gateway.d8-peering.svc=127.0.0.1:9443` "
                    "(port-forward needs pods/portforward in d8-peering)", reason="EgressUnreachable", peer=peer)
    except aiohttp.ClientError as exc:
        return fail(check, f"the request through the egress failed: {type(exc).__name__}: {str(exc)[:200]}",
                    "run the check again; see the egress's log", reason="EgressFailed", peer=peer)
    if 200 <= code < 300:
        items = (body or {}).get("items") if isinstance(body, dict) else None
        more = f", {len(items)} item{'s' if len(items) != 1 else ''} in the first page" if items is not None else ""
        return ok(check, f"{what} on {peer} answered {code} through both gateways{more}", peer=peer)
    reason, message = _status(body)
    return fail(check, f"{what} on {peer} was refused: HTTP {code} {reason}: {message}",
                fixes.consumer_fix(reason), reason=reason or f"HTTP{code}", peer=peer)
