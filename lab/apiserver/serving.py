"""The emulated kube-apiserver's HTTP handling: authentication, non-resource paths, the reads of resources
(get, list, tables, pages) and the request bodies; `ApiServer` has these as its methods."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import secrets

import yaml
from aiohttp import web
from multidict import CIMultiDict

from lab.apiserver import conversion, decoding, discovery, errors, events, patch, protobuf, table, validation
from lab.apiserver.auth import impersonation, rbac, sensitive
from lab.apiserver.auth.authn import ANONYMOUS, bearer_token
from lab.apiserver.auth.types import Attributes, UserInfo
from lab.apiserver.hooks import WRITE_VERBS
from lab.apiserver.resources import ResourceInfo
from lab.apiserver.selectors import field_predicate, label_predicate
from lab.apiserver.request import (HEALTH_PREFIXES, MAX_BODY, RequestInfo, accepts_table, check_accept, copy_if,
                                   dump, json_response, parse_request, prefers_yaml, write_of)

log = logging.getLogger(__name__)


class Serving:
    """The HTTP side of `ApiServer` (lab/apiserver/app.py)."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._serve(request)
        except errors.PageNotFound:
            return web.Response(status=404, text="404 page not found\n", content_type="text/plain",
                                headers={"X-Content-Type-Options": "nosniff"})
        except errors.ApiError as exc:
            return json_response(exc.status(), exc.code)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except web.HTTPRequestEntityTooLarge:
            return json_response(errors.ApiError(
                413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}").status(), 413)
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            return json_response(errors.ApiError(500, "InternalError",
                                                  "an internal error occurred; the server log has the details")
                                  .status(), 500)

    def _forget_authentications(self, key, ev) -> None:
        # A ServiceAccount deleted or re-created revokes its tokens at once, cache or not.
        if key == ("", "serviceaccounts") and ev.type != "ADDED":
            self.auth_cache.clear()

    def _forget_decisions(self, key, ev) -> None:
        if key[0] == "rbac.authorization.k8s.io":
            self._decisions.clear()

    def authorize(self, user: UserInfo, attrs: Attributes):
        """The RBAC decision for a request, from the cache while no RBAC object changed."""
        key = (user.username, user.groups, attrs)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self.authorizer.authorize(user, attrs)
            if len(self._decisions) >= 10000:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    async def _authenticate(self, request: web.Request) -> UserInfo | None:
        der = None
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
        key = self.auth_cache.key(request.headers, der)
        user = self.auth_cache.get(key)
        if user is None:
            user = await self.authenticator.authenticate(request.headers, der)
            if user is not None:
                self.auth_cache.put(key, user)
        return user

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        user = await self._authenticate(request)
        if user is None:
            # A credential that does not authenticate is 401 wherever it is sent; no credential at all is the
            # anonymous user, whom RBAC lets read /version and the health checks (system:public-info-viewer), as a
            # kube-apiserver with anonymous requests on (kubeadm's default) does.
            if bearer_token(request.headers) is not None:
                raise errors.ApiError(401, "Unauthorized", "Unauthorized")
            user = ANONYMOUS
        if impersonation.impersonation_headers(request.headers):
            # Impersonate-* headers, honoured after authentication when RBAC allows the impersonate verb.
            user = impersonation.impersonate(user, request.headers, self.authorizer)
        info = parse_request(request.method, path, request.query)
        attrs = info.attributes()
        decision = self.authorize(user, attrs)
        if not decision.allowed:
            raise rbac.forbidden(user, attrs, "")
        if self.unavailable_apis:
            parts = path.split("/")
            if len(parts) >= 4 and parts[1] == "apis" and self._unavailable(parts[2], parts[3]):
                # kube-aggregator's proxy for an APIService that is not Available: plain text, not a Status.
                return web.Response(status=503, text="service unavailable\n", charset="utf-8",
                                    content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"})
        check_accept(request.headers.get("Accept", ""))
        if not info.resource_request:
            return await self._non_resource(request, info)
        response = await self._resource(request, info, user)
        if self.write_hooks.hooks and info.verb in WRITE_VERBS and response.status < 300 and \
                "dryRun" not in request.query:
            self.write_hooks.landed(write_of(info, user, response))
        return response

    # ------------------------------------------------------------ non-resource paths

    async def _non_resource(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        path = info.path.rstrip("/") or "/"
        if request.method not in ("GET", "HEAD"):
            raise errors.ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on {path}")
        accept = request.headers.get("Accept", "")
        if path in ("/healthz", "/readyz", "/livez") or path.startswith(HEALTH_PREFIXES):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return json_response(discovery.KUBE_VERSION)
        if path == "/.well-known/openid-configuration":
            return json_response(self.sa_issuer.discovery_document())
        if path == "/openid/v1/jwks":
            # kube-apiserver serves the keys only as application/jwk-set+json: an Accept that names neither it nor
            # */* (application/json alone, as most clients send; application/* too) is a 406 Status.
            media = {part.split(";")[0].strip().lower() for part in accept.split(",")} if accept else {"*/*"}
            if not media & {"application/jwk-set+json", "*/*"}:
                raise errors.ApiError(406, "NotAcceptable",
                                      "406: Not Acceptable\n\nAvailable representations: application/jwk-set+json")
            return web.Response(body=dump(self.sa_issuer.jwks()), content_type="application/jwk-set+json")
        if path == "/api":
            if discovery.wants_aggregated(accept):
                return web.Response(body=dump(discovery.aggregated(self.registry, legacy=True)),
                                    headers={"Content-Type": discovery.AGGREGATED_CONTENT_TYPE})
            return json_response(discovery.api_versions(f"127.0.0.1:{self.port}"))
        if path == "/apis":
            if discovery.wants_aggregated(accept):
                return web.Response(body=dump(discovery.aggregated(self.registry, legacy=False,
                                                                    unavailable=self.unavailable_apis)),
                                    headers={"Content-Type": discovery.AGGREGATED_CONTENT_TYPE})
            return json_response(discovery.api_group_list(self.registry, self.unavailable_apis))
        parts = [p for p in path.split("/") if p]
        if not parts:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v3", "/readyz", "/version",
                     "/.well-known/openid-configuration", "/openid/v1/jwks"]
            for g in self.registry.groups():
                if g:
                    paths += [f"/apis/{g}"] + [f"/apis/{g}/{v}" for v in self.registry.versions(g)]
            for g, versions in self.unavailable_apis.items():
                paths += [f"/apis/{g}"] + [f"/apis/{g}/{v}" for v in versions]
            return json_response({"paths": sorted(paths)})
        if parts[0] == "api" and len(parts) == 2:
            doc = discovery.resource_list(self.registry, "", parts[1])
            if doc:
                return json_response(doc)
        if parts[0] == "apis" and len(parts) == 2:
            doc = discovery.api_group(self.registry, parts[1], self.unavailable_apis)
            if doc:
                return json_response(doc)
        if parts[0] == "apis" and len(parts) == 3:
            doc = discovery.resource_list(self.registry, parts[1], parts[2])
            if doc:
                return json_response(doc)
        if path == "/openapi/v3":
            return json_response(discovery.openapi_v3_root(self.registry))
        if parts[:2] == ["openapi", "v3"] and len(parts) >= 4:
            group, version = ("", parts[3]) if parts[2] == "api" else (parts[3], parts[4] if len(parts) > 4 else "")
            doc = discovery.openapi_v3_document(self.registry, group, version)
            if doc:
                return json_response(doc)
        raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    # ------------------------------------------------------------ resource requests

    def _resource_info(self, info: RequestInfo) -> ResourceInfo:
        res = self.registry.get(info.group, info.version, info.plural)
        if res is None:
            raise errors.PageNotFound()
        if res.namespaced and info.namespace is None and (info.name or info.verb == "create"):
            raise errors.ApiError(404, "NotFound", f"{info.plural} is namespaced: name the namespace in the path "
                                                   f"(/namespaces/<ns>/{info.plural}/{info.name})")
        if not res.namespaced and info.plural != "namespaces" and info.namespace is not None:
            # A cluster-scoped resource under /namespaces/<ns>/: kube-apiserver serves no such path.
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if info.subresource and info.subresource not in res.subresources:
            if res.custom and info.name:
                # kube-apiserver serves no such path for a custom resource: the object "is not found" there.
                raise errors.not_found(res.group, res.plural, info.name)
            raise errors.ApiError(404, "NotFound", f'{info.plural} has no subresource "{info.subresource}"')
        if info.verb not in res.verbs and not info.subresource:
            raise errors.ApiError(405, "MethodNotAllowed",
                                  f"{info.verb} is not supported on {info.plural}; it supports {', '.join(res.verbs)}")
        return res

    def _masker(self, res: ResourceInfo, user: UserInfo, attrs: Attributes):
        """A function presenting objects to this user: version and sensitive-field masking."""
        must_mask = bool(res.sensitive_paths) and not self.authorize(
            user, sensitive.sensitive_attributes(attrs)).allowed
        paths = list(res.sensitive_paths)
        api_version = res.group_version

        def present(obj: dict) -> dict:
            if res.storage == events.CORE_KEY:
                obj = events.from_core(obj, res.version)
            elif res.custom:
                obj = conversion.to_version(res, obj)
            elif obj.get("apiVersion") not in (None, api_version):
                obj = dict(obj, apiVersion=api_version)
            return sensitive.mask(obj, paths) if must_mask else obj

        return present

    async def _body(self, request: web.Request, allow_yaml: bool = True):
        raw = await request.read()
        if not raw:
            raise errors.bad_request("the request needs a body: the object to write, as JSON")
        ctype = request.content_type
        if ctype == protobuf.MEDIA_TYPE:
            return protobuf.decode(raw)
        try:
            if ctype in ("application/yaml", patch.APPLY_YAML) and allow_yaml:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the body is not valid {'YAML' if 'yaml' in ctype else 'JSON'}: {exc}")

    async def _decoded_body(self, request: web.Request, res: ResourceInfo, field_validation: str):
        """The object of a create or update (`decoding.Body`, with its decoding's warnings)."""
        raw = await request.read()
        if request.content_type in ("application/json", "") and raw:
            body = decoding.strict_json(raw, res, field_validation)
            if body is not None:
                return body
        body = await self._body(request)
        return decoding.Body(body, []) if isinstance(body, dict) else body

    @staticmethod
    def _field_validation(query, options_kind: str = "PatchOptions") -> str:
        value = query.get("fieldValidation", "Warn") or "Warn"
        if value not in ("Strict", "Warn", "Ignore"):
            raise errors.invalid(options_kind, "meta.k8s.io", "", [validation.cause(
                "FieldValueNotSupported", "fieldValidation", f"Unsupported value: {json.dumps(value)}: supported "
                'values: "", "Ignore", "Strict", "Warn"')])
        return value

    @staticmethod
    def _dry_run(query) -> bool:
        values = query.getall("dryRun", []) if hasattr(query, "getall") else []
        if any(v not in ("All",) for v in values):
            raise errors.bad_request('dryRun accepts only "All"')
        return bool(values)

    @staticmethod
    def _warnings_header(warnings: list[str]) -> CIMultiDict:
        # One Warning header per warning, as kube-apiserver sends them.
        return CIMultiDict(("Warning", "299 - " + json.dumps(w)) for w in warnings)

    async def _resource(self, request: web.Request, info: RequestInfo, user: UserInfo) -> web.StreamResponse:
        res = self._resource_info(info)
        attrs = info.attributes()
        query = request.query
        verb = info.verb
        if res.create_only or (res.key == ("", "serviceaccounts") and info.subresource == "token"):
            return await self._review(request, info, res, user)
        if verb == "get":
            obj = self._get_or_404(res, info)
            present = self._masker(res, user, attrs)
            if info.subresource and info.subresource != "status":
                raise errors.ApiError(405, "MethodNotAllowed", f"get is not supported on {info.subresource}")
            return self._respond_objects(request, res, [present(obj)], single=True)
        if verb == "list":
            objs, list_meta = self._page(res, info, query)
            present = self._masker(res, user, attrs)
            return self._respond_objects(request, res, [present(o) for o in objs], single=False,
                                         list_meta=list_meta)
        if verb == "watch":
            return await self._watch(request, res, info, user, attrs)
        if verb == "create":
            if info.name and not info.subresource:
                raise errors.ApiError(405, "MethodNotAllowed", "POST goes to the collection, not to a named object")
            fv = self._field_validation(query, "CreateOptions")
            body = await self._decoded_body(request, res, fv)
            self._check_rbac_write(res, body, user, info.namespace)
            self._check_owner_references(res, body, None, user, info.namespace)
            obj, warnings = await self._admitted(
                "create", res, info, user, self._dry_run(query),
                lambda dry, copied: self.objects.create(res, copy_if(body, copied), info.namespace, fv, dry))
            return json_response(self._masker(res, user, attrs)(obj), 201,
                                  self._warnings_header(body.pop_warnings() + warnings))
        if verb == "update":
            fv = self._field_validation(query, "UpdateOptions")
            body = await self._decoded_body(request, res, fv)
            if info.subresource and info.subresource != "status":
                raise errors.ApiError(405, "MethodNotAllowed", f"update is not supported on {info.subresource}")
            if info.subresource != "status":
                self._check_rbac_write(res, body, user, info.namespace)
                self._check_owner_references(res, body, self.store.get(
                    res.key, info.namespace if res.namespaced else None, info.name), user, info.namespace)
            if res.has_generation and isinstance(body, dict) and not (body.get("metadata") or {}).get(
                    "resourceVersion"):
                # Custom resources and CRDs refuse an unconditional update (AllowUnconditionalUpdate is false).
                # kube-apiserver names the resource by its plural here, and the missing value as 0.
                raise errors.invalid(res.plural, res.group, info.name, [validation.cause(
                    "FieldValueInvalid", "metadata.resourceVersion", "Invalid value: 0: must be specified for an "
                    "update")])
            obj, warnings = await self._admitted(
                "update", res, info, user, self._dry_run(query),
                lambda dry, copied: self.objects.update(res, copy_if(body, copied), info.namespace, info.name,
                                                        info.subresource or None, fv, dry))
            return json_response(self._masker(res, user, attrs)(obj), 200,
                                  self._warnings_header(body.pop_warnings() + warnings))
        if verb == "patch":
            return await self._patch(request, res, info, user, attrs)
        if verb == "delete":
            return await self._delete(request, res, info, user)
        if verb == "deletecollection":
            for obj in self._select(res, info, query):
                try:
                    one = dataclasses.replace(info, name=obj["metadata"]["name"])
                    await self._admitted("delete", res, one, user, False, lambda dry, _, obj=obj: self.objects.delete(
                        res, obj["metadata"].get("namespace"), obj["metadata"]["name"], query.get("propagationPolicy"),
                        dry_run=dry))
                except errors.ApiError as exc:
                    if exc.code != 404:
                        raise
            return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        raise errors.ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    def _get_or_404(self, res: ResourceInfo, info: RequestInfo) -> dict:
        ns = info.namespace if res.namespaced else None
        obj = self.store.get(res.key, ns, info.name)
        if obj is None:
            raise errors.not_found(res.group, res.plural, info.name)
        return obj

    def _select(self, res: ResourceInfo, info: RequestInfo, query) -> list[dict]:
        ns = info.namespace if res.namespaced else None
        objs = self.store.list(res.key, ns)
        lp = label_predicate(query.get("labelSelector"))
        fp = field_predicate(query.get("fieldSelector"), res.group, res.plural, res.custom)
        if lp or fp:
            objs = [o for o in objs if (lp is None or lp(o)) and (fp is None or fp(o))]
        return objs

    def _page(self, res: ResourceInfo, info: RequestInfo, query) -> tuple[list[dict], dict]:
        """One page of a list (`limit`, `continue`), served from a snapshot so the pages are consistent."""
        token = query.get("continue")
        limit_text = query.get("limit")
        try:
            limit = int(limit_text) if limit_text else 0
        except ValueError:
            raise errors.bad_request(f'strconv.ParseInt: parsing "{limit_text}": invalid syntax')
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                snapshot_id, offset = state["id"], int(state["offset"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("the continue token is malformed; pass the one a list answered with")
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None:
                raise errors.ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                                      "consistent list result. You can start a new list without "
                                                      "the continue parameter.")
            objs, rv = snapshot
        else:
            objs, rv, offset, snapshot_id = self._select(res, info, query), self.store.current_rv, 0, None
        meta = {"resourceVersion": str(rv)}
        if limit <= 0 or offset + limit >= len(objs):
            return objs[offset:], meta
        if snapshot_id is None:
            snapshot_id = secrets.token_hex(8)
            self._snapshots[snapshot_id] = (objs, rv)
            while len(self._snapshots) > 64:
                self._snapshots.popitem(last=False)
        meta["continue"] = base64.urlsafe_b64encode(
            json.dumps({"id": snapshot_id, "offset": offset + limit}).encode()).decode()
        if not query.get("labelSelector") and not query.get("fieldSelector"):
            # With a selector kube-apiserver cannot know how many items are left, and says nothing.
            meta["remainingItemCount"] = len(objs) - offset - limit
        return objs[offset:offset + limit], meta

    def _respond_objects(self, request: web.Request, res: ResourceInfo, objs: list[dict], single: bool,
                         list_meta: dict | None = None):
        if prefers_yaml(request.headers.get("Accept", "")):
            resp = self._respond_objects_json(request, res, objs, single, list_meta)
            # The same document in YAML, as kube-apiserver serves a client that asks for it first.
            return web.Response(body=yaml.safe_dump(json.loads(resp.body), sort_keys=True).encode(),
                                status=resp.status, content_type="application/yaml")
        return self._respond_objects_json(request, res, objs, single, list_meta)

    def _respond_objects_json(self, request: web.Request, res: ResourceInfo, objs: list[dict], single: bool,
                              list_meta: dict | None = None):
        list_meta = list_meta or {"resourceVersion": str(self.store.current_rv)}
        if accepts_table(request.headers.get("Accept", "")):
            include = request.query.get("includeObject", "Metadata")
            rv = objs[0]["metadata"].get("resourceVersion", "") if single else list_meta["resourceVersion"]
            out = table.table(res, objs, rv, include, version=table.table_version(request.headers["Accept"]))
            if not single:
                out["metadata"] = dict(list_meta)
            return json_response(out)
        if single:
            return json_response(objs[0])
        if not res.custom:
            # A built-in list is typed: its items carry no apiVersion and kind (custom resources' items do).
            objs = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in objs]
        return json_response({"kind": res.kind + "List", "apiVersion": res.group_version,
                               "metadata": list_meta, "items": objs})

