"""`cluster.api` of a lab cluster whose API server is a real kube-apiserver (`--apiserver real`), over HTTP.

The emulator's in-process API (`lab/apiserver/app.py` `ApiServer.get/list/create/update/delete/watch`,
`sa_issuer.issue`, `install_crd`) is what the tests, the demo and the lab's stand-ins (user-authn,
multitenancy-manager) call. `HttpApi` offers the same calls to a real kube-apiserver, as its cluster-admin (the
lab's client certificate), so that one test body runs on both backends:

| call | over HTTP |
|---|---|
| `get(group, plural, name, ns)` | GET; None when the object does not exist, `ApiError` 404 when the resource is not served |
| `list(group, plural, ns, label_selector)` | GET of the collection; items get their `apiVersion` and `kind` back |
| `create(obj)` / `update(obj, subresource=)` | POST / PUT (strict field validation) |
| `delete(group, plural, name, ns)` | DELETE (background propagation, as kubectl) |
| `watch(group, plural, ns, resource_version)` | an async iterator of `(type, object)` from `?watch=1` |
| `sa_issuer.issue(ns, name, uid, audiences, seconds)` | TokenRequest (`seconds` at least 600, as kube-apiserver wants) |
| `sa_issuer.jwks()` | GET /openid/v1/jwks |
| `install_crd(name)` | the CRD applied, then waited for until every served version lists |
| `write_counts()` | kube-apiserver's own `apiserver_request_total` of writes, by verb and resource (for WriteCounter) |

The calls are synchronous, as the emulator's are: each is one request on loopback (a few milliseconds), made
from whatever thread calls it; `watch` is asynchronous, on aiohttp. The version of a resource is the first one
discovery lists for it (the group's preferred version when it serves the resource), as kubectl picks it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
from typing import Any, AsyncIterator, Iterable, Mapping
from urllib.parse import quote, urlencode

import aiohttp
import urllib3

from lab import certs
from lab.apiserver.errors import ApiError

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")
# kube-apiserver refuses a TokenRequest shorter than this (`may not specify a duration less than 10 minutes`).
MIN_TOKEN_SECONDS = 600
TIMEOUT = 30.0
_METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def api_error(status: int, body: bytes | str) -> ApiError:
    """The server's Status as an ApiError (or its plain text, as for `404 page not found`)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return ApiError(int(doc.get("code") or status), doc.get("reason") or "", doc.get("message") or "",
                        doc.get("details"))
    return ApiError(status, "", text.strip() or f"HTTP {status}")


class Resource:
    """One served resource: the version it is read at, its kind, scope and subresources."""

    def __init__(self, group: str, version: str, plural: str, kind: str, namespaced: bool,
                 subresources: Iterable[str]) -> None:
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced = namespaced
        self.subresources = set(subresources)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
        return base


class _Registry:
    """`registry.by_kind(apiVersion, kind)` as the emulator's: what the lab asks to know whether a kind is served."""

    def __init__(self, api: "HttpApi") -> None:
        self._api = api

    def by_kind(self, api_version: str, kind: str) -> Resource | None:
        return self._api.resource_of_kind(api_version, kind)


