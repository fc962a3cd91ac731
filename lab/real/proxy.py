"""An HTTP CONNECT proxy on loopback that gives the real kube-apiserver the lab's host names.

kube-apiserver fetches its JWT issuer's discovery document and keys itself, from the names in them
(`https://dex.a.lab/.well-known/openid-configuration`, then the document's `jwks_uri`). Those names exist only in
the lab's resolver map, and the lab's listeners are on OS-chosen ports, not 443. kube-apiserver's OIDC client
honours HTTPS_PROXY (its transport takes `http.ProxyFromEnvironment`), and Go never proxies loopback addresses, so
the lab starts kube-apiserver with HTTPS_PROXY pointing here: a CONNECT to `dex.a.lab:443` is tunnelled to the
address the map gives, TLS stays end to end (kube-apiserver verifies Dex's certificate for `dex.a.lab` against the
issuer's CA), and a CONNECT to any name not in the map is refused 403. No /etc/hosts edit, no DNS.

    python -m lab.real.proxy --port-file F --map dex.a.lab=127.0.0.1:41234 [--map host:port=127.0.0.1:port ...]
    python -m lab.real.proxy --port-file F --routes-file R

A name without a port means port 443. The proxy binds 127.0.0.1 on a port the OS chooses and writes it to F.
With --routes-file, the entries are R's lines (the same `host[:port]=127.0.0.1:PORT`), read again whenever R
changes, before the CONNECT that follows: a control plane kept for the next lab cluster (lab/real/pool.py) is
pointed at that cluster's Dex by rewriting R (atomically), without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import sys

log = logging.getLogger("lab.real.proxy")

HEAD_LIMIT = 8192
HEAD_TIMEOUT = 10.0


def parse_map(entries: list[str]) -> dict[str, tuple[str, int]]:
    """`host[:port]=127.0.0.1:port` entries as {"host:port": (ip, port)}; only loopback targets."""
    result: dict[str, tuple[str, int]] = {}
    for entry in entries:
        name, sep, target = entry.partition("=")
        ip, _, port = target.rpartition(":")
        if not sep or not name or not port.isdigit() or not ip.startswith("127."):
            raise ValueError(f"--map {entry!r}: write host[:port]=127.0.0.1:PORT (targets are loopback only)")
        if ":" not in name:
            name += ":443"
        result[name.lower()] = (ip, int(port))
    return result


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def read_routes(path: pathlib.Path) -> dict[str, tuple[str, int]]:
    """A routes file's entries, one `host[:port]=127.0.0.1:PORT` per line (blank lines and `#` comments skipped)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    try:
        return parse_map([line for line in lines if line and not line.startswith("#")])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def write_routes(path: pathlib.Path, routes: dict[str, str]) -> None:
    """Write `{host: "127.0.0.1:PORT"}` as a routes file, atomically (a CONNECT reads the old or the new)."""
    parse_map([f"{h}={t}" for h, t in routes.items()])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{h}={t}\n" for h, t in sorted(routes.items())))
    os.replace(tmp, path)


class ConnectProxy:
    def __init__(self, routes: dict[str, tuple[str, int]], routes_file: pathlib.Path | None = None) -> None:
        self._routes = routes
        self.routes_file = routes_file
        self._stamp: tuple[int, int] | None = None

    @property
    def routes(self) -> dict[str, tuple[str, int]]:
        """The entries given, or the routes file's as it is now (read again when its mtime or size changed)."""
        if self.routes_file is not None:
            st = self.routes_file.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._routes, self._stamp = read_routes(self.routes_file), stamp
        return self._routes

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if len(parts) != 3 or parts[0] != "CONNECT":
            await self._refuse(writer, 405, f"only CONNECT is served here, not {line!r}")
            return
        authority = parts[1].lower()
        try:
            target = self.routes.get(authority)
        except (OSError, ValueError) as e:
            await self._refuse(writer, 502, f"the routes file cannot be read: {e}")
            return
        if target is None:
            await self._refuse(writer, 403, f"{authority} is not a lab name this proxy knows")
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError as e:
            await self._refuse(writer, 502, f"{authority} ({target[0]}:{target[1]}) does not answer: {e}")
            return
        log.info("CONNECT %s -> %s:%d", authority, *target)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, status: int, why: str) -> None:
        log.warning("refused: %s", why)
        body = (why + "\n").encode()
        writer.write(f"HTTP/1.1 {status} Refused\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def serve(routes: dict[str, tuple[str, int]], port_file: pathlib.Path,
                routes_file: pathlib.Path | None = None) -> None:
    proxy = ConnectProxy(routes, routes_file)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, limit=HEAD_LIMIT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The port file says "ready": from then on a SIGTERM is a clean stop.
    port = server.sockets[0].getsockname()[1]
    port_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)
    log.info("listening on 127.0.0.1:%d for %s", port, ", ".join(sorted(proxy.routes)))
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.real.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True, type=pathlib.Path, help="where to write the chosen port")
    parser.add_argument("--map", action="append", default=[], metavar="HOST[:PORT]=127.0.0.1:PORT")
    parser.add_argument("--routes-file", type=pathlib.Path, help="entries one per line, read again when it changes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.map and args.routes_file:
        parser.error("give the entries with --map or in --routes-file, not both")
    try:
        routes = read_routes(args.routes_file) if args.routes_file else parse_map(args.map)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    asyncio.run(serve(routes, args.port_file, args.routes_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
