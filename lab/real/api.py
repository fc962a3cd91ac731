"""`cluster.api` of a lab cluster whose API server is a real kube-apiserver (`--apiserver real`).

The emulator's in-process API (`lab/apiserver/app.py` `ApiServer.get/list/create/update/delete/watch`,
`sa_issuer.issue`, `install_crd`) is what the tests, the demo and the lab's stand-ins (user-authn,
multitenancy-manager) call. `HttpApi` offers the same calls to a real kube-apiserver, as its cluster-admin (the
admin kubeconfig, a client certificate), so that one test body runs on both backends. Every request goes through
the product's own client (control/kube.py `KubeSession`), on an event loop of its own in a thread, so that the
calls are synchronous as the emulator's are (each one request on loopback, a few milliseconds):

| call | over HTTP |
|---|---|
| `get(group, plural, name, ns)` | GET; None when the object does not exist, `ApiError` 404 when the resource is not served |
| `list(group, plural, ns, label_selector)` | GET of the collection; items get their `apiVersion` and `kind` back |
| `create(obj)` / `update(obj, subresource=)` | POST / PUT (strict field validation) |
| `delete(group, plural, name, ns)` | DELETE (background propagation, as kubectl) |
| `watch(group, plural, ns, resource_version)` | an async iterator of `(type, object)` from `?watch=1`, in the caller's loop |
| `sa_issuer.issue(ns, name, uid, audiences, seconds)` | TokenRequest (`seconds` at least 600, as kube-apiserver wants) |
| `sa_issuer.jwks()` | GET /openid/v1/jwks |
| `install_crd(name)` | the CRD applied, then waited for until every served version lists |
| `write_counts()` | kube-apiserver's own `apiserver_request_total` of writes, by verb and resource (for WriteCounter) |

Errors are the emulator's `ApiError` (code, reason, message, details), made from the server's Status. The
version of a resource is the first one discovery lists for it (the group's preferred version when it serves the
resource), as kubectl picks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import re
import threading
import time
from typing import Any, AsyncIterator, Coroutine, Mapping, TypeVar

from control import kube
from lab.apiserver.errors import ApiError
from lab.real.documents import strip_schema_keys, writable_probe

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")
# kube-apiserver refuses a TokenRequest shorter than this (`may not specify a duration less than 10 minutes`).
MIN_TOKEN_SECONDS = 600
TIMEOUT = 30.0
#: How long a write refused while kube-apiserver still learns a custom resource's schema is sent again (`request`).
CRD_SETTLE = 30.0
_UNSETTLED = "There can be a delay between when CustomResourceDefinitions are created and when they are available"
_METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
T = TypeVar("T")


def lab_error(e: kube.ApiError) -> ApiError:
    """The product client's error as the emulator's: same code, reason, message and Status details."""
    return ApiError(e.code, e.reason, e.message, (e.status or {}).get("details"))


class Registry:
    """`registry.by_kind(apiVersion, kind)` as the emulator's: what the lab asks to know whether a kind is served."""

    def __init__(self, api: "HttpApi") -> None:
        self.api = api

    def by_kind(self, api_version: str, kind: str) -> kube.Resource | None:
        return self.api.resource_of_kind(api_version, kind)


