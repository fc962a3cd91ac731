"""The self-check: probe our own entrance at `peering-gateway.<domain>` as a peer would (DESIGN.md §10).

One TLS connection without a client certificate, through the process's resolver, trusting nothing (we want to see
whatever certificate is served, ours or not). Then one HTTP request on it:
- the handshake or the request is refused (alert, reset, EOF before an answer): the entrance enforces client
  certificates (ClientCertRequired);
- an HTTP answer comes back: something let the request through without a client certificate, so something in front
  terminates TLS (ClientCertNotRequired);
- no connection at all: EntranceUnreachable.
A TLS 1.2 entrance refuses the missing client certificate inside the handshake, so Python's ssl never hands over the
certificate it did send; the probe then reads it in a second handshake (`served_certificate`) driven through
OpenSSL's verify callback, which sees the server's Certificate message before the refusal.
The certificate the handshake brought goes to `conditions.server_cert_condition`. The probe runs at most once per
`interval` (single-flight); `invalidate()` makes the next call probe again (after a certificate reload).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ssl

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL

from control.clock import SYSTEM, Clock
from control.rules.conditions import Cond, client_cert_condition, server_cert_condition

PROBE_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one probe saw: the client-certificate verdict ("refused", "served", "unreachable"), the certificate
    presented (PEM, or None), and a short detail for the condition message."""

    client: str
    cert_pem: str | None
    detail: str = ""


