"""The emulated kube-apiserver: an aiohttp TLS server that authenticates and authorizes every request, routes it
as kube-apiserver's request-info parser does, and answers with the store's objects, tables, watch streams and
Status errors. The rules live in the other modules of this package; this file moves data in and out."""

from __future__ import annotations

import asyncio
import collections
import copy
import pathlib
from typing import AsyncIterator, Iterable

from aiohttp import web

from lab.apiserver import errors, events
from lab.apiserver.authcache import AuthCache
from lab.apiserver.auth import bootstrap, rbac
from lab.apiserver.auth.authn import Authenticator
from lab.apiserver.auth.tokens import ServiceAccountIssuer
from lab.apiserver.crud import CRD_KEY, Objects
from lab.apiserver.gc import GarbageCollector
from lab.apiserver.hooks import WriteHooks
from lab.apiserver.resources import Registry, ResourceInfo
from lab.apiserver.selectors import label_predicate
from lab.apiserver.store import Store
from lab.apiserver.request import DEFAULT_NAMESPACES, LAB_CRDS, MAX_BODY, load_yaml_documents, server_ssl
from lab.apiserver.serving import Serving
from lab.apiserver.writing import Writing



class ApiServer(Serving, Writing):
    """One emulated cluster's kube-apiserver (and the controllers of kube-controller-manager it needs)."""

    def __init__(self, *, name: str, crd_paths: list[pathlib.Path], serving_cert_pem: bytes, serving_key_pem: bytes,
                 client_ca_pem: bytes, issuer_url: str | None = None, oidc=(), bookmark_interval: float = 60.0,
                 history: int = 1000, watch_queue: int = 1000, without_crds: Iterable[str] = ()) -> None:
        self.name = name
        self.url = ""
        self.port = 0
        self.bookmark_interval = bookmark_interval
        self._ssl = server_ssl(serving_cert_pem, serving_key_pem, client_ca_pem)
        self._issuer_fixed = issuer_url is not None
        self.sa_issuer = ServiceAccountIssuer(issuer_url or "https://127.0.0.1")
        self.store = Store(history=history, watch_queue=watch_queue)
        self.registry = Registry()
        self.objects = Objects(self.store, self.registry)
        self.gc = GarbageCollector(self.objects)
        #: Callbacks run right after a given write over HTTP landed (hooks.py; the join's crash tests).
        self.write_hooks = WriteHooks()
        self._oidc = list(oidc)
        self.authenticator = Authenticator(client_ca_pem, self.sa_issuer, self._oidc, self.list_objects)
        self.authorizer = rbac.Authorizer(self.list_objects)
        self.auth_cache = AuthCache()
        self.store.listeners.append(self._forget_authentications)
        # RBAC decisions are a pure function of the user, the request and the RBAC objects: kept until any RBAC
        # object changes, so a benchmark's repeated requests do not re-evaluate every binding each time.
        self._decisions: dict[tuple, object] = {}
        self.store.listeners.append(self._forget_decisions)
        self._apply_previous: dict[tuple, dict] = {}   # (key, ns, name, manager) -> last applied config
        self._snapshots: collections.OrderedDict[str, tuple[list, int]] = collections.OrderedDict()
        self._runner: web.AppRunner | None = None
        self._watchers: set = set()
        self._stopping = False
        # Aggregated APIs whose backend is down: group -> versions (see add_unavailable_api).
        self.unavailable_apis: dict[str, list[str]] = {}
        self.store.listeners.append(self._close_watches_of_removed_crds)
        for ns in DEFAULT_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for obj in bootstrap.bootstrap_objects():
            self.create(obj)
        # Every CRD this server knows, installed at start unless left out; install_crd adds one later.
        self.crd_documents: dict[str, dict] = {}
        for path in [LAB_CRDS, *[pathlib.Path(p) for p in crd_paths]]:
            for doc in load_yaml_documents(path):
                if doc.get("kind") != "CustomResourceDefinition":
                    continue
                if doc["metadata"]["name"] in self.crd_documents:
                    raise ValueError(f"CRD {doc['metadata']['name']} is given twice (again in {path}); pass each "
                                     "CRD file once")
                self.crd_documents[doc["metadata"]["name"]] = doc
        left_out = set(without_crds)
        unknown = sorted(left_out - set(self.crd_documents))
        if unknown:
            raise ValueError(f"cannot start without CRD {', '.join(unknown)}: no such CRD is loaded; name one of "
                             f"{', '.join(sorted(self.crd_documents))}")
        for crd_name, doc in self.crd_documents.items():
            if crd_name not in left_out:
                self.create(doc)

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"https://{host}:{self.port}"
        if not self._issuer_fixed:
            self.sa_issuer.issuer_url = self.url
        self.gc.start()

    async def stop(self) -> None:
        self._stopping = True
        for w in list(self._watchers):
            w.overflowed = True
            try:
                w.queue.put_nowait(None)
            except asyncio.QueueFull:
                pass
        await self.gc.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def add_oidc(self, authenticator) -> None:
        """Trust another OIDC issuer for bearer tokens (the lab's Dex starts after the API server)."""
        self._oidc.append(authenticator)

    # ------------------------------------------------------------ what is served, changed at run time

    def install_crd(self, name: str) -> dict:
        """Create one of the known CRDs (e.g. one left out at start) while the server runs; clients see it in
        discovery at once, as after `kubectl apply` of the CRD. 409 if it is installed already."""
        doc = self.crd_documents.get(name)
        if doc is None:
            raise ValueError(f"no CRD {name!r} is known to this server; name one of "
                             f"{', '.join(sorted(self.crd_documents))}")
        return self.create(doc)

    def crd_installed(self, name: str) -> bool:
        return self.store.get(CRD_KEY, None, name) is not None

    def add_unavailable_api(self, group: str, version: str = "v1beta1") -> None:
        """Register an aggregated API (an APIService) whose backend does not answer, as kube-aggregator shows it:
        `/apis` lists the group, aggregated discovery lists the version as Stale with no resources, and every
        request under `/apis/<group>/<version>` (after authentication and authorization) is 503
        "service unavailable" in plain text."""
        if not group or "." not in group:
            raise ValueError(f"API group {group!r}: an aggregated API's group is a DNS name such as metrics.k8s.io")
        if self.registry.versions(group):
            raise ValueError(f"API group {group!r} is served here already (by a CRD or a built-in); choose another")
        versions = self.unavailable_apis.setdefault(group, [])
        if version not in versions:
            versions.append(version)

    def remove_unavailable_api(self, group: str, version: str | None = None) -> None:
        """Take an unavailable API away again (one version, or the whole group)."""
        versions = self.unavailable_apis.get(group, [])
        if version is None:
            versions.clear()
        elif version in versions:
            versions.remove(version)
        if not versions:
            self.unavailable_apis.pop(group, None)

    def _unavailable(self, group: str, version: str) -> bool:
        return version in self.unavailable_apis.get(group, ())

    def _close_watches_of_removed_crds(self, key, ev) -> None:
        # A deleted CRD takes its resource's watch streams with it: they end, as kube-apiserver closes them.
        if key == CRD_KEY and ev.type == "DELETED":
            spec = (ev.old or ev.obj).get("spec") or {}
            self.store.close_watchers((spec.get("group", ""), (spec.get("names") or {}).get("plural", "")))

    # ------------------------------------------------------------ in-process access (no HTTP, no auth)

    def list_objects(self, group: str, plural: str, namespace: str | None) -> list[dict]:
        return self.store.list((group, plural), namespace)

    def _info(self, group: str, plural: str) -> ResourceInfo:
        info = self.registry.any_version(group, plural)
        if info is None:
            raise errors.ApiError(404, "NotFound", f"the server doesn't have a resource type "
                                                   f'"{errors.resource_label(group, plural)}"')
        return info

    def _info_of(self, obj: dict) -> ResourceInfo:
        info = self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if info is None:
            raise errors.ApiError(404, "NotFound", f'no resource of kind {obj.get("kind")!r} in '
                                                   f'{obj.get("apiVersion")!r} is served here')
        return info

    def _stored_form(self, group: str, plural: str):
        """The store key of a resource, and how to show its stored objects (events.k8s.io are core events).

        A resource that is not served (its CRD not installed) is 404, as it is over HTTP."""
        self._info(group, plural)
        if group == events.EVENTS_GROUP and plural == "events":
            return events.CORE_KEY, events.from_core
        return (group, plural), copy.deepcopy

    def get(self, group: str, plural: str, name: str, namespace: str | None = None) -> dict | None:
        key, show = self._stored_form(group, plural)
        obj = self.store.get(key, namespace, name)
        return show(copy.deepcopy(obj)) if obj is not None else None

    def list(self, group: str, plural: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        key, show = self._stored_form(group, plural)
        match = label_predicate(label_selector)
        return [show(copy.deepcopy(o)) for o in self.store.list(key, namespace) if match is None or match(o)]

    def create(self, obj: dict) -> dict:
        info = self._info_of(obj)
        ns = (obj.get("metadata") or {}).get("namespace")
        stored, _ = self.objects.create(info, copy.deepcopy(obj), ns, field_validation="Ignore")
        return copy.deepcopy(stored)

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        info = self._info_of(obj)
        meta = obj.get("metadata") or {}
        stored, _ = self.objects.update(info, copy.deepcopy(obj), meta.get("namespace"), meta.get("name", ""),
                                        subresource=subresource, field_validation="Ignore")
        return copy.deepcopy(stored)

    def delete(self, group: str, plural: str, name: str, namespace: str | None = None) -> None:
        self.objects.delete(self._info(group, plural), namespace, name)

    async def watch(self, group: str, plural: str, namespace: str | None = None,
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Events of a resource: ADDED for what exists (without a resource_version), then every change."""
        key, show = self._stored_form(group, plural)
        rv = int(resource_version) if resource_version else None
        initial = None if rv else self.store.list(key, namespace)
        w = self.store.watch(key, namespace, None, rv, initial)
        self._watchers.add(w)
        try:
            while True:
                item = await w.queue.get()
                if self._stopping or (item is None and w.closed):
                    return   # the server stops or the CRD went: the stream ends, as kube-apiserver closes it
                if item is None or w.overflowed:
                    raise errors.gone("the watch fell too far behind and was closed; list again and watch from "
                                      "the new resourceVersion")
                yield item[0], show(copy.deepcopy(item[1]))
        finally:
            self._watchers.discard(w)
            self.store.unwatch(key, w)

    # ------------------------------------------------------------ HTTP

