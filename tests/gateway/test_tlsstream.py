"""The gateway's own TLS layer (gateway/tlsstream.py) over real loopback sockets with real certificates, on both
event loops the gateway runs on (conftest.py), against the standard library's TLS on the other end."""

from __future__ import annotations

import asyncio
import ssl

import pytest
import trustme

from gateway import tls, tlsstream
from tests.gateway.support import close_stream

HOST = "peering-gateway.tls.lab"


@pytest.fixture(scope="module")
def pki():
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    return {"ca": ca, "server": ca.issue_cert(HOST, key_type=trustme.KeyType.ECDSA),
            "client": ca.issue_cert("peer", key_type=trustme.KeyType.ECDSA)}


def server_ctx(pki) -> ssl.SSLContext:
    return tls.server_context(pki["server"].cert_chain_pems[0].bytes(), pki["server"].private_key_pem.bytes(),
                              pki["ca"].cert_pem.bytes())


def client_ctx(pki, with_cert: bool = True) -> ssl.SSLContext:
    if not with_cert:
        return tls.client_context(pki["ca"].cert_pem.bytes())
    return tls.client_context(pki["ca"].cert_pem.bytes(), pki["client"].cert_chain_pems[0].bytes(),
                              pki["client"].private_key_pem.bytes())


class App(asyncio.Protocol):
    """Records what the TLS layer delivers; `events` says in which order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data = bytearray()
        self.events: list[str] = []
        self.lost = asyncio.get_running_loop().create_future()
        self.got = asyncio.Event()
        self.paused_writing = asyncio.Event()
        self.resumed_writing = asyncio.Event()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got.set()

    def eof_received(self) -> bool:
        self.events.append("eof")
        return False

    def pause_writing(self) -> None:
        self.paused_writing.set()

    def resume_writing(self) -> None:
        self.resumed_writing.set()

    def connection_lost(self, exc) -> None:
        self.events.append("lost")
        if not self.lost.done():
            self.lost.set_result(exc)


class BufferedApp(App, asyncio.BufferedProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray(1000)  # smaller than a record: one record takes several reads

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self.buffer[:nbytes]))


class Server:
    def __init__(self, pki, *, app=App, timeout: float = 10.0, context=None, current=None) -> None:
        self.apps: list[App] = []
        self.failures: list[str] = []
        self.made = asyncio.Event()
        self.failed = asyncio.Event()
        ctx = context or server_ctx(pki)

        def make(admitted) -> App:
            assert admitted is True  # what admit answered
            made = app()
            self.apps.append(made)
            self.made.set()
            return made

        def count(reason: str) -> None:
            self.failures.append(reason)
            self.failed.set()

        self.acceptor = tls.TLSAcceptor(name="test", context=current or (lambda: ctx), make_protocol=make,
                                        admit=lambda transport: True, count_failure=count,
                                        handshake_timeout=timeout, max_connections=100)
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> "Server":
        self.server = await asyncio.get_running_loop().create_server(self.acceptor, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        for app in self.apps:
            if app.transport is not None:
                app.transport.abort()
        await self.acceptor.close()
        await self.server.wait_closed()
        for app in self.apps:
            await asyncio.wait_for(asyncio.shield(app.lost), 5)

    async def app(self) -> App:
        await asyncio.wait_for(self.made.wait(), 5)
        return self.apps[-1]


async def open_client(pki, port: int, **kw):
    return await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx(pki, **kw), server_hostname=HOST)


async def wait_for(predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def ended(reader: asyncio.StreamReader) -> None:
    """The other end closed the connection (a FIN or a reset), sending nothing."""
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        pass


closed = close_stream


@pytest.mark.parametrize("app", [App, BufferedApp], ids=["data_received", "buffered"])
async def test_bytes_cross_intact_both_ways_and_close_sends_close_notify(pki, app):
    payload = bytes(range(256)) * 4096  # 1 MiB: many records, several TCP reads
    async with Server(pki, app=app) as server:
        reader, writer = await open_client(pki, server.port)
        writer.write(payload)
        await writer.drain()
        served = await server.app()
        await wait_for(lambda: len(served.data) == len(payload), "the whole payload")
        assert bytes(served.data) == payload
        served.transport.write(payload[::-1])
        served.transport.close()
        assert await reader.readexactly(len(payload)) == payload[::-1]
        # A clean TLS end (close_notify, then the TCP close): the client reads EOF, not an error.
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert await asyncio.wait_for(asyncio.shield(served.lost), 5) is None
        await closed(writer)
    assert server.failures == []


class RecordingSSLObject(tls.LeanSSLObject):
    sizes: list[int] = []

    def write(self, data) -> int:
        RecordingSSLObject.sizes.append(len(data))
        return super().write(data)


async def test_a_large_write_goes_to_openssl_a_record_at_a_time(pki):
    # OpenSSL's outgoing memory BIO keeps the largest amount ever written to it for the connection's life.
    ctx = server_ctx(pki)
    ctx.sslobject_class = RecordingSSLObject
    RecordingSSLObject.sizes = []
    payload = bytes(range(256)) * 4096 + b"tail"
    async with Server(pki, context=ctx) as server:
        reader, writer = await open_client(pki, server.port)
        served = await server.app()
        served.transport.write(payload)
        served.transport.write(b"small")
        assert await reader.readexactly(len(payload) + 5) == payload + b"small"
        await closed(writer)
    assert max(RecordingSSLObject.sizes) == 16 * 1024 and sum(RecordingSSLObject.sizes) == len(payload) + 5


async def test_the_peers_close_notify_is_eof_then_the_end(pki):
    async with Server(pki) as server:
        reader, writer = await open_client(pki, server.port)
        writer.write(b"last words")
        served = await server.app()
        await closed(writer)  # close_notify
        await asyncio.wait_for(asyncio.shield(served.lost), 5)
        assert bytes(served.data) == b"last words"
        assert served.events == ["made", "eof", "lost"]


class PausingApp(BufferedApp):
    """Pauses reading on its first delivery: the rest of that record is then decrypted-ahead state in OpenSSL."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = asyncio.Event()

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        if not self.paused.is_set():
            self.paused.set()
            self.transport.pause_reading()


