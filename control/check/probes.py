"""What `peering check` asks the network, from where it runs, as another cluster would: do the peering and
peering-gateway names resolve, does the join endpoint serve trusted TLS and answer as the module's join listener,
does the entrance refuse a connection without a client certificate and present the module's own certificate (the
self-check's probe, `control.selfcheck.probe`), does Dex answer its discovery document.

Names resolve through `--resolve` overrides first (the lab's names, or a port-forward), then DNS. Trust is the
machine's (SSL_CERT_FILE is honoured), as a peer's module trusts the public CAs.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from control.selfcheck import Probe, probe, served_certificate
from gateway.resolve import OverrideResolver, split_authority, split_target

TIMEOUT = 5.0


@dataclass(frozen=True)
class Resolved:
    host: str
    addresses: tuple[str, ...] = ()
    #: "override" (--resolve) or "dns"
    via: str = "dns"
    error: str = ""


async def resolve(host: str, overrides: dict[str, str]) -> Resolved:
    target = overrides.get(host.lower().rstrip("."))
    if target is not None:
        return Resolved(host, (target,), "override")
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, 443, type=socket.SOCK_STREAM),
                                       TIMEOUT)
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


async def https_get(url: str, overrides: dict[str, str], *, timeout: float = TIMEOUT) -> Https:
    """GET `url` verifying TLS against the machine's trust; a certificate not trusted is reported with what was
    served, never followed."""
    resolver = OverrideResolver(overrides)
    context = ssl.create_default_context()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, resolver=resolver),
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url, allow_redirects=False) as resp:
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


async def entrance(host: str, overrides: dict[str, str]) -> Probe:
    """The self-check's probe of `host`:443 from here: no client certificate, nothing trusted."""
    target = overrides.get(host.lower().rstrip("."))
    return await probe(host, 443, split_target(target) if target else None, timeout=TIMEOUT)
