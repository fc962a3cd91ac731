"""The emulated kube-apiserver's writes over HTTP: RBAC and owner-reference checks, patch and apply, delete,
admission, the reviews, and watches; `ApiServer` has these as its methods."""

from __future__ import annotations

import asyncio
import copy
import json

from aiohttp import web

from lab.apiserver import admission, conversion, errors, events, patch, table, validation
from lab.apiserver.auth import ownerrefs, reviews
from lab.apiserver.auth.types import UserInfo
from lab.apiserver.crud import CRD_KEY
from lab.apiserver.resources import ResourceInfo
from lab.apiserver.selectors import field_predicate, label_predicate
from lab.apiserver.request import REVIEWS, RequestInfo, ReviewContext, copy_if, dump, json_response



class Writing:
    """The writes and watches of `ApiServer` (lab/apiserver/app.py)."""

    def _check_rbac_write(self, res: ResourceInfo, body, user: UserInfo, namespace: str | None) -> None:
        """RBAC's escalation prevention: grant only what you hold, unless you may escalate or bind."""
        if res.group != "rbac.authorization.k8s.io" or not isinstance(body, dict):
            return
        obj = dict(body, kind=res.kind)
        obj["metadata"] = dict(body.get("metadata") or {})
        if res.namespaced and namespace:
            obj["metadata"]["namespace"] = namespace
        if res.plural in ("roles", "clusterroles"):
            decision = self.authorizer.check_role_write(user, obj)
        else:
            decision = self.authorizer.check_binding_write(user, obj)
        if not decision.allowed and decision.missing_role:
            # kube-apiserver looks the role up to compare its rules, and answers its absence as a 404 (naming
            # the role, under the binding's resource).
            raise errors.not_found(res.group, res.plural, decision.missing_role)
        if not decision.allowed:
            name = obj["metadata"].get("name", "")
            raise errors.ApiError(403, "Forbidden",
                                  f'{res.plural}.{res.group} "{name}" is forbidden: {decision.reason}',
                                  {"name": name, "group": res.group, "kind": res.plural})

    def _check_owner_references(self, res: ResourceInfo, obj, old: dict | None, user: UserInfo,
                                namespace: str | None) -> None:
        ownerrefs.admit(res, obj, old, namespace, self.registry, lambda attrs: self.authorize(user, attrs))

    async def _patch(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo, attrs) -> web.Response:
        ctype = request.content_type
        query = request.query
        accepted = [patch.JSON_PATCH, patch.MERGE, patch.APPLY_YAML] + ([] if res.custom else [patch.STRATEGIC])
        if ctype not in accepted:
            # Strategic merge patch needs the Go types' patch strategies: custom resources have none. (The two
            # answers are kube-apiserver's own: the built-ins' comes from content negotiation.)
            if not res.custom:
                raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
            raise errors.ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                  f"accepted media types include: {', '.join(accepted)}")
        if info.subresource and info.subresource != "status":
            raise errors.ApiError(405, "MethodNotAllowed", f"patch is not supported on {info.subresource}")
        try:
            body = await self._body(request)
        except errors.ApiError as exc:
            if exc.code != 400 or ctype == patch.APPLY_YAML:
                raise
            raise errors.bad_request("invalid JSON patch") from None
        ns = info.namespace if res.namespaced else None
        stored = existing = self.store.get(res.key, ns, info.name)
        if existing is not None and res.storage == events.CORE_KEY:
            existing = events.from_core(existing, res.version)   # patches apply to the form the client sees
        elif existing is not None:
            existing = conversion.to_version(res, existing)
        fv = self._field_validation(query)
        dry = self._dry_run(query)
        if ctype == patch.APPLY_YAML:
            manager = query.get("fieldManager")
            if not manager:
                raise errors.bad_request("fieldManager is required for apply requests (add ?fieldManager=<name>)")
            if not isinstance(body, dict):
                raise errors.bad_request("an apply patch is a whole object: apiVersion, kind, metadata and fields")
            body_meta = body.get("metadata") or {}
            if body_meta.get("name") and body_meta["name"] != info.name:
                raise errors.bad_request(f'the name in the body ({body_meta["name"]}) does not match the URL '
                                         f"({info.name})")
            slot = (res.key, ns or "", info.name, manager, info.subresource)
            previous = self._apply_previous.get(slot) if existing is not None else None
            applied = copy.deepcopy(body)
            if existing is None:
                if info.subresource:
                    raise errors.not_found(res.group, res.plural, info.name)
                new_obj = copy.deepcopy(body)
                new_obj.setdefault("metadata", {})["name"] = info.name
                self._check_rbac_write(res, new_obj, user, ns)
                self._check_owner_references(res, new_obj, None, user, ns)
                obj, warnings = await self._admitted(
                    "create", res, info, user, dry,
                    lambda d, copied: self.objects.create(res, copy_if(new_obj, copied), ns, fv, d))
                status = 201
            else:
                self._apply_ownership(res, ns, info, manager, existing, applied, query.get("force") == "true")
                merged = patch.server_side_apply(existing, applied, previous)
                merged.setdefault("metadata", {})["resourceVersion"] = (
                    (body.get("metadata") or {}).get("resourceVersion") or existing["metadata"]["resourceVersion"])
                if not info.subresource:
                    self._check_rbac_write(res, merged, user, ns)
                    self._check_owner_references(res, merged, existing, user, ns)
                obj, warnings = await self._admitted(
                    "patch", res, info, user, dry,
                    lambda d, copied: self.objects.update(res, copy_if(merged, copied), ns, info.name,
                                                          info.subresource or None, fv, d, existing=stored))
                status = 200
            if not dry:
                self._apply_previous[slot] = applied
            return json_response(self._masker(res, user, attrs)(obj), status, self._warnings_header(warnings))
        if existing is None:
            raise errors.not_found(res.group, res.plural, info.name)
        if ctype == patch.JSON_PATCH:
            patched = patch.json_patch(existing, body)
        else:
            if not isinstance(body, dict):
                raise errors.bad_request("a merge patch is a JSON object")
            if ctype == patch.STRATEGIC:
                patched = patch.strategic_merge_patch(existing, body)
            else:
                patched = patch.merge_patch(existing, body)
        if not isinstance(patched, dict):
            raise errors.ApiError(422, "Invalid", "the patch turned the object into something other than an object")
        if not info.subresource:
            self._check_rbac_write(res, patched, user, ns)
            self._check_owner_references(res, patched, existing, user, ns)
        obj, warnings = await self._admitted(
            "patch", res, info, user, dry,
            lambda d, copied: self.objects.update(res, copy_if(patched, copied), ns, info.name,
                                                  info.subresource or None, fv, d, existing=stored))
        return json_response(self._masker(res, user, attrs)(obj), 200, self._warnings_header(warnings))

    def _apply_ownership(self, res: ResourceInfo, ns: str | None, info: RequestInfo, manager: str, live: dict,
                         applied: dict, force: bool) -> None:
        """Server-side apply's conflicts among appliers: changing a field another manager applied is a 409
        naming it, unless forced, which moves the field to this manager."""
        prefix = (res.key, ns or "", info.name)
        others = {s[3]: cfg for s, cfg in self._apply_previous.items()
                  if s[:3] == prefix and s[4] == info.subresource and s[3] != manager}
        found = patch.apply_conflicts(live, applied, others)
        if not found:
            return
        if not force:
            by_manager = ", ".join(f'conflict with "{m}": {f}' for f, m in found)
            raise errors.ApiError(
                409, "Conflict",
                f"Apply failed with {len(found)} conflict{'s' if len(found) > 1 else ''}: {by_manager}",
                {"name": info.name, "group": res.group, "kind": res.plural,
                 "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": f}
                            for f, m in found]})
        for other in {m for _, m in found}:
            slot = prefix + (other, info.subresource)
            self._apply_previous[slot] = patch.drop_fields(self._apply_previous[slot],
                                                           [f for f, m in found if m == other])

    async def _delete(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo) -> web.Response:
        options = {}
        if request.can_read_body:
            raw = await request.read()
            if raw:
                try:
                    options = json.loads(raw)
                except ValueError as exc:
                    raise errors.bad_request(f"the DeleteOptions body is not valid JSON: {exc}")
        propagation = request.query.get("propagationPolicy") or options.get("propagationPolicy")
        if options.get("orphanDependents") is True and not propagation:
            propagation = "Orphan"
        ns = info.namespace if res.namespaced else None
        (obj, deleted), admitted = await self._admitted(
            "delete", res, info, user, self._dry_run(request.query),
            lambda dry, _: self.objects.delete(res, ns, info.name, propagation, options.get("preconditions"), dry),
            result_warnings=False)
        if deleted:
            for slot in [s for s in self._apply_previous if s[:3] == (res.key, ns or "", info.name)]:
                del self._apply_previous[slot]
        if deleted and res.key != CRD_KEY:
            meta = obj["metadata"]
            return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                   "details": errors.details(meta["name"], res.group, res.plural,
                                                             uid=meta.get("uid"))})
        # 202 only where kube-apiserver still gives it: a deletion left pending with orphanDependents=false.
        pending_cascade = not deleted and options.get("orphanDependents") is False
        return json_response(self._masker(res, user, info.attributes())(obj), 202 if pending_cascade else 200,
                              self._warnings_header(admitted))

    async def _admitted(self, verb: str, res: ResourceInfo, info: "RequestInfo", user: UserInfo, dry: bool, write,
                        *, result_warnings: bool = True):
        """`write(dry_run, copied)` after the validating webhooks whose rules match allowed it (admission.py): they
        are sent what the write would store (a dry run of it, on copies of its input), and the write is made once
        they all allowed it and nothing changed the object meanwhile. The write's result with the webhooks'
        warnings added (a create's or update's), or the result and the warnings apart (a delete's)."""
        operation = admission.OPERATIONS[verb]
        hooks = [h for h in admission.webhooks_of(self.store.list(admission.KEY, None))
                 if h.matches(operation, res, info.subresource or None)]
        if not hooks:
            result = write(dry, False)
            return result if result_warnings else (result, [])
        ns = info.namespace if res.namespaced else None
        for _ in range(3):
            stored = self.store.get(res.key, ns, info.name) if info.name else None
            candidate = write(True, True)[0]
            old = conversion.to_version(res, stored) if stored is not None else None
            new = None if operation == "DELETE" else conversion.to_version(res, candidate)
            name = info.name or (candidate.get("metadata") or {}).get("name", "")
            review = admission.review_request(operation, res, info.subresource or None, user, name, ns,
                                              copy.deepcopy(new), copy.deepcopy(old), dry)
            warnings = await admission.admit(hooks, review)
            if (self.store.get(res.key, ns, info.name) if info.name else None) is stored:
                result = write(dry, False)
                if not result_warnings:
                    return result, warnings
                return result[0], result[1] + warnings
        raise errors.conflict(res.group, res.plural, info.name, "the object changed while admission webhooks "
                                                                 "reviewed the write; try again")

    async def _review(self, request, info: RequestInfo, res: ResourceInfo, user: UserInfo) -> web.Response:
        if request.method != "POST":
            raise errors.ApiError(405, "MethodNotAllowed", f"{res.plural} can only be created (POST)")
        body = await self._body(request, allow_yaml=False)
        if not isinstance(body, dict):
            raise errors.bad_request("the body must be a JSON object")
        ctx = ReviewContext(user=user, namespace=info.namespace, name=info.name, authorizer=self.authorizer,
                            authenticator=self.authenticator, sa_issuer=self.sa_issuer,
                            list_objects=self.list_objects)
        if info.subresource == "token":
            self._get_or_404(res, info)
            out = await reviews.token_request(ctx, body)
        else:
            out = await REVIEWS[res.key](ctx, body)
        return json_response(out, 201)

    # ------------------------------------------------------------ watch

    async def _watch(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo, attrs) -> web.StreamResponse:
        query = request.query
        ns = info.namespace if res.namespaced else None
        lp = label_predicate(query.get("labelSelector"))
        fp = field_predicate(query.get("fieldSelector"), res.group, res.plural, res.custom)
        if info.name:   # GET /watch/.../name, the deprecated form
            fp_name = field_predicate(f"metadata.name={info.name}")
            fp = fp_name if fp is None else (lambda o, a=fp, b=fp_name: a(o) and b(o))
        predicate = None
        if lp or fp:
            def predicate(o, lp=lp, fp=fp):
                return (lp is None or lp(o)) and (fp is None or fp(o))
        rv_text = query.get("resourceVersion", "")
        send_initial = query.get("sendInitialEvents") == "true"
        match = query.get("resourceVersionMatch", "")
        problems = []
        if "sendInitialEvents" in query and match != "NotOlderThan":
            problems.append(validation.cause("FieldValueForbidden", "resourceVersionMatch",
                                             "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                                             "NotOlderThan"))
        if match and match != "NotOlderThan":
            problems.append(validation.cause("FieldValueNotSupported", "resourceVersionMatch",
                                             f'Unsupported value: {json.dumps(match)}: supported values: '
                                             '"NotOlderThan"'))
        if problems:
            raise errors.invalid("ListOptions", "meta.k8s.io", "", problems)
        try:
            rv = int(rv_text) if rv_text else None
        except ValueError:
            # kube-apiserver's own answer: a 500 without a reason (the storage layer's parse error).
            raise errors.ApiError(500, None, f'resourceVersion: Invalid value: "{rv_text}": strconv.ParseUint: '
                                             f'parsing "{rv_text}": invalid syntax')
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = query.get("timeoutSeconds")
        deadline = None
        loop = asyncio.get_running_loop()
        if timeout:
            try:
                deadline = loop.time() + max(0, int(timeout))
            except ValueError:
                raise errors.bad_request(f'timeoutSeconds "{timeout}" is not a number of seconds')
        table_version = table.table_version(request.headers.get("Accept", ""))
        as_table = table_version is not None
        if as_table:
            table.table(res, [], "", query.get("includeObject", "Metadata"))   # refuses a bad includeObject now
        present = self._masker(res, user, attrs)
        initial = None
        if rv in (None, 0) or send_initial:
            initial = self.store.list(res.key, ns)
            rv = None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        await resp.prepare(request)
        try:
            w = self.store.watch(res.key, ns, predicate, rv, initial)
        except errors.ApiError as exc:
            # kube-apiserver's watch cache says "too old" inside the stream, as an ERROR event.
            await resp.write(dump({"type": "ERROR", "object": exc.status()}) + b"\n")
            return resp
        self._watchers.add(w)
        columns_sent = False
        # The end of the initial events is a bookmark, sent only to a client that takes bookmarks.
        initial_pending = w.queue.qsize() if send_initial and bookmarks else -1

        def encode(kind: str, obj: dict) -> bytes:
            nonlocal columns_sent
            obj = present(obj)
            if as_table:
                obj = table.table(res, [obj], obj["metadata"].get("resourceVersion", ""),
                                  query.get("includeObject", "Metadata"), with_columns=not columns_sent,
                                  version=table_version)
                columns_sent = True
            return dump({"type": kind, "object": obj}) + b"\n"

        def bookmark(extra_annotations: dict | None = None) -> bytes:
            meta = {"resourceVersion": str(self.store.current_rv)}
            if extra_annotations:
                meta["annotations"] = extra_annotations
            return dump({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.group_version,
                                                         "metadata": meta}}) + b"\n"

        try:
            if initial_pending == 0:
                await resp.write(bookmark({"k8s.io/initial-events-end": "true"}))
            next_bookmark = loop.time() + self.bookmark_interval
            while not self._stopping:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    await resp.write(bookmark())
                    next_bookmark = now + self.bookmark_interval
                try:
                    item = w.queue.get_nowait()
                except asyncio.QueueEmpty:
                    wait = 5.0   # wake now and then to notice a client that went away
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    if deadline is not None:
                        wait = min(wait, deadline - now)
                    try:
                        item = await asyncio.wait_for(w.queue.get(), max(wait, 0.001))
                    except asyncio.TimeoutError:
                        if request.transport is None or request.transport.is_closing():
                            break
                        continue
                if item is None and w.closed:
                    break   # the resource's CRD was deleted: the stream ends without an error event
                if item is None or w.overflowed:
                    if not self._stopping:
                        await resp.write(dump({"type": "ERROR", "object": errors.gone(
                            "the watch fell too far behind and was closed; list again and watch from the new "
                            "resourceVersion").status()}) + b"\n")
                    break
                await resp.write(encode(*item))
                if initial_pending > 0:
                    initial_pending -= 1
                    if initial_pending == 0:
                        await resp.write(bookmark({"k8s.io/initial-events-end": "true"}))
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._watchers.discard(w)
            self.store.unwatch(res.key, w)
        return resp

