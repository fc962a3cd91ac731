"""TLS of the entrance and the egress: contexts built from PEM in memory, and an acceptor that does the
handshake itself so that failures are counted by reason and certificates are swapped for new connections only."""

from __future__ import annotations

import _ssl
import asyncio
import ctypes
import hashlib
import logging
import os
import ssl
import sys
import tempfile
from typing import Any, Callable

from cachetools import LRUCache

from gateway.tlsstream import TLSStream

log = logging.getLogger(__name__)

# Modern suites only; the peering CA issues ECDSA P-256 keys, so only ECDSA suites are offered for TLS 1.2.
TLS12_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305"


def _load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # ssl can only load a key from a file: write it to a private directory and remove it at once.
    with tempfile.TemporaryDirectory(prefix="peering-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


def _harden(ctx: ssl.SSLContext) -> None:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION


# OpenSSL's SSL_CTX_ctrl commands and values the gateway uses (ssl.h).
_SSL_CTRL_MODE = 33
_SSL_CTRL_SET_SESS_CACHE_MODE = 44
_SSL_CTRL_GET_SESS_CACHE_MODE = 45
SSL_MODE_NO_AUTO_CHAIN = 0x8
SSL_SESS_CACHE_OFF = 0x0
#: X509_V_FLAG_NO_CHECK_TIME (x509_vfy.h), which Python's ssl.VerifyFlags does not name but passes to OpenSSL.
VERIFY_NO_CHECK_TIME = 0x200000


class _OpenSSL:
    """SSL_CTX_ctrl, which Python's ssl has no API for, called on the very library `_ssl` is linked with.

    The gateway needs it twice. SSL_MODE_NO_AUTO_CHAIN matters on every handshake: without it OpenSSL, for a
    certificate loaded without a chain, builds the chain anew for each handshake by verifying our own certificate
    against the trust store (a signature check) and then sends the CA certificate too, which the peer has and must
    decode for nothing. And the server-side session cache must be off (see `server_context`). The SSL_CTX pointer
    is read from the context object (CPython's PySSLContext starts with it) and trusted only when libssl reads
    back the very options Python reports for that context, before and after a change; otherwise nothing is done."""

    def __init__(self) -> None:
        self.ctrl = self.get_options = None
        if sys.implementation.name != "cpython":
            return
        try:
            lib = ctypes.CDLL(getattr(_ssl, "__file__", None))
            ctrl, get_options = lib.SSL_CTX_ctrl, lib.SSL_CTX_get_options
        except (OSError, AttributeError):
            return
        ctrl.restype, ctrl.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        get_options.restype, get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
        self.ctrl, self.get_options = ctrl, get_options

    def pointer(self, ctx: ssl.SSLContext) -> int | None:
        if self.ctrl is None:
            return None
        pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
        if not pointer:
            return None
        # Both readings must agree, before and after a change of an option Python sets through libssl itself.
        original = ctx.options
        try:
            if self.get_options(pointer) != int(original):
                return None
            ctx.options = original ^ ssl.OP_NO_TICKET
            agrees = self.get_options(pointer) == int(ctx.options)
        finally:
            ctx.options = original
        return pointer if agrees else None

    def control(self, ctx: ssl.SSLContext, command: int, value: int) -> int | None:
        """SSL_CTX_ctrl(ctx, command, value); None when the context's SSL_CTX cannot be trusted."""
        pointer = self.pointer(ctx)
        return None if pointer is None else self.ctrl(pointer, command, value, None)


_OPENSSL: _OpenSSL | None = None


def _openssl() -> _OpenSSL:
    global _OPENSSL
    if _OPENSSL is None:
        _OPENSSL = _OpenSSL()
    return _OPENSSL


def add_openssl_modes(ctx: ssl.SSLContext, modes: int) -> bool:
    """Add OpenSSL `modes` to `ctx`, for the connections made from it afterwards; False (logged) when not done."""
    result = _openssl().control(ctx, _SSL_CTRL_MODE, modes)
    if result is not None and result & modes == modes:
        return True
    log.warning("OpenSSL modes %#x could not be set on a TLS context; TLS works, with more work per handshake", modes)
    return False


class TLSSafetyError(ValueError):
    """A safety property of the server's TLS that cannot be established here: the gateway does not serve (a
    context is not built, and `Gateway.start` refuses to start) rather than serve without it."""


def disable_session_cache(ctx: ssl.SSLContext) -> bool:
    """Switch off the server-side session cache of `ctx` and read the mode back; False when that cannot be done.

    Python's ssl has no API for the session cache mode, and pyOpenSSL's (`Context.set_session_cache_mode`) acts
    on pyOpenSSL's own contexts only, which live in the OpenSSL that cryptography ships, not in the one `_ssl` is
    linked with: hence SSL_CTX_ctrl on `_ssl`'s own library (`_OpenSSL`), trusted only as far as it reads back."""
    openssl = _openssl()
    return openssl.control(ctx, _SSL_CTRL_SET_SESS_CACHE_MODE, SSL_SESS_CACHE_OFF) is not None and \
        openssl.control(ctx, _SSL_CTRL_GET_SESS_CACHE_MODE, 0) == SSL_SESS_CACHE_OFF


def _never_resume(ctx: ssl.SSLContext) -> None:
    """No TLS 1.3 session tickets (nor TLS 1.2 ones): the peers' clients do not resume, and a resumed session
    would skip the check of the client certificate against a CA that may have been rotated since. Each ticket also
    costs OpenSSL a copy of the session with the client certificate decoded again, the largest single cost of a
    full handshake after the signatures. Nor TLS 1.2 resumption by session ID, for the same reason: Python's ssl
    gives server contexts a session ID context, so OpenSSL would cache every session (with the client certificate)
    for five minutes and let a client resume one without presenting its certificate again, expired or not. Raises
    TLSSafetyError when the session cache cannot be switched off."""
    ctx.num_tickets = 0  # Python's own API for both kinds of ticket
    ctx.options |= ssl.OP_NO_TICKET
    if not disable_session_cache(ctx):
        raise TLSSafetyError(
            f"the TLS session cache of a server context could not be switched off (Python's ssl on "
            f"{ssl.OPENSSL_VERSION}, {sys.implementation.name}): TLS 1.2 clients could resume a session without "
            "presenting their certificate again, so the gateway does not serve; run it on CPython, whose ssl module "
            "is linked with OpenSSL as a shared library")


_RESUMPTION_REFUSED = False


def require_no_resumption() -> None:
    """Establish, once per process, that a server context made the way `server_context` makes one resumes no
    session over TLS 1.2 (session ID, ticket) or TLS 1.3 (ticket): a full handshake in memory with a throwaway
    certificate, then one offering its session again, over each version. TLSSafetyError when any resumes or the
    context cannot be made so; `Gateway.start` calls it, so that a gateway that would resume never starts."""
    global _RESUMPTION_REFUSED
    if _RESUMPTION_REFUSED:
        return
    cert_pem, key_pem = _throwaway_certificate()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _harden(server)
    _load_chain(server, cert_pem, key_pem)
    _never_resume(server)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.load_verify_locations(cadata=cert_pem.decode())
        client.minimum_version = client.maximum_version = version
        _, first = memory_handshake(server, client)
        _, second = memory_handshake(server, client, first.session)
        if second.session_reused or server.session_stats()["number"]:
            raise TLSSafetyError(f"a {version.name} session was resumed (or cached) by a server context with "
                                 "tickets and the session cache off: a client could skip presenting its "
                                 f"certificate; the gateway does not start on {ssl.OPENSSL_VERSION}")
    _RESUMPTION_REFUSED = True


def _throwaway_certificate() -> tuple[bytes, bytes]:
    from datetime import datetime, timedelta, timezone

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "resumption-check")])
    now = datetime.now(timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(minutes=10))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("resumption-check")]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def memory_handshake(server: ssl.SSLContext, client: ssl.SSLContext, session: ssl.SSLSession | None = None, *,
                     server_hostname: str = "resumption-check") -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """A handshake over memory BIOs (a few flights) offering `session`: (the server's end, the client's end), once
    the client has read what came after the handshake (TLS 1.3 tickets, if any)."""
    si, so, ci, co = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = server.wrap_bio(si, so, server_side=True)
    theirs = client.wrap_bio(ci, co, server_hostname=server_hostname, session=session)
    for _ in range(10):
        for end in (theirs, ours):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
        si.write(co.read())
        ci.write(so.read())
        if not (co.pending or so.pending) and ours.version() and theirs.version():
            try:
                theirs.read(1)  # TLS 1.3 sends its tickets after the handshake
            except ssl.SSLWantReadError:
                pass
            return ours, theirs
    raise TLSSafetyError("a TLS handshake in memory did not complete")


