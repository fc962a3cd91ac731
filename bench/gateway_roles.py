"""The processes the gateway benchmark (bench/gateway_bench.py) starts of itself: the gateway under test
(serve-gateway), the upstream's token and watch stubs (stubs), and the client that holds connections open (hold)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pathlib
import signal
import ssl
import sys

from bench.gateway_rig import API, CLUSTER, DEX, ENTRANCE, ISSUER, PEER_UUID, make_token_from_dir


# ----- subcommand: the gateway under test ---------------------------------------------------------------------------
def serve_gateway(cfg_json: str) -> None:
    import uvloop
    profile = os.environ.get("GATEWAY_BENCH_PROFILE")
    if profile:
        # Profiles the single-process gateway for hot-path work: GATEWAY_BENCH_PROFILE=out.pstats
        import cProfile
        cProfile.runctx("uvloop.run(_serve_gateway(json.loads(cfg_json)))", globals(), locals(), profile)
        return
    if os.environ.get("GATEWAY_BENCH_LOOP") == "asyncio":
        asyncio.run(_serve_gateway(json.loads(cfg_json)))
        return
    uvloop.run(_serve_gateway(json.loads(cfg_json)))


async def _serve_gateway(cfg: dict) -> None:
    from gateway.config import GatewayConfig, Limits
    from contract.errors import Refusal
    from gateway.registry import Registry
    from gateway.server import Gateway

    d = pathlib.Path(cfg["dir"])
    read = lambda name: (d / name).read_bytes()  # noqa: E731

    class Handlers:
        async def peer_call(self, call):
            return {}

        async def join(self, call):
            raise Refusal(403, "Refused", "the benchmark does not join")

    config = GatewayConfig(public_domain_template="%s.bench.lab", api_server=f"https://{API}",
                           api_ca_pem=read("api-ca.crt"), dex_url=f"https://{DEX}", dex_ca_pem=read("api-ca.crt"),
                           dex_client_id="gateway", dex_client_secret=lambda: "secret",
                           resolve={API: f"127.0.0.1:{cfg['upstream_port']}", DEX: f"127.0.0.1:{cfg['dex_port']}"},
                           workers=cfg["workers"], entrance_port=cfg["port"], access_log=False,
                           # One peer holds every benchmark connection: its per-peer limit (2,000 by default)
                           # would refuse most of the 5,000 idle ones after their handshakes.
                           limits=Limits(max_connections=20000, max_connections_per_peer=20000))
    gw = Gateway(config, Handlers())
    await gw.start()
    gw.reload_certificates(entrance_cert_pem=read("entrance.crt"), entrance_key_pem=read("entrance.key"),
                           ca_pem=read("ca.crt"), egress_cert_pem=read("entrance.crt"),
                           egress_key_pem=read("entrance.key"))
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    gw.publish(Registry.from_objects(
        cluster_uuid=CLUSTER,
        clusterpeers=[{"metadata": {"name": "peer"}, "status": {"effectiveCapabilities": ["read"], "peer": {
            "clusterUUID": PEER_UUID, "issuer": {"url": ISSUER, "jwks": read("jwks.json").decode()}}}}],
        peer_secrets=[{"metadata": {"name": "peer-peer"}, "data": {"issued.crt": b64(read("client.crt"))}}],
        capabilities=[{"metadata": {"name": "read"}, "spec": {"version": "v1", "consumers": [
            {"namespace": "mod", "name": "controller"}]}, "status": {"conditions": [
                {"type": "Accepted", "status": "True"}]}}], generation=1))
    while gw.readiness()[0] is False:
        await asyncio.sleep(0.05)
    print("ready", gw.entrance_port, flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await gw.stop()


# ----- subcommand: Dex and the watch event source -------------------------------------------------------------------
def stubs(args: argparse.Namespace) -> None:
    import uvloop
    uvloop.run(_stubs(args))


async def _stubs(args: argparse.Namespace) -> None:
    from aiohttp import web
    d = pathlib.Path(args.dir)

    async def token(request: web.Request) -> web.Response:
        await request.post()
        return web.json_response({"access_token": "exchanged-token", "token_type": "bearer", "expires_in": 3600})

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        i = 0
        while True:
            i += 1
            await resp.write(b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"pod-0",'
                             b'"resourceVersion":"%d"}}}\n' % i)
            await asyncio.sleep(1)

    dex_app = web.Application()
    dex_app.router.add_post("/token", token)
    watch_app = web.Application()
    watch_app.router.add_get("/{tail:.*}", watch)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "api.crt", d / "api.key")
    runners = []
    for app, port, sslctx in ((dex_app, args.dex_port, ctx), (watch_app, args.port, None)):
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=sslctx, backlog=4096).start()
        runners.append(runner)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    for runner in runners:
        await runner.cleanup()


# ----- subcommand: hold many mTLS connections or watches open -----------------------------------------------------
def hold(args: argparse.Namespace) -> None:
    import uvloop
    uvloop.run(_hold(args))


async def _hold(args: argparse.Namespace) -> None:
    d = pathlib.Path(args.dir)
    # Each connection is made as a peer's egress makes it (gateway.tls.client_context): the client certificate
    # alone, as the driving nginx sends it too. A context that also sends the CA certificate along makes the
    # target decode and keep that certificate for the connection's life (5.5 KiB more with OpenSSL 3.0).
    from gateway.tls import client_context
    ctx = client_context((d / "ca.crt").read_bytes(), (d / "client.crt").read_bytes(), (d / "client.key").read_bytes())
    token = make_token_from_dir(d)
    events = 0
    writers = []
    ready = asyncio.Event()
    sem = asyncio.Semaphore(64)

    closed = 0

    async def one() -> None:
        nonlocal events, closed
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", args.port, ssl=ctx,
                                                           server_hostname=ENTRANCE)
            if args.watch:
                writer.write(f"GET /api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\nHost: {ENTRANCE}\r\n"
                             f"Authorization: Bearer {token}\r\n\r\n".encode())
                await reader.readuntil(b"\r\n\r\n")
        writers.append(writer)
        if len(writers) == args.n:
            ready.set()
        # A TLS 1.3 client finishes its handshake before the server has checked the client certificate, so a
        # connection the target refuses afterwards looks open here until its close arrives: count those.
        try:
            if args.watch:
                while await reader.readline():
                    events += 1
            else:
                await reader.read(1)
        except (ConnectionError, ssl.SSLError):
            pass
        closed += 1

    tasks = [asyncio.ensure_future(one()) for _ in range(args.n)]
    try:
        await asyncio.wait_for(ready.wait(), 180)
    except asyncio.TimeoutError:
        pass
    # Long enough for the target to have answered or refused every handshake it got.
    await asyncio.sleep(2)
    print("ready", len(writers) - closed, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print("events", events, "closed", closed, flush=True)
    for t in tasks:
        t.cancel()
    for w in writers:
        w.transport.abort()