async def test_paused_reading_holds_data_and_eof_until_resumed(pki):
    payload = b"0123456789" * 2000  # two records; the protocol reads 1,000 bytes at a time
    async with Server(pki, app=PausingApp) as server:
        reader, writer = await open_client(pki, server.port)
        writer.write(payload)
        writer.close()  # the data, then close_notify; its close completes once the server's answers it
        served = await server.app()
        await asyncio.wait_for(served.paused.wait(), 5)
        assert not served.transport.is_reading()
        for _ in range(20):
            await asyncio.sleep(0)  # turns of the loop: nothing more may arrive while paused
        assert bytes(served.data) == payload[:1000] and served.events == ["made"]
        served.transport.resume_reading()
        await asyncio.wait_for(asyncio.shield(served.lost), 5)
        assert bytes(served.data) == payload
        assert served.events == ["made", "eof", "lost"]
        await closed(writer)


async def test_write_flow_control_is_the_sockets(pki):
    async with Server(pki) as server:
        reader, writer = await open_client(pki, server.port)
        served = await server.app()
        served.transport.set_write_buffer_limits(high=64 * 1024)
        assert served.transport.get_write_buffer_limits()[1] == 64 * 1024
        chunk = b"x" * 65536
        sent = 0
        while not served.paused_writing.is_set() and sent < 64 * 1024 * 1024:
            served.transport.write(chunk)
            sent += len(chunk)
        assert served.paused_writing.is_set(), "the writer was never paused"
        assert served.transport.get_write_buffer_size() > 0
        received = 0
        while not served.resumed_writing.is_set():
            received += len(await asyncio.wait_for(reader.read(1 << 20), 5))
        await closed(writer)


async def test_extra_info(pki):
    async with Server(pki) as server:
        reader, writer = await open_client(pki, server.port)
        served = await server.app()
        transport = served.transport
        assert transport.get_extra_info("peername")[0] == "127.0.0.1"
        assert transport.get_extra_info("sslcontext") is not None
        assert transport.get_extra_info("cipher")[1] in ("TLSv1.3", "TLSv1.2")
        assert transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert transport.get_extra_info("nothing", "default") == "default"
        assert transport.get_protocol() is served and not transport.can_write_eof()
        with pytest.raises(NotImplementedError):
            transport.write_eof()
        await closed(writer)
        await asyncio.wait_for(asyncio.shield(served.lost), 5)
        # A finished connection answers without failing.
        assert transport.get_extra_info("ssl_object") is None and transport.get_extra_info("peername") is None
        transport.write(b"ignored")
        assert transport.is_closing()


