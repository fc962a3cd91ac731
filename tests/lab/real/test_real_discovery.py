"""How kube-apiserver reaches a lab issuer whose name resolves nowhere: what works and what does not.

Deckhouse sets `discoveryURL` to Dex's in-cluster Service. In the lab an issuer's name (`https://dex.a.lab`)
exists only in the lab's resolver map. A `discoveryURL` on 127.0.0.1 reaches the discovery document (whose issuer
must still be `issuer.url`), but the document's `jwks_uri` names the issuer's host again, so the keys are out of
reach without the lab's CONNECT proxy; with it, both work, with or without `discoveryURL`.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from real_support import LoopbackIssuer

from lab import certs
from lab.real import JWTIssuer, RealControlPlane


async def whoami(plane, token):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{plane.url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                          headers={"Authorization": f"Bearer {token}"},
                          ssl=certs.client_ssl_context(plane.ca_pem)) as r:
            return r.status


async def until(check, timeout, what):
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(0.1)


def log_of(plane) -> str:
    return plane.files.log("kube-apiserver").read_text(errors="replace")


@pytest.fixture(scope="module")
def issuer():
    iss = LoopbackIssuer("issuer.discovery.lab")
    iss.start()
    yield iss
    iss.stop()


async def test_a_discovery_url_on_loopback_with_the_proxy_works(binaries, issuer, tmp_path):
    discovery = f"https://{issuer.address}/.well-known/openid-configuration"
    plane = RealControlPlane("d", tmp_path, binaries=binaries, resolve={issuer.host: issuer.address},
                             jwt_issuer=JWTIssuer(issuer.url, issuer.ca_pem, discovery_url=discovery))
    await plane.start()
    try:
        async def accepted():
            return await whoami(plane, issuer.token()) == 201
        await until(accepted, 30, "a good token being accepted")
        # The keys were fetched by the issuer's name, through the proxy (the discovery document from 127.0.0.1,
        # which Go never proxies: the next test shows it arriving with no proxy at all).
        assert f"CONNECT {issuer.host}:443" in plane.files.log("proxy").read_text()
        assert "/keys" in issuer.fetched
    finally:
        await plane.stop()


async def test_a_discovery_url_alone_cannot_reach_the_keys(binaries, issuer, tmp_path):
    discovery = f"https://{issuer.address}/.well-known/openid-configuration"
    plane = RealControlPlane("e", tmp_path, binaries=binaries, resolve={},
                             jwt_issuer=JWTIssuer(issuer.url, issuer.ca_pem, discovery_url=discovery))
    fetched_before = issuer.fetched.count("/.well-known/openid-configuration")
    await plane.start()
    try:
        async def discovered():
            return issuer.fetched.count("/.well-known/openid-configuration") > fetched_before
        await until(discovered, 30, "kube-apiserver reading the discovery document from 127.0.0.1")
        assert await whoami(plane, issuer.token()) == 401

        async def said_why():
            return f"lookup {issuer.host}" in log_of(plane)
        await until(said_why, 15, f"kube-apiserver logging that {issuer.host} does not resolve")
    finally:
        await plane.stop()
