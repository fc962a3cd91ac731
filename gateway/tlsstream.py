"""TLS over memory BIOs: one object that is the TCP connection's protocol and the HTTP protocol's transport.

The event loops' own TLS layers (uvloop's and asyncio's SSLProtocol) give every connection a 256 KiB read buffer
of its own, whose first pages stay in memory once a handshake or a watch event has passed through them, plus a
transport object, a write backlog and a handshake future each. Over thousands of mostly idle connections that is a
quarter of what a connection costs. Here all connections read ciphertext into one shared buffer, hand it to
OpenSSL's memory BIO at once, and decrypt straight into the HTTP protocol's buffer (or one shared plaintext
buffer); what OpenSSL writes goes to the TCP transport as soon as it is made. Nothing is kept per connection but
the SSLObject, its two BIOs and this object's slots.

Semantics follow the loops' SSL transports where the HTTP protocols rely on them: the HTTP protocol is made only
after the handshake; `close()` sends close_notify, and the TCP connection ends once what was written has gone
and the peer has closed too (`_linger`); the peer's EOF or close_notify reaches the protocol as `eof_received()`
and then closes the connection (TLS has no half-close here); write flow control is the TCP transport's, passed
through as it is.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Callable, Protocol

from gateway.tcp import keepalive

_BUFFER_SIZE = 64 * 1024
# Single-threaded event loop: each buffer is filled and emptied within one callback.
_CIPHER = memoryview(bytearray(_BUFFER_SIZE))  # what the TCP transports read
_PLAIN_VIEW = memoryview(bytearray(_BUFFER_SIZE))  # what is decrypted for protocols that are not buffered

_RECORD = 16 * 1024  # the most plaintext a TLS record carries
_HANDSHAKE, _OPEN, _DONE, _REFUSED = 0, 1, 2, 3
# How long a closed connection waits for the peer to close its side (see TLSStream._linger); the event loops'
# own TLS transports give a TLS shutdown as long. After a failed handshake there is only the alert to deliver.
_LINGER = 30.0
_FAILED_LINGER = 5.0


class TLSOwner(Protocol):
    """What a TLSStream reports to, through these calls only: the acceptor of a listener (tls.TLSAcceptor), or
    `connect`'s wait for one outgoing connection; the owner keeps what it needs of a stream itself.
    `tcp_connected`: the TCP connection exists, `stream.begin(...)` its handshake or `stream.refuse(tcp)`.
    `handshake_done`: `stream.set_protocol(p)` and `p.connection_made(stream)`, or abort it. `handshake_failed`:
    the handshake failed or the connection ended before it finished (told once). `stream_ended`: the TCP
    connection of a stream that began its handshake is gone (told last, once)."""

    def tcp_connected(self, stream: "TLSStream", tcp: asyncio.Transport) -> None: ...
    def handshake_done(self, stream: "TLSStream") -> None: ...
    def handshake_failed(self, stream: "TLSStream", exc: BaseException) -> None: ...
    def stream_ended(self, stream: "TLSStream") -> None: ...


class TLSStream(asyncio.Transport, asyncio.BufferedProtocol):
    """The TLS layer of one connection, reporting to its `owner` (`TLSOwner`): the owner begins the handshake
    once the TCP connection exists (`begin`), or refuses the connection (`refuse`), and says what a finished or
    failed handshake leads to."""

    __slots__ = ("_owner", "_tcp", "_ssl", "_in", "_out", "_app", "_buffered", "_state", "_closing", "_paused",
                 "_eof_pending", "_peer_done", "_timer", "_error")

    def __init__(self, owner: TLSOwner) -> None:
        self._extra: dict = {}
        self._owner = owner
        self._tcp: Any = None
        self._ssl: ssl.SSLObject | None = None
        self._in: ssl.MemoryBIO | None = None
        self._out: ssl.MemoryBIO | None = None
        self._app: Any = None
        self._buffered = False
        self._state = _HANDSHAKE
        self._closing = False
        self._paused = False
        self._eof_pending = False
        self._peer_done = False
        self._timer: asyncio.TimerHandle | None = None
        #: The TLS error that ended an open connection (a fatal alert), handed to the protocol's connection_lost.
        self._error: ssl.SSLError | None = None

    # ----- handshake ------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner.tcp_connected(self, transport)  # type: ignore[arg-type]

    def refuse(self, tcp: asyncio.Transport) -> None:
        """End the connection before any handshake (nothing to report as a failed one, nor its end)."""
        self._state = _REFUSED
        self._closing = True
        tcp.abort()

    def begin(self, tcp: asyncio.Transport, context: ssl.SSLContext, *, server_side: bool,
               server_hostname: str | None, timeout: float) -> None:
        if self._state != _HANDSHAKE:
            return  # the connection ended before the handshake could start
        self._tcp = tcp
        keepalive(tcp.get_extra_info("socket"))
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        try:
            self._ssl = context.wrap_bio(self._in, self._out, server_side=server_side,
                                         server_hostname=server_hostname)
        except (ssl.SSLError, ValueError) as exc:
            self._fail(exc, abort=True)
            return
        self._timer = asyncio.get_running_loop().call_later(timeout, self._timed_out, timeout)
        if not server_side:
            self._handshake_step()  # the ClientHello

    def _handshake_step(self) -> bool:
        """One step of the handshake with what has arrived; True once the connection carries application data."""
        assert self._ssl is not None
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return False
        except (ssl.SSLError, ValueError) as exc:
            self._flush()  # the alert tells the peer why
            self._fail(exc, abort=False)
            return False
        self._flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._state = _OPEN
        self._owner.handshake_done(self)
        return self._app is not None and not self._closing

    def _timed_out(self, timeout: float) -> None:
        self._timer = None
        if self._state == _HANDSHAKE:
            self._fail(TimeoutError(f"the TLS handshake took longer than {timeout:g} s"), abort=True)

    def _fail(self, exc: BaseException, *, abort: bool) -> None:
        if self._state != _HANDSHAKE:
            return
        self._state = _DONE
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if abort:
            if self._tcp is not None:
                self._tcp.abort()
        else:
            # The alert reaches the peer; a client that is not speaking TLS sees the end.
            self._linger(_FAILED_LINGER, fin=True)
        self._owner.handshake_failed(self, exc)

    # ----- the TCP connection's protocol -------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return _CIPHER

    def buffer_updated(self, nbytes: int) -> None:
        if self._state == _DONE:
            return  # a failed handshake lingers: what the peer still sends is dropped
        if self._closing:
            self._after_close(nbytes)
            return
        self._in.write(_CIPHER[:nbytes])  # type: ignore[union-attr]
        if self._state == _HANDSHAKE and not self._handshake_step():
            return
        if not self._paused and self._app is not None:
            self._read()

    def _read(self) -> None:
        """Decrypt what has arrived into the application protocol, as long as it reads."""
        ssl_object, incoming = self._ssl, self._in
        try:
            while not (self._paused or self._closing):  # both set once the connection is lost
                app = self._app
                # A read of 0 bytes is the peer's close_notify (ssl raises SSLZeroReturnError only for sockets).
                if self._buffered:
                    buffer = app.get_buffer(-1)
                    n = ssl_object.read(len(buffer), buffer)  # type: ignore[union-attr]
                    if not n:
                        self._peer_finished()
                        return
                    app.buffer_updated(n)
                else:
                    n = ssl_object.read(_BUFFER_SIZE, _PLAIN_VIEW)  # type: ignore[union-attr]
                    if not n:
                        self._peer_finished()
                        return
                    app.data_received(bytes(_PLAIN_VIEW[:n]))
                if not incoming.pending and not ssl_object.pending():  # type: ignore[union-attr]
                    break
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:  # close_notify: the peer has finished
            self._peer_finished()
            return
        except ssl.SSLError as exc:  # a record that does not decrypt or a fatal alert: nothing more can be read
            self._error = exc
            self.abort()
            return
        self._flush()  # what reading made OpenSSL answer (a key update), if anything

    def _after_close(self, nbytes: int) -> None:
        """Lingering after close(): application data is dropped; the peer's close_notify ends the connection."""
        ssl_object = self._ssl
        if ssl_object is None or self._tcp is None:
            return
        self._in.write(_CIPHER[:nbytes])  # type: ignore[union-attr]
        try:
            while ssl_object.read(_BUFFER_SIZE, _PLAIN_VIEW):
                pass
        except ssl.SSLWantReadError:
            return
        except ssl.SSLError:
            pass
        self._peer_done = True
        self._tcp.close()

    def _flush(self) -> None:
        out, tcp = self._out, self._tcp
        # A TCP transport that is closing drops writes; once closed (before connection_lost reaches us) uvloop's
        # raises instead.
        if out is not None and out.pending and tcp is not None and not tcp.is_closing():
            tcp.write(out.read())

    def eof_received(self) -> bool:
        self._peer_done = True
        if self._closing:
            return False  # the peer has closed its side too: the TCP connection ends
        if self._state == _HANDSHAKE:
            self._fail(ConnectionResetError("the connection was closed during the TLS handshake"), abort=False)
            return False
        if self._paused:
            self._eof_pending = True  # what was read ahead goes first, when the protocol reads again
            return True
        self._peer_finished()
        return True

    def _peer_finished(self) -> None:
        self._peer_done = True
        if self._state != _OPEN:
            return
        if self._app is not None:
            self._app.eof_received()  # TLS has no half-close here: whatever it answers, the connection closes
        self.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        refused = self._state == _REFUSED
        self._tcp = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._state == _HANDSHAKE:
            self._fail(exc or ConnectionResetError("the connection was closed during the TLS handshake"),
                       abort=False)
        elif self._state == _OPEN:
            self._state = _DONE
            app, self._app = self._app, None
            if app is not None:
                app.connection_lost(exc if exc is not None else self._error)
        self._closing = True
        self._ssl = self._in = self._out = None
        if not refused:
            self._owner.stream_ended(self)

    def pause_writing(self) -> None:
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._app is not None:
            self._app.resume_writing()

    # ----- the application protocol's transport ------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "sslcontext":
            return self._ssl.context if self._ssl is not None else default
        if name == "peercert":
            return self._ssl.getpeercert() if self._ssl is not None else default
        if name == "cipher":
            return self._ssl.cipher() if self._ssl is not None else default
        if name == "compression":
            return None
        return self._tcp.get_extra_info(name, default) if self._tcp is not None else default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._app = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._app

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._ssl is None or not data:
            return
        try:
            if len(data) <= _RECORD:
                self._ssl.write(data)
                self._flush()
                return
            # The outgoing BIO never gives back memory: one large write would stay allocated for the connection's
            # life (1 MiB written once kept 1.35 MiB). Written a record at a time, it keeps one record's worth.
            view, out, records = memoryview(data), self._out, []
            for start in range(0, len(view), _RECORD):
                self._ssl.write(view[start:start + _RECORD])
                records.append(out.read())  # type: ignore[union-attr]
        except ssl.SSLError:
            self.abort()
            return
        if self._tcp is not None and not self._tcp.is_closing():
            self._tcp.writelines(records)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot be half-closed")

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._ssl is not None and self._state == _OPEN:
            try:
                self._ssl.unwrap()  # our close_notify into the outgoing BIO; the peer's ends the lingering
            except (ssl.SSLError, ValueError):
                pass
            self._flush()
        self._linger(_LINGER)

    def _linger(self, seconds: float, fin: bool = False) -> None:
        """End the connection without losing what was written: once the close_notify (or a handshake's alert) is
        sent, read and drop what the peer still sends until it closes the TCP connection, as TLS clients do on a
        close_notify, or `seconds` have passed. Closing at once would let the kernel answer the peer's next
        bytes (often its own close_notify) with a reset, which discards whatever the peer had received but not
        read yet. After application data no FIN goes with the close_notify: some clients (uvloop's) drop the
        last records they have not read when the FIN arrives; `fin` is for a failed handshake."""
        tcp = self._tcp
        if tcp is None:
            return
        if self._peer_done:
            tcp.close()  # after what is buffered has been written
            return
        if fin and tcp.can_write_eof():
            tcp.write_eof()
        if self._paused:
            self._paused = False
            tcp.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, tcp.abort)

    def abort(self) -> None:
        self._closing = True
        if self._tcp is not None:
            self._tcp.abort()

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    def pause_reading(self) -> None:
        if self._paused or self._closing:
            return
        self._paused = True
        if self._tcp is not None:
            self._tcp.pause_reading()

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if self._tcp is None or self._closing:
            return
        self._tcp.resume_reading()
        # What was decrypted ahead, or is still in the BIO, is delivered from the loop, not inside the caller.
        asyncio.get_running_loop().call_soon(self._read_ahead)

    def _read_ahead(self) -> None:
        if self._paused or self._state != _OPEN:
            return
        self._read()
        if self._eof_pending and not self._paused and self._state == _OPEN:
            self._eof_pending = False
            self._peer_finished()

    def get_write_buffer_size(self) -> int:
        return self._tcp.get_write_buffer_size() if self._tcp is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._tcp.get_write_buffer_limits() if self._tcp is not None else (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._tcp is not None:
            self._tcp.set_write_buffer_limits(high, low)


class _Connecting:
    """The owner of one outgoing stream (`connect`): its handshake begins once the TCP connection exists, and ends
    in the protocol `factory` makes (the stream its transport) or in the failure."""

    __slots__ = ("factory", "waiter", "context", "server_hostname", "timeout")

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol], waiter: asyncio.Future,
                 context: ssl.SSLContext, server_hostname: str, timeout: float) -> None:
        self.factory, self.waiter, self.context = factory, waiter, context
        self.server_hostname, self.timeout = server_hostname, timeout

    def tcp_connected(self, stream: TLSStream, tcp: asyncio.Transport) -> None:
        stream.begin(tcp, self.context, server_side=False, server_hostname=self.server_hostname, timeout=self.timeout)

    def handshake_done(self, stream: TLSStream) -> None:
        if self.waiter.done():  # the caller is gone
            stream.abort()
            return
        app = self.factory()
        stream.set_protocol(app)
        app.connection_made(stream)
        self.waiter.set_result(app)

    def handshake_failed(self, stream: TLSStream, exc: BaseException) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(exc)

    def stream_ended(self, stream: TLSStream) -> None:
        pass  # the connection's protocol hears of it (connection_lost)


async def connect(factory: Callable[[], Any], host: str, port: int, context: ssl.SSLContext, *,
                  server_hostname: str, timeout: float) -> Any:
    """A TLS connection to `host:port` whose protocol `factory` makes once the handshake is done (then it is that
    protocol's transport). OSError, ssl.SSLError or TimeoutError when it cannot be made within `timeout`."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    stream = TLSStream(_Connecting(factory, waiter, context, server_hostname, timeout))
    async with asyncio.timeout(timeout):
        try:
            await loop.create_connection(lambda: stream, host, port)
            return await waiter
        except BaseException:
            waiter.cancel()  # nobody waits for it any more: the handshake's failure is not reported to it
            stream.abort()
            raise