async def test_handshake_failures_are_counted_by_reason(pki):
    async with Server(pki, timeout=0.5) as server:
        # No client certificate.
        reader, writer = await open_client(pki, server.port, with_cert=False)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(reader.read(), 5)
        await closed(writer)
        await wait_for(lambda: "no_client_certificate" in server.failures, "the refusal")
        # Plain HTTP on the TLS port.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(reader.read(), 5)
        await closed(writer)
        await wait_for(lambda: "not_tls" in server.failures, "the plain-HTTP refusal")
        # A TCP connection that ends in the middle, and one that says nothing.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\x16\x03\x01\x00\x50")  # the start of a ClientHello
        await writer.drain()
        await closed(writer)
        await wait_for(lambda: "connection_lost" in server.failures, "the cut handshake")
        reader, silent = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the gateway gave up after 0.5 s
        await closed(silent)
        await wait_for(lambda: "timeout" in server.failures, "the handshake timeout")
        # Each failed connection counted against the limits until it ended, and once as a failure.
        await wait_for(lambda: server.acceptor.open == 0, "every failed connection to end")
        assert server.apps == [] and len(server.failures) == 4


async def test_connections_refused_before_a_handshake_count_once(pki):
    certificates: list[ssl.SSLContext | None] = [None]
    async with Server(pki, current=lambda: certificates[0]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await ended(reader)
        await closed(writer)
        await wait_for(lambda: server.failures, "the refusal")
        certificates[0] = server_ctx(pki)
        server.acceptor.max_connections = 1
        held_reader, held = await open_client(pki, server.port)
        await server.app()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await ended(reader)
        await closed(writer)
        await wait_for(lambda: len(server.failures) == 2, "the second refusal")
        assert server.failures == ["certificates_not_loaded", "too_many_connections"]
        assert server.acceptor.open == 1
        await closed(held)
        await wait_for(lambda: server.acceptor.open == 0, "the held connection to end")
        assert server.failures == ["certificates_not_loaded", "too_many_connections"]


async def test_client_connects_and_refuses_a_server_of_another_ca(pki):
    async with Server(pki) as server:
        conn = await tlsstream.connect(App, "127.0.0.1", server.port, client_ctx(pki), server_hostname=HOST,
                                       timeout=5)
        conn.transport.write(b"hello")
        served = await server.app()
        await asyncio.wait_for(served.got.wait(), 5)
        served.transport.write(b"hi")
        await asyncio.wait_for(conn.got.wait(), 5)
        assert bytes(conn.data) == b"hi" and bytes(served.data) == b"hello"
        conn.transport.close()
        assert await asyncio.wait_for(asyncio.shield(served.lost), 5) is None
        assert await asyncio.wait_for(asyncio.shield(conn.lost), 5) is None

        other = trustme.CA(key_type=trustme.KeyType.ECDSA)
        stranger = tls.client_context(other.cert_pem.bytes())
        with pytest.raises(ssl.SSLCertVerificationError):
            await tlsstream.connect(App, "127.0.0.1", server.port, stranger, server_hostname=HOST, timeout=5)
        with pytest.raises(ssl.SSLCertVerificationError):  # the right CA, the wrong name
            await tlsstream.connect(App, "127.0.0.1", server.port, client_ctx(pki), server_hostname="other.lab",
                                    timeout=5)


async def test_client_gives_up_on_a_silent_server_and_leaves_nothing_open():
    accepted: list[asyncio.StreamWriter] = []
    gone = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # until the client goes away
        gone.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TimeoutError):
            await tlsstream.connect(App, "127.0.0.1", port, ssl.create_default_context(), server_hostname=HOST,
                                    timeout=0.3)
        await asyncio.wait_for(gone.wait(), 5)
        # Cancelled by its caller, the attempt closes its connection too.
        gone.clear()
        task = asyncio.ensure_future(tlsstream.connect(App, "127.0.0.1", port, ssl.create_default_context(),
                                                       server_hostname=HOST, timeout=30))
        await wait_for(lambda: len(accepted) == 2, "the second connection")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(gone.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()