class TokenIssuer:
    """`api.sa_issuer` of a real cluster: tokens from the TokenRequest API, keys from /openid/v1/jwks."""

    def __init__(self, api: "HttpApi") -> None:
        object.__setattr__(self, "api", api)
        self.issuer_url = ""

    def issue(self, namespace: str, name: str, uid: str, audiences: list[str], expiration_seconds: int,
              bound_object: dict | None = None) -> tuple[str, str]:
        """A token of ServiceAccount namespace/name; returns it and its expiry (RFC 3339, as the API says).
        `uid` must be the ServiceAccount's: a token asked for an account that was since re-created is refused
        here rather than issued for the new one."""
        if expiration_seconds < MIN_TOKEN_SECONDS:
            raise ValueError(f"expiration_seconds {expiration_seconds}: kube-apiserver issues tokens of at least "
                             f"{MIN_TOKEN_SECONDS} s; ask for {MIN_TOKEN_SECONDS} or more")
        sa = self.api.get("", "serviceaccounts", name, namespace)
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
        account = kube.Resource("", "v1", "serviceaccounts", True, "ServiceAccount")
        body = self.api.request("POST", account.path(namespace, name, "token"),
                                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return body["status"]["token"], body["status"]["expirationTimestamp"]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "jwks" and getattr(self.api, "front", None) is None:
            raise AttributeError("a real kube-apiserver serves its own keys at /openid/v1/jwks: start the lab with "
                                 "api_front=True to replace them for its peering processes (lab/apifront.py)")
        object.__setattr__(self, name, value)

    def jwks(self) -> dict:
        """What the cluster serves at /openid/v1/jwks; replaced (`sa_issuer.jwks = lambda: {...}`) only in what
        lab/apifront.py answers the peering process, for a lab started with api_front=True."""
        return self.api.request("GET", "/openid/v1/jwks", accept="application/jwk-set+json")


class HttpApi:
    """A real kube-apiserver reached as its cluster-admin (`kubeconfig`), offering the emulator's in-process calls."""

    backend = "real"

    def __init__(self, name: str, kubeconfig: os.PathLike | str, *,
                 crd_documents: Mapping[str, dict] | None = None) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"lab-api-{name}", daemon=True)
        self.thread.start()
        try:
            self.kube: kube.KubeSession = self.call(kube.KubeSession.connect(os.fspath(kubeconfig)))
        except BaseException:
            self.stop_loop()
            raise
        self.url = self.kube.server
        host, _, port = self.url.removeprefix("https://").partition(":")
        self.host, self.port = host, int(port)
        self.lock = threading.Lock()
        self.by_plural: dict[tuple[str, str], kube.Resource] = {}
        self.by_kind: dict[tuple[str, str], kube.Resource] = {}
        self.discovered = False
        self.crd_documents: dict[str, dict] = dict(crd_documents or {})
        self.registry = Registry(self)
        # lab/apifront.py, when the lab cluster puts one before its peering process.
        self.front: Any = None
        self.sa_issuer = TokenIssuer(self)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop and wait for it (bounded: every request is)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT + 5)

    def stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()

    def close(self) -> None:
        """Ends what still reads on the client's loop (a watch whose caller stopped reading is cancelled by then,
        but its task may not have run yet), then the session and the loop: no connection is left open behind."""
        if self.loop.is_closed():
            return

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.kube.close()
        try:
            self.call(shutdown())
        finally:
            self.stop_loop()

    # --- requests ---

    def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None,
                content_type: str = "application/json", accept: str = "application/json") -> Any:
        """One request; the decoded JSON answer, or ApiError with the server's Status.

        A write that kube-apiserver's admission answers 503 "Resource kind ... not found. There can be a delay ..."
        (its mutating admission policies' type converter has not learnt a custom resource's schema yet, or is
        relearning it after another CRD changed: it answers so even after a dry-run create of that kind passed) is
        sent again, for at most CRD_SETTLE seconds: that answer says the write was never applied, and an
        administrator's kubectl would be run again. Any other answer is the caller's."""
        deadline = time.monotonic() + CRD_SETTLE
        while True:
            try:
                return self.call(self.kube.request(method, path, query=dict(params or {}), body=body,
                                                   content_type=content_type, accept=accept, timeout=TIMEOUT))
            except kube.ApiError as e:
                if not (e.code == 503 and _UNSETTLED in (e.message or "")) or time.monotonic() > deadline:
                    raise lab_error(e) from None
            time.sleep(0.05)  # bounded poll: kube-apiserver says nothing when its type converter caught up

    def text(self, path: str) -> str:
        """A plain-text answer (/metrics), through the same session."""
        async def read() -> str:
            async with self.kube.session.get(self.url + path, headers={"Accept": "text/plain"},
                                             server_hostname=self.kube.configuration.tls_server_name or None) as r:
                body = await r.text()
                if r.status >= 300:
                    raise lab_error(kube.error_from_status(r.status, body))
                return body
        return self.call(read())

    # --- discovery ---

    def discover(self) -> None:
        by_plural: dict[tuple[str, str], kube.Resource] = {}
        by_kind: dict[tuple[str, str], kube.Resource] = {}
        for path in ("/api", "/apis"):
            doc = self.request("GET", path, accept=AGGREGATED)
            for group in doc.get("items") or []:
                gname = (group.get("metadata") or {}).get("name", "")
                for version in group.get("versions") or []:
                    if version.get("freshness") == "Stale":
                        continue
                    for res in version.get("resources") or []:
                        r = kube.Resource(gname, version["version"], res["resource"],
                                          res.get("scope") == "Namespaced",
                                          (res.get("responseKind") or {}).get("kind", ""))
                        # The first version listed for a resource is the one read (the preferred one first).
                        by_plural.setdefault((gname, r.plural), r)
                        by_kind.setdefault((r.api_version, r.kind), r)
        with self.lock:
            self.by_plural, self.by_kind, self.discovered = by_plural, by_kind, True

    def forget_discovery(self) -> None:
        with self.lock:
            self.discovered = False

    def lookup(self, table: str, key: tuple[str, str]) -> kube.Resource | None:
        """A served resource, discovery read again on a miss."""
        for attempt in (0, 1):
            if attempt or not self.discovered:
                self.discover()
            found = getattr(self, table).get(key)
            if found is not None:
                return found
        return None

    def resource(self, group: str, plural: str) -> kube.Resource:
        """The served resource; ApiError 404 when it is not served."""
        found = self.lookup("by_plural", (group, plural))
        if found is None:
            label = f"{plural}.{group}" if group else plural
            raise ApiError(404, "NotFound", f'the server doesn\'t have a resource type "{label}"')
        return found

    def resource_of_kind(self, api_version: str, kind: str) -> kube.Resource | None:
        return self.lookup("by_kind", (api_version, kind))

    def resource_of(self, obj: Mapping) -> kube.Resource:
        found = self.resource_of_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if found is None:
            raise ApiError(404, "NotFound", f'no resource of kind {obj.get("kind")!r} in '
                                            f'{obj.get("apiVersion")!r} is served here')
        return found

    def gone_or_missing(self, e: ApiError) -> bool:
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
            if e.code == 404 and self.gone_or_missing(e):
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
        res = self.resource_of(obj)
        meta = obj.get("metadata") or {}
        stored = self.request("POST", res.path(meta.get("namespace")), obj, params={"fieldValidation": "Strict"})
        if res.group == "apiextensions.k8s.io":
            self.forget_discovery()
        return stored

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        res = self.resource_of(obj)
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
        stream ends when the server closes it; an ERROR event (410 Gone, ...) is raised as ApiError. The stream
        is read on the client's loop and handed to the caller's."""
        res = await asyncio.to_thread(self.resource, group, plural)
        caller = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def hand(kind: str, item: Any) -> None:
            # The caller may have gone (its loop closed) while the stream was read: nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                caller.call_soon_threadsafe(events.put_nowait, (kind, item))

        async def pump() -> None:
            try:
                async for event in self.kube.watch(res, namespace, resource_version=resource_version,
                                                   timeout_seconds=None, bookmarks=False):
                    hand("event", event)
            except asyncio.CancelledError:
                raise
            except kube.ApiError as e:
                if e.code == 404:
                    self.forget_discovery()
                hand("error", lab_error(e))
            except Exception as e:  # a connection that broke: the caller sees it as the stream's end does
                hand("error", e)
            else:
                hand("end", None)

        reader = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while True:
                kind, item = await events.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                if item.get("type") == "ERROR":
                    status = item.get("object") or {}
                    raise lab_error(kube.error_from_status(int(status.get("code") or 500), status))
                if item.get("type") == "BOOKMARK":
                    continue
                yield item["type"], item["object"]
        finally:
            reader.cancel()

    # --- what is served, changed at run time ---

    def install_crd(self, name: str, timeout: float = 30.0) -> dict:
        """Create one of the lab's CRDs while everything runs (as `kubectl apply` of it would), and return once
        every served version lists: kube-apiserver answers 429 for a moment after Established."""
        doc = self.crd_documents.get(name)
        if doc is None:
            raise ValueError(f"no CRD {name!r} is known to this lab; name one of {', '.join(sorted(self.crd_documents))}")
        doc = copy.deepcopy(doc)
        strip_schema_keys(doc, ("x-kubernetes-sensitive-data",))
        stored = self.create(doc)
        self.wait_served(stored, timeout)
        return stored

    def wait_served(self, crd: Mapping, timeout: float = 30.0) -> None:
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
            probe_path, probe = writable_probe(crd, version)
            while True:  # listed is not yet writable: seeding.install_crds says why
                try:
                    self.request("POST", probe_path, probe, params={"dryRun": "All"})
                    break
                except ApiError as e:
                    if e.code not in (404, 429, 503):
                        break
                    if time.monotonic() > deadline:
                        raise ApiError(e.code, e.reason, f"CRD {crd['metadata']['name']} lists but takes no write "
                                                         f"at {probe_path} after {timeout:.0f} s: {e.message}") from None
                time.sleep(0.05)
        self.forget_discovery()

    def crd_installed(self, name: str) -> bool:
        return self.get("apiextensions.k8s.io", "customresourcedefinitions", name) is not None

    # --- counting writes ---

    def write_counts(self) -> dict[str, int]:
        """Writes kube-apiserver answered with success, by `"<verb> <resource>[/<subresource>]"`, from its own
        /metrics (`apiserver_request_total`, cumulative since it started); dry runs left out."""
        counts: dict[str, int] = {}
        for line in self.text("/metrics").splitlines():
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