def _probe_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # We judge the certificate ourselves (issued by our CA, for our host, valid now): accept any here.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def probe(host: str, port: int, address: tuple[str, int] | None = None, *,
                timeout: float = PROBE_TIMEOUT) -> Probe:
    """Connect to `address` (or `host`:`port`) with SNI `host`, no client certificate, and ask for an offer."""
    ip, target_port = address if address is not None else (host, port)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(ip, target_port, ssl=_probe_context(), server_hostname=host), timeout)
    except ssl.SSLError as exc:
        # A TLS 1.2 server refuses the missing certificate inside the handshake: it did enforce it, and its
        # certificate went by before the refusal, where only a second, callback-driven handshake can see it.
        return Probe("refused", await served_certificate(host, ip, target_port, timeout=timeout),
                     f"handshake refused: {exc.reason or exc}")
    except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
        # The TCP connection was made and torn down inside the handshake: what a TLS 1.2 server refusing the
        # missing certificate looks like to asyncio when it closes before its alert is read. It was refused only if
        # a TLS server really sent a certificate; anything else is not an entrance that serves.
        cert_pem = await served_certificate(host, ip, target_port, timeout=timeout)
        if cert_pem is None:
            return Probe("unreachable", None, f"the connection was closed during the TLS handshake "
                                              f"({type(exc).__name__})")
        return Probe("refused", cert_pem, "handshake refused: the connection was closed")
    except (OSError, asyncio.TimeoutError) as exc:
        return Probe("unreachable", None, str(exc) or type(exc).__name__)
    cert_pem = None
    ssl_object = writer.get_extra_info("ssl_object")
    try:
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    except ValueError:
        # A TLS 1.3 server refuses the missing certificate after our side of the handshake is done; when its
        # alert has already been read, the TLS object is in error and will not say what was served.
        writer.transport.abort()
        writer.close()
        return Probe("refused", await served_certificate(host, ip, target_port, timeout=timeout),
                     "handshake refused: the server sent an alert after the handshake")
    if der:
        cert_pem = x509.load_der_x509_certificate(der).public_bytes(Encoding.PEM).decode()
    try:
        writer.write(f"GET /peering/v1/offer HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (ssl.SSLError, ConnectionError, OSError):
        return Probe("refused", cert_pem)
    except asyncio.TimeoutError:
        return Probe("unreachable", cert_pem, "the entrance accepted the connection but did not answer")
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (ssl.SSLError, OSError, asyncio.TimeoutError):
            pass
    if line.startswith(b"HTTP/"):
        return Probe("served", cert_pem)
    # The connection closed without an answer: a TLS 1.3 server sends its alert after our side finished.
    return Probe("refused", cert_pem)


async def served_certificate(host: str, ip: str, port: int, *, timeout: float = PROBE_TIMEOUT) -> str | None:
    """The leaf certificate (PEM) the server at `ip`:`port` sends for SNI `host`, whether or not the handshake
    completes afterwards; None when none came (no connection, no TLS, a timeout)."""
    seen: list[x509.Certificate] = []

    def verify(_conn, cert, _errno, depth, _ok) -> bool:
        if depth == 0 and not seen:
            seen.append(cert.to_cryptography())
        return True  # judged by conditions.server_cert_condition, not here

    ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.set_verify(SSL.VERIFY_PEER, verify)
    conn = SSL.Connection(ctx, None)  # memory BIOs: the bytes go through asyncio streams
    conn.set_tlsext_host_name(host.encode("idna"))
    conn.set_connect_state()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(ip, port)
            try:
                while not seen:
                    try:
                        conn.do_handshake()
                        break
                    except SSL.WantReadError:
                        pass
                    except SSL.Error:
                        break
                    while True:
                        try:
                            writer.write(conn.bio_read(65536))
                        except SSL.WantReadError:
                            break
                    await writer.drain()
                    data = await reader.read(65536)
                    if not data:
                        break
                    conn.bio_write(data)
            finally:
                writer.close()
                try:
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
                except (OSError, asyncio.TimeoutError):
                    pass
    except (OSError, TimeoutError):
        pass
    return seen[0].public_bytes(Encoding.PEM).decode() if seen else None


def conditions_of(result: Probe, ca_pem: str, host: str, now: datetime.datetime) -> tuple[Cond, Cond]:
    """(ClientCertEnforced, ServerCertOurs) from a probe."""
    return (client_cert_condition(result.client, result.detail),
            server_cert_condition(result.cert_pem, ca_pem, host, now, result.detail))


#: Probes that must find the entrance unreachable in a row, over at least `CONFIRM_SECONDS` (or the interval, if
#: shorter), before the conditions say EntranceUnreachable: a process that just started, or whose certificates were
#: just reloaded, is reached through a Service and load balancer that route to it a moment after it is ready.
CONFIRM_PROBES = 3
CONFIRM_SECONDS = 10.0
#: The first retry of an unconfirmed failure; each further one waits twice as long, never longer than the interval.
RETRY_SECONDS = 1.0


class SelfCheck:
    """The cached, single-flight probe of our entrance; `resolve(host)` maps the name like the process does.

    A probe that reaches the entrance is the verdict until the next one, `interval` later. One that does not is
    retried sooner (RETRY_SECONDS, doubling) and becomes the verdict only once confirmed (CONFIRM_PROBES in a row
    over CONFIRM_SECONDS or the interval); until then `result()` is None and the conditions keep what they say."""

    def __init__(self, host: str, *, resolve=None, interval: float = 60.0, clock: Clock = SYSTEM) -> None:
        self.host = host
        self.resolve = resolve
        self.interval = interval
        self.clock = clock
        self.last: Probe | None = None
        self._at = -1e18
        self._next = 0.0  # seconds after `_at` when the next probe is due
        self._failures: list[float] = []  # when each unreachable probe in a row was made
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._at = -1e18

    def due_in(self) -> float:
        return max(0.0, self._at + self._next - self.clock.monotonic())

    async def result(self) -> Probe | None:
        """The verdict (a probe's), or None while the entrance's unreachability is not confirmed yet."""
        async with self._lock:
            if self.clock.monotonic() - self._at >= self._next:
                address = self.resolve(self.host) if self.resolve is not None else None
                seen = await probe(self.host, 443, address)
                self._at = self.clock.monotonic()
                if seen.client != "unreachable":
                    self._failures.clear()
                    self.last, self._next = seen, self.interval
                else:
                    self._failures.append(self._at)
                    confirmed = (len(self._failures) >= CONFIRM_PROBES
                                 and self._at - self._failures[0] >= min(CONFIRM_SECONDS, self.interval))
                    self.last = seen if confirmed else None
                    self._next = self.interval if confirmed else min(
                        self.interval, RETRY_SECONDS * 2 ** (len(self._failures) - 1))
            return self.last
