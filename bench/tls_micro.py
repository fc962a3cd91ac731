"""What one client-authenticated TLS handshake costs the entrance's TLS library, apart from any event loop.

In one process, over memory BIOs, with the gateway's own server context (`gateway.tls.server_context`): the
server side's CPU per full handshake and the heap each server-side connection keeps afterwards. For comparison,
the same handshake through pyOpenSSL, which runs on the OpenSSL inside the `cryptography` wheel rather than the
system's. Usage: `python -m bench.tls_micro [--handshakes 1000] [--connections 2000]`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import ssl
import time
from typing import Any, Callable

import trustme
from cryptography import x509
from cryptography.hazmat.backends.openssl import backend
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from OpenSSL import SSL

from gateway import tls


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> int | None:
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None  # not glibc
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


class Certs:
    def __init__(self) -> None:
        self.ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
        self.server = self.ca.issue_cert("peering-gateway.bench.lab", key_type=trustme.KeyType.ECDSA)
        self.client = self.ca.issue_cert("peer", key_type=trustme.KeyType.ECDSA)


def _stdlib_pair(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[float, tuple]:
    """One full handshake; the server side's CPU seconds and the objects that keep both sides alive."""
    si, so, ci, co = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    t0 = time.process_time()
    ours = server.wrap_bio(si, so, server_side=True)
    spent = time.process_time() - t0
    theirs = client.wrap_bio(ci, co, server_hostname="peering-gateway.bench.lab")
    spent += _drive(ours.do_handshake, theirs.do_handshake, lambda: si.write(co.read()), lambda: ci.write(so.read()),
                    ssl.SSLWantReadError)
    assert ours.getpeercert(binary_form=True), "the client certificate was not received"
    return spent, (ours, si, so)


def _drive(server_step: Callable[[], Any], client_step: Callable[[], Any], to_server: Callable[[], Any],
           to_client: Callable[[], Any], want_read: type[Exception]) -> float:
    """Runs a handshake between two ends joined by memory BIOs; the server steps' CPU seconds."""
    spent = 0.0
    for _ in range(8):
        try:
            client_step()
        except want_read:
            pass
        to_server()
        t0 = time.process_time()
        try:
            server_step()
            done = True
        except want_read:
            done = False
        spent += time.process_time() - t0
        to_client()
        if done:
            return spent
    raise AssertionError("the handshake did not finish")


def stdlib_contexts(certs: Certs, client_sends_ca: bool = False) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The entrance's server context and a peer's egress client context; with `client_sends_ca`, the client
    sends the CA certificate after its leaf, as a default client context loaded with the leaf alone does."""
    server = tls.server_context(certs.server.cert_chain_pems[0].bytes(), certs.server.private_key_pem.bytes(),
                                certs.ca.cert_pem.bytes())
    chain = certs.client.cert_chain_pems[0].bytes() + (certs.ca.cert_pem.bytes() if client_sends_ca else b"")
    client = tls.client_context(certs.ca.cert_pem.bytes(), chain, certs.client.private_key_pem.bytes())
    return server, client


def stdlib_heap_per_connection(certs: Certs, connections: int, client_sends_ca: bool = False) -> float | None:
    """KiB of heap each server-side connection keeps after its handshake (None when not on glibc)."""
    server, client = stdlib_contexts(certs, client_sends_ca)
    gc.collect()
    before = _heap_in_use()
    kept = [_stdlib_pair(server, client)[1] for _ in range(connections)]
    gc.collect()
    after = _heap_in_use()
    return None if before is None or after is None else round((after - before) / len(kept) / 1024, 2)


def _pyopenssl_context(method: int, certs: Certs, leaf: trustme.LeafCert) -> SSL.Context:
    ctx = SSL.Context(method)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.use_certificate(x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()))
    ctx.use_privatekey(load_pem_private_key(leaf.private_key_pem.bytes(), None))
    with certs.ca.cert_pem.tempfile() as path:
        ctx.load_verify_locations(path)
    ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT)
    ctx.set_mode(tls.SSL_MODE_NO_AUTO_CHAIN)
    ctx.set_options(SSL.OP_NO_TICKET)
    if method == SSL.TLS_SERVER_METHOD:
        ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    return ctx


def _pump(source: SSL.Connection, sink: SSL.Connection) -> None:
    try:
        sink.bio_write(source.bio_read(65536))
    except SSL.WantReadError:
        pass


def pyopenssl_contexts(certs: Certs) -> tuple[SSL.Context, SSL.Context]:
    return (_pyopenssl_context(SSL.TLS_SERVER_METHOD, certs, certs.server),
            _pyopenssl_context(SSL.TLS_CLIENT_METHOD, certs, certs.client))


def _pyopenssl_pair(server: SSL.Context, client: SSL.Context) -> float:
    t0 = time.process_time()
    ours = SSL.Connection(server, None)
    ours.set_accept_state()
    spent = time.process_time() - t0
    theirs = SSL.Connection(client, None)
    theirs.set_connect_state()
    spent += _drive(ours.do_handshake, theirs.do_handshake, lambda: _pump(theirs, ours), lambda: _pump(ours, theirs),
                    SSL.WantReadError)
    assert ours.get_peer_certificate() is not None, "the client certificate was not received"
    return spent


def handshake_cpu(certs: Certs, handshakes: int) -> dict:
    """Median server-side CPU per handshake for both libraries, their handshakes alternating so that whatever
    else the machine does falls on both alike."""
    ours, theirs = stdlib_contexts(certs), pyopenssl_contexts(certs)
    samples: dict[str, list[float]] = {"stdlib": [], "pyopenssl": []}
    for _ in range(handshakes):
        samples["stdlib"].append(_stdlib_pair(*ours)[0])
        samples["pyopenssl"].append(_pyopenssl_pair(*theirs))
    return {name: round(sorted(values)[len(values) // 2] * 1e6, 1) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tls_micro", description=__doc__.split("\n")[0])
    parser.add_argument("--handshakes", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=2000)
    args = parser.parse_args(argv)
    certs = Certs()
    cpu = handshake_cpu(certs, args.handshakes)
    print(json.dumps({
        "stdlib_ssl": {"library": ssl.OPENSSL_VERSION, "server_cpu_us_per_handshake_median": cpu["stdlib"],
                       "server_heap_kib_per_connection": stdlib_heap_per_connection(certs, args.connections),
                       "same_when_the_client_also_sends_its_ca": stdlib_heap_per_connection(
                           certs, args.connections, client_sends_ca=True)},
        "pyopenssl": {"library": backend.openssl_version_text(),
                      "server_cpu_us_per_handshake_median": cpu["pyopenssl"]}}, indent=2))


if __name__ == "__main__":
    main()
