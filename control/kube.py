"""One Kubernetes API session per process, and a small generic client over it that speaks plain dicts.

kubernetes-asyncio loads the credentials (a kubeconfig, or the in-cluster ServiceAccount with its token refreshed
from disk) and owns the `ApiClient`; every request of the process goes through that client's single aiohttp
session, rebuilt here with the process's resolver so that lab host names are real TLS names on loopback. The typed
kubernetes-asyncio APIs remain usable on `session.api_client`; the control loop itself uses `request`, `get`,
`list`, `watch`, `create`, `update`, `patch` and `delete` on any resource path and gets dicts back.

Every write (POST, PUT, PATCH, DELETE; not the reviews, which store nothing) is counted, in `writes` /
`write_counts` and in the Prometheus counter `peering_api_writes_total`, so a test or a benchmark can assert
that a steady state makes no writes; every GET through `request` is counted by resource in `read_counts`, so one
can assert what a request handler costs the API server.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import logging
import os
import ssl
import sys
import urllib.parse
from typing import Any, AsyncIterator, Callable

import aiohttp
import prometheus_client
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

log = logging.getLogger("peering.control.kube")

API_WRITES = prometheus_client.Counter(
    "peering_api_writes", "Writes the process made to the Kubernetes API.", ["verb", "resource"])
API_REQUESTS = prometheus_client.Counter(
    "peering_api_requests", "Requests the process made to the Kubernetes API, by answer code.", ["verb", "code"])

# Before CPython 3.12.8 (python/cpython#118960) a TLS connection whose close waits for the peer's close_notify
# (a watch given up, its response unread) can outlive its session: aiohttp then aborts it when the session closes
# (and any still closing 2 s after it was closed), so that no connection is left behind the session.
_SSL_CLOSE_LEAKS = (3, 13, 0) <= sys.version_info < (3, 13, 1) or sys.version_info < (3, 12, 8)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclasses.dataclass(frozen=True)
class Resource:
    """A kind of API object, as its REST path names it."""

    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool
    kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path; `namespace` None on a namespaced resource means all namespaces (lists and watches)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.plural} is cluster-scoped: a namespace ({namespace!r}) makes no sense for it")
        base += f"/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError(f"an empty name for {self.plural}: give the object's metadata.name")
            base += f"/{urllib.parse.quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


CLUSTERPEERS = Resource("peering.deckhouse.io", "v1alpha1", "clusterpeers", False, "ClusterPeer")
PEERINGCAPABILITIES = Resource("peering.deckhouse.io", "v1alpha1", "peeringcapabilities", False, "PeeringCapability")
PROJECTPEERS = Resource("peering.deckhouse.io", "v1alpha1", "projectpeers", True, "ProjectPeer")
TOKENEXCHANGEPROVIDERS = Resource("deckhouse.io", "v1alpha1", "tokenexchangeproviders", False,
                                  "TokenExchangeProvider")
SECRETS = Resource("", "v1", "secrets", True, "Secret")
CONFIGMAPS = Resource("", "v1", "configmaps", True, "ConfigMap")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", True, "ServiceAccount")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", True, "Role")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", True, "RoleBinding")
CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
CLUSTERROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False,
                               "ClusterRoleBinding")
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", False, "TokenReview")
EVENTS = Resource("events.k8s.io", "v1", "events", True, "Event")


class ApiError(Exception):
    """The API server refused a request; `status` is its meta/v1 Status (the message never carries a secret of
    ours: the API server does not echo credentials)."""

    code: int = 0

    def __init__(self, code: int, reason: str, message: str, status: dict | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status = status or {}


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: a resourceVersion precondition failed (reason Conflict) or the object exists (AlreadyExists)."""


class AlreadyExists(Conflict):
    pass


