"""What the real-backend tests share: the binaries or a loud skip, a JWT issuer on loopback, kubectl.

The issuer serves its discovery document and keys over TLS (trustme) from a thread of its own, so that one
control plane per test module can trust it across tests, each of which runs in its own event loop.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading
import time

import trustme
from aiohttp import web
from jwcrypto import jwk, jwt

from lab.testing import real_binaries_or_skip

KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))


binaries_or_skip = real_binaries_or_skip
"""The built binaries; a loud skip when they are not there, a failure when PEERING_REQUIRE_REAL_APISERVER=1."""


class LoopbackIssuer:
    """An OIDC issuer `https://<host>` answering on 127.0.0.1:<port>: discovery and JWKS, nothing else."""

    def __init__(self, host: str = "issuer.test.lab") -> None:
        self.host = host
        self.url = f"https://{host}"
        self.ca = trustme.CA()
        self._serving = self.ca.issue_cert(host, "127.0.0.1")
        self.ca_pem = self.ca.cert_pem.bytes()
        self.key = jwk.JWK.generate(kty="RSA", size=2048, kid="loopback-issuer", alg="RS256", use="sig")
        self.port = 0
        self.fetched: list[str] = []  # paths kube-apiserver asked for
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def discovery(self) -> dict:
        return {"issuer": self.url, "jwks_uri": f"{self.url}/keys", "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": ["RS256"]}

    async def _serve_discovery(self, request: web.Request) -> web.Response:
        self.fetched.append(request.path)
        return web.json_response(self.discovery())

    async def _serve_keys(self, request: web.Request) -> web.Response:
        self.fetched.append(request.path)
        return web.json_response({"keys": [self.key.export_public(as_dict=True)]})

    async def _start(self) -> None:
        import ssl

        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._serve_discovery)
        app.router.add_get("/keys", self._serve_keys)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._serving.configure_cert(ctx)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="loopback-issuer", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the loopback JWT issuer did not start within 10 s")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def token(self, *, drop: tuple[str, ...] = (), **claims) -> str:
        """A signed id_token as Dex issues them after an exchange; `claims` override, `drop` removes."""
        now = int(time.time())
        body = {"iss": self.url, "sub": "CiQxMjM0EgZwZWVyLWI", "aud": "kubernetes", "iat": now, "exp": now + 600,
                "email": "peering:uuid-b:system:serviceaccount:d8-example:controller", "email_verified": True,
                "name": "controller of b", "groups": ["peering:uuid-b"]}
        body.update(claims)
        for k in drop:
            body.pop(k, None)
        t = jwt.JWT(header={"alg": "RS256", "kid": self.key.kid}, claims=body)
        t.make_signed_token(self.key)
        return t.serialize()


def kubectl(kubeconfig: pathlib.Path, home: pathlib.Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), KUBECONFIG=str(kubeconfig))
    return subprocess.run([KUBECTL, "--cache-dir", str(home / "kube-cache"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