class TokenIssuer:
    """`api.sa_issuer` of a real cluster: tokens from the TokenRequest API, keys from /openid/v1/jwks."""

    def __init__(self, api: "HttpApi") -> None:
        self._api = api
        self.issuer_url = ""

    def issue(self, namespace: str, name: str, uid: str, audiences: list[str], expiration_seconds: int,
              bound_object: dict | None = None) -> tuple[str, str]:
        """A token of ServiceAccount namespace/name; returns it and its expiry (RFC 3339, as the API says).
        `uid` must be the ServiceAccount's: a token asked for an account that was since re-created is refused
        here rather than issued for the new one."""
        if expiration_seconds < MIN_TOKEN_SECONDS:
            raise ValueError(f"expiration_seconds {expiration_seconds}: kube-apiserver issues tokens of at least "
                             f"{MIN_TOKEN_SECONDS} s; ask for {MIN_TOKEN_SECONDS} or more")
        sa = self._api.get("", "serviceaccounts", name, namespace)
        if sa is None:
            raise ApiError(404, "NotFound", f'serviceaccounts "{name}" not found')
        if uid and sa["metadata"]["uid"] != uid:
            raise ApiError(409, "Conflict", f"ServiceAccount {namespace}/{name} has uid {sa['metadata']['uid']}, "
                                            f"not {uid}: it was re-created; read it again")
        spec: dict = {"expirationSeconds": int(expiration_seconds)}
        if audiences:
            spec["audiences"] = list(audiences)
        if bound_object:
            spec["boundObjectRef"] = {"apiVersion": "v1", **bound_object}
        body = self._api.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/serviceaccounts/"
                                         f"{quote(name, safe='')}/token",
                                 {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return body["status"]["token"], body["status"]["expirationTimestamp"]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "jwks" and getattr(self._api, "front", None) is None:
            raise AttributeError("a real kube-apiserver serves its own keys at /openid/v1/jwks: start the lab with "
                                 "api_front=True to replace them for its peering processes (lab/apifront.py)")
        object.__setattr__(self, name, value)

    def jwks(self) -> dict:
        """What the cluster serves at /openid/v1/jwks; replaced (`sa_issuer.jwks = lambda: {...}`) only in what
        lab/apifront.py answers the peering process, for a lab started with api_front=True."""
        return self._api.request("GET", "/openid/v1/jwks", accept="application/jwk-set+json")


class HttpApi:
    """A real kube-apiserver reached as its cluster-admin, offering the emulator's in-process calls."""

    backend = "real"

    def __init__(self, name: str, url: str, ca_pem: bytes, admin: certs.CertKey, *,
                 crd_documents: Mapping[str, dict] | None = None) -> None:
        self.name = name
        self.url = url
        host, _, port = url.removeprefix("https://").partition(":")
        self.host, self.port = host, int(port)
        self._ca_pem = ca_pem
        self._admin = admin
        self._pool = urllib3.HTTPSConnectionPool(
            host, self.port, ssl_context=certs.client_ssl_context(ca_pem, admin), maxsize=8, block=False,
            timeout=urllib3.Timeout(total=TIMEOUT), retries=False)
        self._lock = threading.Lock()
        self._by_plural: dict[tuple[str, str], Resource] = {}
        self._by_kind: dict[tuple[str, str], Resource] = {}
        self._discovered = False
        self.crd_documents: dict[str, dict] = dict(crd_documents or {})
        self.registry = _Registry(self)
        # lab/apifront.py, when the lab cluster puts one before its peering process.
        self.front: Any = None
        self.sa_issuer = TokenIssuer(self)

    def close(self) -> None:
        self._pool.close()

    # --- requests ---

    def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None,
                content_type: str = "application/json", accept: str = "application/json") -> Any:
        """One request; the decoded JSON answer, or ApiError with the server's Status."""
        url = path + (f"?{urlencode(params)}" if params else "")
        headers = {"Accept": accept}
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = content_type
        r = self._pool.request(method, url, body=data, headers=headers, preload_content=True)
        if r.status >= 300:
            raise api_error(r.status, r.data)
        if not r.data:
            return {}
        if accept.startswith("text/"):
            return r.data.decode()
        return json.loads(r.data)

    # --- discovery ---

    def _discover(self) -> None:
        by_plural: dict[tuple[str, str], Resource] = {}
        by_kind: dict[tuple[str, str], Resource] = {}
        for path in ("/api", "/apis"):
            doc = self.request("GET", path, accept=AGGREGATED)
            for group in doc.get("items") or []:
                gname = (group.get("metadata") or {}).get("name", "")
                for version in group.get("versions") or []:
                    if version.get("freshness") == "Stale":
                        continue
                    for res in version.get("resources") or []:
                        r = Resource(gname, version["version"], res["resource"],
                                     (res.get("responseKind") or {}).get("kind", ""),
                                     res.get("scope") == "Namespaced",
                                     (s.get("subresource") for s in res.get("subresources") or []))
                        # The first version listed for a resource is the one read (the preferred one first).
                        by_plural.setdefault((gname, r.plural), r)
                        by_kind.setdefault((r.api_version, r.kind), r)
        with self._lock:
            self._by_plural, self._by_kind, self._discovered = by_plural, by_kind, True

    def forget_discovery(self) -> None:
        with self._lock:
            self._discovered = False

    def resource(self, group: str, plural: str) -> Resource:
        """The served resource; discovery is read again on a miss; ApiError 404 when it is not served."""
        for attempt in (0, 1):
            if attempt or not self._discovered:
                self._discover()
            found = self._by_plural.get((group, plural))
            if found is not None:
                return found
        label = f"{plural}.{group}" if group else plural
        raise ApiError(404, "NotFound", f'the server doesn\'t have a resource type "{label}"')

    def resource_of_kind(self, api_version: str, kind: str) -> Resource | None:
        for attempt in (0, 1):
            if attempt or not self._discovered:
                self._discover()
            found = self._by_kind.get((api_version, kind))
            if found is not None:
                return found
        return None

    def _resource_of(self, obj: Mapping) -> Resource:
        found = self.resource_of_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if found is None:
            raise ApiError(404, "NotFound", f'no resource of kind {obj.get("kind")!r} in '
                                            f'{obj.get("apiVersion")!r} is served here')
        return found

    def _gone_or_missing(self, e: ApiError) -> bool:
        """A 404 of an object (None for get) rather than of its resource (whose CRD went: discovery again)."""
        if (e.details or {}).get("name"):
            return True
        self.forget_discovery()
        return False

    # --- the emulator's in-process calls ---

    def get(self, group: str, plural: str, name: str, namespace: str | None = None) -> dict | None:
        res = self.resource(group, plural)
        try:
            return self.request("GET", res.path(namespace, name))
        except ApiError as e:
            if e.code == 404 and self._gone_or_missing(e):
                return None
            raise

    def list(self, group: str, plural: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        res = self.resource(group, plural)
        params = {"labelSelector": label_selector} if label_selector else None
        try:
            body = self.request("GET", res.path(namespace), params=params)
        except ApiError as e:
            if e.code == 404:
                self.forget_discovery()
            raise
        kind = body.get("kind", "").removesuffix("List") or res.kind
        items = body.get("items") or []
        for item in items:
            item.setdefault("apiVersion", body.get("apiVersion", res.api_version))
            item.setdefault("kind", kind)
        return items

    def create(self, obj: dict) -> dict:
        res = self._resource_of(obj)
        meta = obj.get("metadata") or {}
        stored = self.request("POST", res.path(meta.get("namespace")), obj, params={"fieldValidation": "Strict"})
        if res.group == "apiextensions.k8s.io":
            self.forget_discovery()
        return stored

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        res = self._resource_of(obj)
        meta = obj.get("metadata") or {}
        return self.request("PUT", res.path(meta.get("namespace"), meta.get("name", ""), subresource), obj,
                            params={"fieldValidation": "Strict"})

    def delete(self, group: str, plural: str, name: str, namespace: str | None = None) -> None:
        res = self.resource(group, plural)
        self.request("DELETE", res.path(namespace, name),
                     {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
        if group == "apiextensions.k8s.io":
            self.forget_discovery()

    async def watch(self, group: str, plural: str, namespace: str | None = None,
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Events of a resource: ADDED for what exists (without a resource_version), then every change; the
        stream ends when the server closes it; an ERROR event (410 Gone, ...) is raised as ApiError."""
        res = await asyncio.to_thread(self.resource, group, plural)
        params = {"watch": "1", "allowWatchBookmarks": "false"}
        if resource_version:
            params["resourceVersion"] = resource_version
        connector = aiohttp.TCPConnector(ssl=certs.client_ssl_context(self._ca_pem, self._admin))
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT)) as s:
            async with s.get(self.url + res.path(namespace), params=params) as r:
                if r.status >= 300:
                    if r.status == 404:
                        self.forget_discovery()
                    raise api_error(r.status, await r.read())
                async for line in r.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise api_error(int(status.get("code") or 500), json.dumps(status))
                    if event.get("type") == "BOOKMARK":
                        continue
                    yield event["type"], event["object"]

    # --- what is served, changed at run time ---

    def install_crd(self, name: str, timeout: float = 30.0) -> dict:
        """Create one of the lab's CRDs while everything runs (as `kubectl apply` of it would), and return once
        every served version lists: kube-apiserver answers 429 for a moment after Established."""
        from lab.real.runner import strip_schema_keys

        doc = self.crd_documents.get(name)
        if doc is None:
            raise ValueError(f"no CRD {name!r} is known to this lab; name one of {', '.join(sorted(self.crd_documents))}")
        doc = copy.deepcopy(doc)
        strip_schema_keys(doc, ("x-kubernetes-sensitive-data",))
        stored = self.create(doc)
        self.wait_served(stored, timeout)
        return stored

    def wait_served(self, crd: Mapping, timeout: float = 30.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        spec = crd["spec"]
        for version in (v["name"] for v in spec["versions"] if v.get("served")):
            # A whole list, as the lab's clients ask: a paginated one is read from etcd and answers 200 while the
            # watch cache, which serves whole lists, still answers 429 "storage is (re)initializing".
            path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"
            while True:
                try:
                    self.request("GET", path)
                    break
                except ApiError as e:
                    if e.code not in (404, 429, 503) or time.monotonic() > deadline:
                        raise ApiError(e.code, e.reason, f"CRD {crd['metadata']['name']} is not served at {path} "
                                                         f"after {timeout:.0f} s: {e.message}") from None
                time.sleep(0.05)  # bounded poll: kube-apiserver says nothing when a new resource is served
        self.forget_discovery()

    def crd_installed(self, name: str) -> bool:
        return self.get("apiextensions.k8s.io", "customresourcedefinitions", name) is not None

    # --- counting writes ---

    def write_counts(self) -> dict[str, int]:
        """Writes kube-apiserver answered with success, by `"<verb> <resource>[/<subresource>]"`, from its own
        /metrics (`apiserver_request_total`, cumulative since it started); dry runs left out."""
        text = self.request("GET", "/metrics", accept="text/plain")
        counts: dict[str, int] = {}
        for line in text.splitlines():
            m = _METRIC.match(line)
            if m is None:
                continue
            labels = dict(_LABEL.findall(m["labels"]))
            if labels.get("verb") not in WRITE_VERBS or not labels.get("code", "").startswith("2"):
                continue
            if labels.get("dry_run"):
                continue
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = f"{labels['verb']} {resource}"
            counts[key] = counts.get(key, 0) + int(float(m["value"]))
        return counts