class Forbidden(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Invalid(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion asked for is too old; list again."""


_BY_CODE = {404: NotFound, 409: Conflict, 403: Forbidden, 401: Unauthorized, 422: Invalid, 410: Gone}


def error_from_status(code: int, body: Any) -> ApiError:
    """The typed error for an HTTP answer code and its body (a Status when the server sent one)."""
    status = body if isinstance(body, dict) and body.get("kind") == "Status" else {}
    reason = status.get("reason") or f"HTTP{code}"
    message = status.get("message") or (body if isinstance(body, str) else "") or "no message"
    code = int(status.get("code") or code)
    cls = AlreadyExists if reason == "AlreadyExists" else _BY_CODE.get(code, ApiError)
    return cls(code, reason, str(message)[:2000], status)


@dataclasses.dataclass
class Credentials:
    """What the gateway needs to call the same API server: its URL, the CA that signs its serving cert, and the
    current bearer token (None when the process authenticates with a client certificate)."""

    server: str
    ca_pem: bytes | None
    token: Callable[[], str | None]
    client_cert_file: str | None = None
    client_key_file: str | None = None
    tls_server_name: str | None = None


class KubeSession:
    """The process's one API session; create with `await KubeSession.connect(...)`, close with `await close()`."""

    def __init__(self, configuration: k8s_client.Configuration, *,
                 resolver: aiohttp.abc.AbstractResolver | None = None, user_agent: str = "peering") -> None:
        self.configuration = configuration
        self.api_client = k8s_client.ApiClient(configuration)
        self.server = configuration.host.rstrip("/")
        self.ca_pem = _read(configuration.ssl_ca_cert)
        self.user_agent = user_agent
        # The ApiClient's own session knows no resolver: replace it with one that does, so that the typed APIs
        # and this client share one connection pool.
        old = self.api_client.rest_client.pool_manager
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=_ssl_context(configuration), resolver=resolver,
                                           limit=configuration.connection_pool_maxsize or 100,
                                           enable_cleanup_closed=_SSL_CLOSE_LEAKS),
            read_bufsize=2**21)
        self.api_client.rest_client.pool_manager = self.session
        self._old_session = old
        self.writes = 0
        self.write_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        #: GETs (a get or a page of a list; not a watch, which `watch` streams), by resource: what a request
        #: handler costs the API server, which the module shares with its own control loop.
        self.read_counts: collections.Counter[str] = collections.Counter()

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, *, context: str | None = None,
                      resolver: aiohttp.abc.AbstractResolver | None = None) -> "KubeSession":
        """From a kubeconfig file when one is given (or $KUBECONFIG), else from the in-cluster ServiceAccount."""
        configuration = k8s_client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path:
            try:
                await k8s_config.load_kube_config(config_file=path, context=context,
                                                  client_configuration=configuration, persist_config=False)
            except (OSError, k8s_config.ConfigException) as exc:
                raise ValueError(f"cannot use kubeconfig {path}: {exc}; check --kubeconfig") from None
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except k8s_config.ConfigException as exc:
                raise ValueError(f"no --kubeconfig given and not running in a cluster: {exc}") from None
        return cls(configuration, resolver=resolver)

    async def close(self) -> None:
        await self.session.close()
        await self._old_session.close()

    async def __aenter__(self) -> "KubeSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- credentials -------------------------------------------------------------------------------------------

    def bearer_token(self) -> str | None:
        """The current bearer token (re-read from the projected token file in a cluster), or None.

        Synchronous for the gateway's sake; a kubeconfig whose credentials refresh asynchronously (an exec
        plugin) is refreshed by every request of this session, and this returns the latest value."""
        conf = self.configuration
        hook = conf.refresh_api_key_hook
        if hook is not None:
            result = hook(conf)  # the in-cluster hook is a plain function that re-reads the file when due
            if inspect.iscoroutine(result):
                result.close()
        return _strip_bearer(conf.api_key.get("BearerToken"), conf.api_key_prefix.get("BearerToken"))

    async def _current_token(self) -> str | None:
        conf = self.configuration
        if "BearerToken" not in conf.api_key and conf.refresh_api_key_hook is None:
            return None
        # Runs the refresh hook, synchronous or not, as the kubernetes-asyncio typed APIs do.
        return _strip_bearer(await conf.get_api_key_with_prefix("BearerToken"), None)

    def credentials(self) -> Credentials:
        conf = self.configuration
        return Credentials(server=self.server, ca_pem=self.ca_pem, token=self.bearer_token,
                           client_cert_file=conf.cert_file, client_key_file=conf.key_file,
                           tls_server_name=conf.tls_server_name)

    async def _headers(self, content_type: str | None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        token = await self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    # -- requests ----------------------------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                      content_type: str = "application/json", timeout: float | None = 30.0,
                      accept: str = "application/json") -> dict:
        """One API call; returns the decoded JSON answer, raises a typed `ApiError` on a non-2xx answer. `accept`
        for a path that serves another JSON type (kube-apiserver's /openid/v1/jwks is application/jwk-set+json
        only, and 406 to application/json)."""
        method = method.upper()
        resource = _resource_of(path)
        # Reviews (TokenReview, SubjectAccessReview...) are POSTs that store nothing: not writes.
        write = method in ("POST", "PUT", "PATCH", "DELETE") and not resource.endswith("reviews")
        data = None if body is None else json.dumps(body).encode()
        params = _query(query)
        if write:
            # Counted before sending: a write that fails still reached the server.
            self.writes += 1
            self.write_counts[(method, resource)] += 1
            API_WRITES.labels(method, resource).inc()
        elif method == "GET":
            self.read_counts[resource] += 1
        async with self.session.request(
                method, self.server + path, params=params, data=data,
                headers=await self._headers(content_type if data is not None else None, accept),
                timeout=aiohttp.ClientTimeout(total=timeout),
                server_hostname=self.configuration.tls_server_name or None) as resp:
            raw = await resp.read()
            API_REQUESTS.labels(method, str(resp.status)).inc()
            parsed = _decode(raw)
            if not 200 <= resp.status < 300:
                raise error_from_status(resp.status, parsed)
            return parsed if isinstance(parsed, dict) else {}

    async def get(self, resource: Resource, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> dict:
        return await self.request("GET", resource.path(namespace, name, subresource))

    async def get_or_none(self, resource: Resource, name: str, namespace: str | None = None) -> dict | None:
        try:
            return await self.get(resource, name, namespace)
        except NotFound:
            return None

    async def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, page_size: int = 500) -> dict:
        """All pages of a list, as one List dict whose metadata.resourceVersion is the last page's."""
        items: list[dict] = []
        cont: str | None = None
        while True:
            answer = await self.request("GET", resource.path(namespace), query={
                "labelSelector": label_selector, "fieldSelector": field_selector, "limit": page_size,
                "continue": cont})
            items.extend(answer.get("items") or [])
            cont = (answer.get("metadata") or {}).get("continue")
            if not cont:
                answer["items"] = items
                return answer

    async def create(self, resource: Resource, obj: dict, namespace: str | None = None) -> dict:
        namespace = namespace or (obj.get("metadata") or {}).get("namespace") if resource.namespaced else None
        return await self.request("POST", resource.path(namespace), body=_with_type(resource, obj))

    async def update(self, resource: Resource, obj: dict, *, subresource: str | None = None) -> dict:
        """PUT the whole object; its metadata.resourceVersion, when set, is the precondition (409 Conflict)."""
        meta = obj.get("metadata") or {}
        path = resource.path(meta.get("namespace") if resource.namespaced else None, meta.get("name"), subresource)
        return await self.request("PUT", path, body=_with_type(resource, obj))

    async def update_status(self, resource: Resource, obj: dict) -> dict:
        return await self.update(resource, obj, subresource="status")

    async def patch(self, resource: Resource, name: str, patch: Any, namespace: str | None = None, *,
                    subresource: str | None = None, resource_version: str | None = None,
                    content_type: str = MERGE_PATCH) -> dict:
        """A JSON merge patch by default; `resource_version` adds the precondition to a merge patch."""
        if resource_version is not None and content_type == MERGE_PATCH:
            patch = dict(patch)
            patch["metadata"] = {**(patch.get("metadata") or {}), "resourceVersion": resource_version}
        return await self.request("PATCH", resource.path(namespace, name, subresource), body=patch,
                                  content_type=content_type)

    async def delete(self, resource: Resource, name: str, namespace: str | None = None, *,
                     resource_version: str | None = None, uid: str | None = None,
                     propagation: str | None = None) -> dict:
        preconditions = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            body["preconditions"] = preconditions
        if propagation:
            body["propagationPolicy"] = propagation
        return await self.request("DELETE", resource.path(namespace, name), body=body)

    async def watch(self, resource: Resource, namespace: str | None = None, *, resource_version: str | None = None,
                    label_selector: str | None = None, field_selector: str | None = None,
                    timeout_seconds: int | None = 300, bookmarks: bool = True) -> AsyncIterator[dict]:
        """Watch events as dicts {type, object}; ends when the server closes the stream. An ERROR event is yielded
        as is (its object is a Status); a non-2xx answer to the watch request raises the typed error."""
        query = {"watch": "true", "resourceVersion": resource_version, "labelSelector": label_selector,
                 "fieldSelector": field_selector, "timeoutSeconds": timeout_seconds,
                 "allowWatchBookmarks": "true" if bookmarks else None}
        # No total timeout: the server ends the watch after timeoutSeconds; sock_read notices a dead peer.
        read_limit = (timeout_seconds or 300) + 30
        async with self.session.get(self.server + resource.path(namespace), params=_query(query),
                                    headers=await self._headers(None),
                                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_limit),
                                    server_hostname=self.configuration.tls_server_name or None) as resp:
            API_REQUESTS.labels("WATCH", str(resp.status)).inc()
            if resp.status != 200:
                raise error_from_status(resp.status, _decode(await resp.read()))
            async for line in _lines(resp.content):
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ApiError(500, "BadWatchEvent", f"the API server sent a watch line that is not JSON "
                                                         f"({len(line)} bytes)") from None
                if isinstance(event, dict):
                    yield event


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    # readline() refuses lines over the buffer limit; watch events of big objects can exceed it.
    buf = b""
    async for chunk in stream.iter_any():
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].strip(), buf[nl + 1:]
            if line:
                yield line
    if buf.strip():
        yield buf.strip()


def _strip_bearer(value: str | None, prefix: str | None) -> str | None:
    if not value:
        return None
    value = f"{prefix} {value}" if prefix else value
    return value[7:] if value.lower().startswith("bearer ") else value


def _with_type(resource: Resource, obj: dict) -> dict:
    if obj.get("apiVersion") and obj.get("kind"):
        return obj
    return {"apiVersion": resource.api_version, "kind": resource.kind, **obj}


def _query(query: dict[str, Any] | None) -> dict[str, str]:
    return {k: str(v) for k, v in (query or {}).items() if v is not None and v != ""}


def _decode(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:500].decode("utf-8", "replace")


def _resource_of(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    # /api/v1/[namespaces/ns/]plural[/name[/sub]] or /apis/g/v/[namespaces/ns/]plural[/name[/sub]]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return "namespaces" if "namespaces" in parts else "unknown"
    return rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _ssl_context(conf: k8s_client.Configuration) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert)
    if conf.cert_file:
        ctx.load_cert_chain(conf.cert_file, keyfile=conf.key_file)
    if not conf.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