def server_context(cert_pem: bytes, key_pem: bytes, client_ca_pem: bytes | None) -> ssl.SSLContext:
    """A server context that never resumes a session; with `client_ca_pem`, a client certificate issued by that CA
    is required. ValueError when the certificates do not load, TLSSafetyError when resumption cannot be ruled out."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _harden(ctx)
    # The certificate is sent with the chain loaded with it (none when the CA signs it directly), as it is.
    add_openssl_modes(ctx, SSL_MODE_NO_AUTO_CHAIN)
    try:
        _load_chain(ctx, cert_pem, key_pem)
    except ssl.SSLError as exc:
        raise ValueError(f"the server certificate and key do not load ({exc.reason}); check that the key "
                         "belongs to the certificate and both are PEM") from None
    _never_resume(ctx)
    ctx.sslobject_class = LeanSSLObject
    if client_ca_pem is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_verify_locations(cadata=client_ca_pem.decode())
        except (ssl.SSLError, UnicodeDecodeError):
            raise ValueError("the peering CA bundle is not a PEM certificate") from None
        # A client certificate's validity period is not checked in the handshake (chain and signature are): a
        # handshake with an expired certificate of ours still proves, by its CertificateVerify over both fresh
        # randoms, possession of the key, which is what the renewal after an outage needs. Admission checks the
        # dates on every request and call (admission.certificate_in_force): such a certificate admits the
        # renewal and nothing else. With no resumption (above), every connection is such a full handshake.
        ctx.verify_flags |= VERIFY_NO_CHECK_TIME
    return ctx


def client_context(ca_pem: bytes | None, cert_pem: bytes | None = None, key_pem: bytes | None = None
                   ) -> ssl.SSLContext:
    """A client context trusting `ca_pem` only (the system store when None), with an optional client cert."""
    # Without cadata, create_default_context loads the system store itself.
    ctx = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.sslobject_class = LeanSSLObject
    if cert_pem and key_pem:
        add_openssl_modes(ctx, SSL_MODE_NO_AUTO_CHAIN)
        _load_chain(ctx, cert_pem, key_pem)
    return ctx


def handshake_failure_reason(exc: BaseException) -> str:
    """A bounded label for why a handshake failed."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or "taking longer" in str(exc):
        return "timeout"
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = (exc.verify_message or "").lower()
        if "expired" in message:
            return "expired_certificate"
        if "not yet valid" in message:
            return "certificate_not_yet_valid"
        return "untrusted_certificate"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "").upper()
        if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
            return "no_client_certificate"
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "CERTIFICATE_UNKNOWN" in reason:
            return "client_refused_server_certificate"
        if "VERSION" in reason or "PROTOCOL" in reason:
            return "protocol_version"
        if "CIPHER" in reason or "NO_SHARED" in reason:
            return "no_shared_cipher"
        if "HTTP_REQUEST" in reason or "WRONG_VERSION_NUMBER" in reason:
            return "not_tls"
        return "tls_error"
    return "connection_lost"


