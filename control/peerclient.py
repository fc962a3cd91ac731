"""Our HTTP client toward another cluster: its public join endpoint and its mTLS entrance.

Every connection goes through the process's resolver (lab names are real TLS names on loopback). Answers come back
as `Answer(status, body)`; a failure to get any HTTP answer (DNS, TCP, TLS) is `Answer(None, detail)`, and a TLS
refusal of our client certificate is told apart (`refused_certificate`), because it means the peer has probably
revoked us. Nothing here logs: the join body carries the token, and callers log only reasons. Redirects are never
followed (`allow_redirects=False`): a 3xx is an answer like any other, so a peer cannot send our requests on to
another host (docs/design-changes.md, "The join's entrance host").
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from contract.paths import JOIN_PATH, peer_op_path
from control.connstring import Invitation
from gateway.tls import client_context
from gateway.tlsalerts import refused_certificate

MAX_ANSWER_BYTES = 1024 * 1024
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: `status` None when none came (then `body` is a short reason text)."""

    status: int | None
    body: Any
    #: The peer's TLS stack refused our client certificate (alert unknown CA / bad or revoked certificate).
    refused_certificate: bool = False
    #: Which alert refused it, when it says: "certificate_expired" (a peer whose module checks the dates in the
    #: handshake, as before it renewed expired certificates) or "unknown_ca" (its CA is not the one that issued
    #: ours); "" otherwise.
    tls_alert: str = ""
    #: Why we did not trust the peer's entrance certificate: "expired" (or not yet valid), "foreign" (not issued
    #: by the CA this peering was made with), "other"; "" when it was not the reason.
    untrusted_server: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def join_context(inv: Invitation) -> ssl.SSLContext:
    """Trust only the CA the connection string carries for the join endpoint, or else the system trust."""
    if inv.join_ca_pem:
        ctx = ssl.create_default_context(cadata=inv.join_ca_pem)
    else:
        ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def peer_context(peer_ca_pem: str, client_cert_pem: str, client_key_pem: str) -> ssl.SSLContext:
    """mTLS toward a peer's entrance: trust only its peering CA and present the certificate it issued to us."""
    return client_context(peer_ca_pem.encode(), client_cert_pem.encode(), client_key_pem.encode())


def _refused_cert(exc: BaseException) -> bool:
    return refused_certificate(exc) is not None


def _alert(exc: BaseException) -> str:
    text = f"{getattr(exc, 'reason', '')} {exc}".upper()
    return "certificate_expired" if "CERTIFICATE_EXPIRED" in text else "unknown_ca" if "UNKNOWN_CA" in text else ""


#: OpenSSL's verify results (x509_vfy.h) that say why a server certificate was not trusted.
_SERVER_DATES = frozenset({9, 10})  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
_SERVER_FOREIGN = frozenset({2, 18, 19, 20, 21})  # no issuer here, self-signed, not signed by the trusted CA


def _untrusted(exc: BaseException) -> str:
    code = getattr(exc, "verify_code", None)
    return "expired" if code in _SERVER_DATES else "foreign" if code in _SERVER_FOREIGN else "other"


def _detail(exc: BaseException) -> str:
    # Connection errors name the host and port, never a header or a body. aiohttp's own text of a connector error
    # carries the repr of the SSL context, which tells an administrator nothing: say what the socket said instead.
    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = getattr(exc, "certificate_error", None) or exc.os_error
        why = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        return f"cannot connect to {exc.host}:{exc.port}: {why}"[:300]
    text = str(exc) or type(exc).__name__
    return text[:300]


class PeerClient:
    """One aiohttp session per kind of trust; create once per process, close with `close()`."""

    def __init__(self, resolver: aiohttp.abc.AbstractResolver | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.resolver = resolver
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # ssl is given per request; connections are not kept, since each peer has its own TLS identity and a
            # renewed certificate must be used on the next call.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=self.resolver, force_close=True, use_dns_cache=False))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, url: str, ctx: ssl.SSLContext, body: Any) -> Answer:
        session = self._get_session()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "User-Agent": "peering"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with session.request(method, url, data=data, headers=headers, ssl=ctx, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
                if len(raw) > MAX_ANSWER_BYTES:
                    return Answer(resp.status, {"reason": "AnswerTooLarge",
                                                "message": f"the answer is larger than {MAX_ANSWER_BYTES} bytes"})
                try:
                    parsed = json.loads(raw) if raw else {}
                except ValueError:
                    parsed = raw[:200].decode(errors="replace")
                return Answer(resp.status, parsed)
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientConnectorCertificateError as exc:
            return Answer(None, f"the server's certificate is not trusted: {_detail(exc.certificate_error)}",
                          untrusted_server=_untrusted(exc.certificate_error))
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            return Answer(None, f"TLS failed: {_detail(exc)}", refused_certificate=_refused_cert(exc),
                          tls_alert=_alert(exc))
        except aiohttp.ClientOSError as exc:
            # A TLS 1.3 server refuses a client certificate after the client's handshake is done: it surfaces as
            # an SSL error (or a reset) on the first read.
            return Answer(None, f"connection failed: {_detail(exc)}", refused_certificate=_refused_cert(exc),
                          tls_alert=_alert(exc))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return Answer(None, f"no answer: {_detail(exc) if not isinstance(exc, asyncio.TimeoutError) else 'timeout'}")

    async def join(self, inv: Invitation, body: dict) -> Answer:
        """`POST <join URL>/v1/join`; the body holds the token, so only a TLS-authenticated endpoint sees it."""
        return await self._request("POST", inv.join_url.rstrip("/") + JOIN_PATH, join_context(inv), body)

    async def call(self, entrance: str, op: str, *, peer_ca_pem: str, client_cert_pem: str, client_key_pem: str,
                   body: dict | None = None) -> Answer:
        """`/peering/v1/<op>` on a peer's entrance (host[:port]) over mTLS; GET for offer, POST otherwise."""
        method = "GET" if op == "offer" else "POST"
        try:
            ctx = peer_context(peer_ca_pem, client_cert_pem, client_key_pem)
        except (ssl.SSLError, ValueError, OSError) as exc:
            return Answer(None, f"the stored credentials cannot be used: {type(exc).__name__}")
        return await self._request(method, f"https://{entrance}{peer_op_path(op)}", ctx, body)
