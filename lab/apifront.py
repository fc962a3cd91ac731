"""A front of a real kube-apiserver for the peering process, for the tests that make a cluster publish keys no
real kube-apiserver would.

On the emulator a test replaces what the API server serves at `/openid/v1/jwks` in place
(`cluster.api.sa_issuer.jwks = lambda: {...}`, `del cluster.api.sa_issuer.jwks` to restore). A real
kube-apiserver always serves its own key, so a lab cluster started with `api_front=True` on the real backend gives
its peering process a kubeconfig whose server is this front: TLS with the API server's own certificate (it names
`api.<c>.lab` and 127.0.0.1), every request passed to kube-apiserver as it came (method, path, query, headers
with the bearer token, body) and every answer passed back as it came (status, headers, a watch's stream chunk by
chunk), except `/openid/v1/jwks` while the test has replaced `sa_issuer.jwks`.

It adds nothing and refuses nothing: authentication, authorization and every answer are kube-apiserver's. One
fault it can add: `hold(resource, seconds)` holds the creations of a resource (a POST to its collection) that long
before passing them on, as a slow API server or a busy control loop would (a test's peering process then writes
its RoleBindings late).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import aiohttp
from aiohttp import web

from lab.ingress import pass_back

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 7.6.1) and those the two HTTP connections set for themselves.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length"}
JWKS_PATH = "/openid/v1/jwks"


class ApiFront:
    """`ApiFront(api, upstream_url, upstream_ssl, serving_ssl)`; `start()` binds 127.0.0.1 on a port the OS picks."""

    def __init__(self, api: Any, upstream: str, upstream_ssl: ssl.SSLContext, serving_ssl: ssl.SSLContext) -> None:
        self.api = api
        self.upstream = upstream.rstrip("/")
        self._upstream_ssl = upstream_ssl
        self._serving_ssl = serving_ssl
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self.replaced_answers = 0
        self.passed_answers = 0  # answers of kube-apiserver passed back, whole or cut
        self.passing = 0  # answers being passed back now (a watch's until it ends)
        #: resource (a collection's last path segment, e.g. "rolebindings") -> seconds its creations are held.
        self.held: dict[str, float] = {}

    def hold(self, resource: str, seconds: float) -> None:
        """Hold every creation of `resource` `seconds` before it goes to kube-apiserver (0: not any more)."""
        if seconds > 0:
            self.held[resource] = seconds
        else:
            self.held.pop(resource, None)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._upstream_ssl),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._serving_ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _replaced_jwks(self):
        """The test's replacement of `sa_issuer.jwks`, or None (the instance attribute shadows the method)."""
        return vars(self.api.sa_issuer).get("jwks")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        replaced = self._replaced_jwks()
        if replaced is not None and request.method == "GET" and request.path == JWKS_PATH:
            self.replaced_answers += 1
            return web.Response(body=json.dumps(replaced()).encode(), content_type="application/jwk-set+json")
        assert self._session is not None
        held = self.held.get(request.path.rstrip("/").rsplit("/", 1)[-1]) if request.method == "POST" else None
        if held:
            await asyncio.sleep(held)  # the fault itself: this creation reaches kube-apiserver late
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read() if request.can_read_body else None
        try:
            upstream = await self._session.request(request.method, self.upstream + request.raw_path,
                                                   headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ClientError, OSError) as e:
            log.info("api front: %s %s: kube-apiserver unreachable (%s)", request.method, request.path, e)
            return web.Response(status=502, text="the lab's kube-apiserver is unreachable\n")
        self.passing += 1
        try:
            async with upstream:
                self.passed_answers += 1
                return await pass_back(request, upstream)
        finally:
            self.passing -= 1