class TLSAcceptor:
    """Protocol factory for `loop.create_server`: each connection gets a `TLSStream` owned by this acceptor, whose
    handshake uses whatever context is current when the connection arrives; the stream then becomes the transport
    of the protocol `make_protocol(admitted)` makes.

    `admit(stream)` decides after the handshake (client cert fingerprint, per-peer limits): False refuses (the
    connection is aborted), bytes refuse with that answer (written at once, then the connection is closed, so a
    client learns why however long it would have waited to send a request), anything else is what the protocol is
    made with, and `on_connect(stream, admitted)` hears of it; `on_lost(stream)` hears of the end of every
    connection admitted so. `count_failure(reason)` counts refusals. The acceptor keeps what it knows of its
    streams itself (`open`, those in their handshake) and talks to them through `TLSOwner`'s calls only.
    """

    def __init__(self, *, name: str, context: Callable[[], ssl.SSLContext | None],
                 make_protocol: Callable[[Any], asyncio.BaseProtocol],
                 admit: Callable[[TLSStream], Any], count_failure: Callable[[str], None],
                 handshake_timeout: float, max_connections: int,
                 on_connect: Callable[[TLSStream, Any], None] | None = None,
                 on_lost: Callable[[TLSStream], None] | None = None) -> None:
        self.name = name
        self._on_connect = on_connect
        self._on_lost = on_lost
        self._context = context
        self._make_protocol = make_protocol
        self._admit = admit
        self._count_failure = count_failure
        self._timeout = handshake_timeout
        self.max_connections = max_connections
        #: TCP connections that began a handshake, counted until they end, whatever happened on them.
        self.open = 0
        # Connections without an HTTP protocol: in their handshake, or lingering after a failed one.
        self._handshaking: set[TLSStream] = set()

    def __call__(self) -> asyncio.BaseProtocol:
        return TLSStream(self)

    # ----- TLSOwner -----------------------------------------------------------------------------------------
    def tcp_connected(self, stream: TLSStream, tcp: asyncio.Transport) -> None:
        ctx = self._context()
        if ctx is None:
            self._count_failure("certificates_not_loaded")
            stream.refuse(tcp)
            return
        if self.open >= self.max_connections:
            self._count_failure("too_many_connections")
            stream.refuse(tcp)
            return
        self.open += 1  # until stream_ended
        self._handshaking.add(stream)
        # No TCP_NODELAY to set: uvloop and asyncio both set it on every TCP transport.
        stream.begin(tcp, ctx, server_side=True, server_hostname=None, timeout=self._timeout)

    def handshake_done(self, stream: TLSStream) -> None:
        self._handshaking.discard(stream)
        admitted = self._admit(stream)
        if admitted is False:
            stream.abort()
            return
        if isinstance(admitted, bytes):
            stream.write(admitted)
            stream.close()
            return
        proto = self._make_protocol(admitted)
        stream.set_protocol(proto)
        if self._on_connect is not None:
            self._on_connect(stream, admitted)
        proto.connection_made(stream)

    def handshake_failed(self, stream: TLSStream, exc: BaseException) -> None:
        # Still tracked and counted while it lingers (TLSStream._linger), so that close() ends it too.
        self._count_failure(handshake_failure_reason(exc))

    def stream_ended(self, stream: TLSStream) -> None:
        self._handshaking.discard(stream)
        self.open -= 1
        if self._on_lost is not None:
            self._on_lost(stream)

    async def close(self) -> None:
        for stream in list(self._handshaking):
            stream.abort()
        self._handshaking.clear()


class LeanSSLObject(ssl.SSLObject):
    """An SSLObject that does not decode the peer certificate into a dict.

    uvloop and asyncio ask for the decoded form after every handshake and keep it for the connection's life (about
    60 Python objects, near 4 KiB, and some 30 us of CPU per handshake). Nothing in the gateway reads it: peers are
    identified by the DER's fingerprint, and host names are checked inside OpenSSL. The DER stays available."""

    def getpeercert(self, binary_form: bool = False) -> Any:
        if binary_form:
            return super().getpeercert(True)
        return {}


#: Fingerprints by DER, an LRU: a flood of distinct certificates costs a hash each, never memory, and evicts one
#: entry at a time, never every peer's at once.
_FINGERPRINTS: LRUCache = LRUCache(4096)


def peer_fingerprint(transport: asyncio.BaseTransport) -> str | None:
    """SHA-256 (lower hex) of the DER of the client certificate of a TLS transport, computed once per certificate:
    a peer reconnects with the same one."""
    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return None
    fp = _FINGERPRINTS.get(der)
    if fp is None:
        fp = _FINGERPRINTS[der] = hashlib.sha256(der).hexdigest()
    return fp
