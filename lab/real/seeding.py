"""How the lab seeds a real control plane: server-side apply of any kind it serves, CRDs applied and waited for
until they are served, ServiceAccount tokens; `RealControlPlane` has these as its methods."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from typing import Any, Callable, Iterable, Mapping

import aiohttp

from lab import certs
from lab.real.documents import ApplyError, load_documents, strip_schema_keys, writable_probe
from lab.real.process import POLL_INTERVAL

FIELD_MANAGER = "lab"


class Seeding:
    """The seeding calls of `RealControlPlane` (its `name`, `url`, `pki`, `ssl_context` and discovery cache)."""

    name: str
    url: str
    pki: Any
    _discovery: dict[tuple[str, str], tuple[str, bool]]

    ssl_context: Callable[[certs.CertKey | None], ssl.SSLContext]


    @contextlib.asynccontextmanager
    async def session(self, cert: certs.CertKey | None = None, *, token: str | None = None):
        """An aiohttp session to this API server; paths are relative to `url`. As the admin by default, as the
        user of client certificate `cert`, or with bearer `token` and no certificate at all."""
        if token is not None and cert is not None:
            raise ValueError("give a client certificate or a token, not both: kube-apiserver would take the "
                             "certificate's user")
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        connector = aiohttp.TCPConnector(ssl=self.ssl_context(None if token is not None else cert or self.pki.admin))
        async with aiohttp.ClientSession(base_url=self.url, connector=connector, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=30)) as s:
            yield s

    async def _resource(self, s: aiohttp.ClientSession, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of `kind` in `api_version`, from discovery; asked again on a miss."""
        key = (api_version, kind)
        if key not in self._discovery:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            async with s.get(path) as r:
                body = await response_body(r)
                if r.status != 200:
                    raise ApplyError(f"{kind} ({api_version}) is not served by {self.name}'s kube-apiserver: GET "
                                     f"{path} answered {r.status} {body.get('message', '')}: install its CRD first")
            for res in body.get("resources", []):
                if "/" not in res["name"]:
                    self._discovery[(api_version, res["kind"])] = (res["name"], res["namespaced"])
            if key not in self._discovery:
                raise ApplyError(f"{api_version} has no kind {kind} on {self.name}'s kube-apiserver")
        return self._discovery[key]

    async def _object_path(self, s: aiohttp.ClientSession, obj: Mapping) -> str:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        meta = obj.get("metadata") or {}
        if not api_version or not kind or not meta.get("name"):
            raise ApplyError(f"an object to apply needs apiVersion, kind and metadata.name; got "
                             f"{api_version!r} {kind!r} {meta.get('name')!r}")
        plural, namespaced = await self._resource(s, api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            ns = meta.get("namespace")
            if not ns:
                raise ApplyError(f"{kind} {meta['name']} is namespaced: give metadata.namespace")
            return f"{base}/namespaces/{ns}/{plural}/{meta['name']}"
        return f"{base}/{plural}/{meta['name']}"

    async def apply(self, objects: Iterable[Mapping], *, field_manager: str = FIELD_MANAGER) -> list[dict]:
        """Server-side apply each object (in order) with strict field validation; returns what the server stored."""
        stored = []
        async with self.session() as s:
            for obj in objects:
                path = await self._object_path(s, obj)
                async with s.patch(path, data=json.dumps(obj),
                                   params={"fieldManager": field_manager, "force": "true",
                                           "fieldValidation": "Strict"},
                                   headers={"Content-Type": "application/apply-patch+yaml"}) as r:
                    body = await response_body(r)
                    if r.status >= 300:
                        meta = obj.get("metadata", {})
                        raise ApplyError(f"{self.name}: applying {obj.get('kind')} "
                                         f"{meta.get('namespace', '') + '/' if meta.get('namespace') else ''}"
                                         f"{meta.get('name')} was refused ({r.status} {body.get('reason', '')}): "
                                         f"{body.get('message', body)}")
                    stored.append(body)
        return stored

    async def install_crds(self, sources: Iterable[os.PathLike | str | Mapping], *,
                           strip_keys: Iterable[str] = ("x-kubernetes-sensitive-data",),
                           timeout: float = 30.0) -> list[str]:
        """Apply CustomResourceDefinitions (files, directories of *.yaml, or dicts) and wait until each is
        Established and each served version lists. Schema keys in `strip_keys` are removed first and their places returned: a stock
        kube-apiserver does not know Deckhouse's `x-kubernetes-sensitive-data` and refuses it under strict
        field validation (pass `strip_keys=()` to see that)."""
        crds = [doc for doc in load_documents(sources) if doc.get("kind") == "CustomResourceDefinition"]
        strip = tuple(strip_keys)
        stripped: list[str] = []
        for crd in crds:
            stripped += strip_schema_keys(crd, strip)
        stored = await self.apply(crds)
        deadline = time.monotonic() + timeout
        async with self.session() as s:
            for crd in stored:
                name = crd["metadata"]["name"]
                while True:
                    async with s.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") as r:
                        conds = {c["type"]: c for c in (await r.json()).get("status", {}).get("conditions", [])}
                    if conds.get("Established", {}).get("status") == "True":
                        break
                    if time.monotonic() > deadline:
                        raise ApplyError(f"CRD {name} was not Established after {timeout:.0f} s: "
                                         f"{json.dumps(list(conds.values()))}")
                    await asyncio.sleep(POLL_INTERVAL)
                # Established is not yet served: until its watch cache is filled, kube-apiserver answers a list
                # with 429 "storage is (re)initializing". On a real cluster a module starts long after its CRDs.
                group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
                for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served")):
                    while True:
                        # Without a limit: a paginated list is read from etcd and answers 200 while the watch
                        # cache, which serves a whole list, still answers 429.
                        async with s.get(f"/apis/{group}/{version}/{plural}") as r:
                            await r.read()
                            if r.status == 200:
                                break
                            if r.status != 429 or time.monotonic() > deadline:
                                raise ApplyError(f"CRD {name} is Established but listing {group}/{version} "
                                                 f"{plural} answers {r.status}")
                        await asyncio.sleep(POLL_INTERVAL)
                    # Listed is not yet writable either: for a moment a create is answered 404, or 503 "Resource
                    # kind ... not found. There can be a delay between when CustomResourceDefinitions are created
                    # and when they are available". A dry-run create that reaches validation (any other answer,
                    # a 422 for this empty object included) says the kind takes writes.
                    path, probe = writable_probe(crd, version)
                    while True:
                        async with s.post(path, params={"dryRun": "All"}, json=probe) as r:
                            await r.read()
                            if r.status not in (404, 429, 503):
                                break
                            if time.monotonic() > deadline:
                                raise ApplyError(f"CRD {name} lists but a create of {group}/{version} {plural} "
                                                 f"still answers {r.status}")
                        await asyncio.sleep(POLL_INTERVAL)
        self._discovery.clear()
        return stripped

    async def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600,
                                    audiences: Iterable[str] = ()) -> str:
        """A token of ServiceAccount namespace/name from the TokenRequest API (the account must exist)."""
        spec: dict = {"expirationSeconds": seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        async with self.session() as s:
            async with s.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                              json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": spec}) as r:
                body = await response_body(r)
                if r.status != 201:
                    raise ApplyError(f"TokenRequest for {namespace}/{name} refused ({r.status}): "
                                     f"{body.get('message', body)}")
                return body["status"]["token"]


async def response_body(r: aiohttp.ClientResponse) -> dict:
    """The JSON answer, or the text of one that is not JSON (`404 page not found`) as its message."""
    text = await r.text()
    try:
        body = json.loads(text)
    except ValueError:
        return {"message": text.strip()}
    return body if isinstance(body, dict) else {"message": text.strip()}

