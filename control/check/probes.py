"""What `peering check` asks the network, now, from where it runs, as another cluster would: do the peering and
peering-gateway names resolve, does the join endpoint serve trusted TLS and answer as the module's join listener,
does the entrance refuse a connection without a client certificate and present the module's own certificate (the
self-check's probe, `control.selfcheck.probe`), does Dex answer its discovery document and accept the module's
client at its token endpoint (a request it refuses for its missing token, so nothing is exchanged), and does each
peer's entrance answer an offer pull over mTLS with this cluster's client certificate (`GET /peering/v1/offer`,
which changes nothing there).

Every probe is bounded by its own timeout (`bounded`): one that does not answer in time fails as such, so the
check ends within it. Names resolve through `--resolve` overrides first (the lab's names, or a port-forward), then
DNS. Trust is the machine's (SSL_CERT_FILE is honoured), as a peer's module trusts the public CAs; a peer's entrance
is trusted through the peer's CA alone, as the module's own pulls trust it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from contract.peer_secret import PeerCredentials
from control.peerclient import Answer, PeerClient
from control.selfcheck import Probe, probe, served_certificate
from gateway.exchange import GRANT, ID_TOKEN, basic_auth
from gateway.resolve import OverrideResolver, split_authority, split_target

#: Seconds each probe may take (`peering check --timeout`).
TIMEOUT = 5.0


async def bounded(coro, timeout: float, timed_out):
    """`coro`'s result, or `timed_out` when it takes longer than `timeout` seconds (it is cancelled then)."""
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        return timed_out


@dataclass(frozen=True)
class Resolved:
    host: str
    addresses: tuple[str, ...] = ()
    #: "override" (--resolve) or "dns"
    via: str = "dns"
    error: str = ""


async def resolve(host: str, overrides: dict[str, str], *, timeout: float = TIMEOUT) -> Resolved:
    target = overrides.get(host.lower().rstrip("."))
    if target is not None:
        return Resolved(host, (target,), "override")
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, 443, type=socket.SOCK_STREAM),
                                       timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        return Resolved(host, error=str(exc) or type(exc).__name__)
    return Resolved(host, tuple(sorted({info[4][0] for info in infos})))


@dataclass(frozen=True)
class Https:
    """An HTTPS GET: `status` None when no answer came (`error` says why); `untrusted` the verification error
    when the certificate is not trusted here (then `cert_pem` is what was served)."""

    status: int | None = None
    body: Any = None
    untrusted: str = ""
    cert_pem: str | None = None
    error: str = ""


async def https_get(url: str, overrides: dict[str, str], *, timeout: float = TIMEOUT, method: str = "GET",
                    data: dict | None = None, headers: dict | None = None) -> Https:
    """GET (or `method`) `url` verifying TLS against the machine's trust; a certificate not trusted is reported with
    what was served, never followed."""
    resolver = OverrideResolver(overrides)
    context = ssl.create_default_context()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, resolver=resolver),
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, url, data=data, headers=headers, allow_redirects=False) as resp:
                raw = await resp.read()
                try:
                    body: Any = await resp.json(content_type=None)
                except ValueError:
                    body = raw[:300].decode(errors="replace")
                return Https(resp.status, body)
    except aiohttp.ClientConnectorCertificateError as exc:
        host, port = split_authority(url.split("://", 1)[1].split("/", 1)[0])
        address = resolver.lookup(host) or (host, port)
        cert = await served_certificate(host, address[0], address[1], timeout=timeout)
        return Https(untrusted=str(exc.certificate_error), cert_pem=cert)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return Https(error=f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__)
    finally:
        await resolver.close()


async def entrance(host: str, overrides: dict[str, str], *, timeout: float = TIMEOUT) -> Probe:
    """The self-check's probe of `host`:443 from here: no client certificate, nothing trusted."""
    target = overrides.get(host.lower().rstrip("."))
    return await bounded(probe(host, 443, split_target(target) if target else None, timeout=timeout), timeout,
                         Probe("unreachable", None, f"no answer within {timeout:g} s"))


def dex_token_form() -> dict[str, str]:
    """A token exchange Dex refuses before it looks at any token, because it carries none: after the client's
    authentication, `400 invalid_request` "Missing subject_token". Nothing is exchanged."""
    return {"grant_type": GRANT, "subject_token_type": ID_TOKEN}


async def dex_token(url: str, client_id: str | None, secret: str | None, overrides: dict[str, str], *,
                    timeout: float = TIMEOUT) -> Https:
    """Dex's token endpoint asked `dex_token_form()`, as the module's client when its credentials are given."""
    headers = {"Authorization": basic_auth(client_id, secret)} if client_id and secret is not None else {}
    return await bounded(https_get(url, overrides, timeout=timeout, method="POST", data=dex_token_form(),
                                   headers=headers), timeout, Https(error=f"no answer within {timeout:g} s"))


async def peer_offer(values: PeerCredentials, overrides: dict[str, str], *, timeout: float = TIMEOUT) -> Answer:
    """One offer pull from the peer's entrance with the peering's credentials (its CA, our client certificate)."""
    resolver = OverrideResolver(overrides)
    client = PeerClient(resolver, timeout=timeout)
    try:
        return await bounded(client.call(values.peer_entrance, "offer", peer_ca_pem=values.peer_ca,
                                         client_cert_pem=values.client_cert, client_key_pem=values.client_key),
                             timeout, Answer(None, f"no answer within {timeout:g} s"))
    finally:
        await client.close()
        await resolver.close()
