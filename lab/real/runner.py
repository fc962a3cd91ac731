"""One lab cluster's real control plane: etcd, kube-apiserver and kube-controller-manager as processes on loopback.

    plane = RealControlPlane("a", DIR / "a", pki=certs.cluster_pki("a"),
                             jwt_issuer=JWTIssuer("https://dex.a.lab", pki.public_ca.cert_pem),
                             resolve={"dex.a.lab": "127.0.0.1:41234"})
    await plane.start()                      # returns once /readyz is 200 and the controllers serve /healthz
    plane.url, plane.ca_pem, plane.tls_server_name, plane.admin_kubeconfig
    await plane.install_crds([CHART_CRDS])   # through the real API server's validation; waits for Established
    await plane.apply([namespace, secret])   # server-side apply, any kind the server serves
    token = await plane.service_account_token("d8-peering", "peering", seconds=3600)
    await plane.stop()                       # SIGTERM each process by its pid, SIGKILL after a bound

Every process binds 127.0.0.1 on a port picked by binding 127.0.0.1:0 (a clash with another process that took it
meanwhile is seen in the log and retried with new ports). Files under DIR (the lab cluster's directory):
`etcd/` (data and its certificates), `kube-apiserver/` (certificates, keys, the authentication configuration,
`admin.kubeconfig`), `kube-controller-manager/`, `proxy/`, one log per process (`etcd.log`,
`kube-apiserver.log`, `kube-controller-manager.log`, `proxy.log`) and `control-plane.json` (pids and ports).

kube-apiserver reaches the JWT issuer by its name through `lab.real.proxy` (an HTTPS_PROXY on loopback that
knows only the names in `resolve`); see that module for why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pathlib
import ssl
import sys
import time
from typing import Any, Iterable, Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lab import certs
from lab.real import build as builder
from lab.real.process import (POLL_INTERVAL, START_TIMEOUT, STOP_TIMEOUT, Process, StartError, free_port, go_env,
                              get_ok_blocking, tail, write)
from lab.real.proxy import parse_map, write_routes
from lab.real.seeding import Seeding
from lab.real.config import (
    Files, JWTIssuer, apiserver_args, authentication_configuration, controller_manager_args, etcd_args,
)

log = logging.getLogger(__name__)

class RealControlPlane(Seeding):
    """etcd + kube-apiserver + kube-controller-manager for lab cluster `name`, with its files under `dir`."""

    def __init__(self, name: str, dir: os.PathLike | str, *, pki: certs.ClusterPKI | None = None,
                 jwt_issuer: JWTIssuer | None = None, resolve: Mapping[str, str] | None = None,
                 binaries: builder.Binaries | None = None, verbosity: int = 1,
                 start_attempts: int = 5) -> None:
        certs.check_cluster_name(name)
        self.name = name
        self.files = Files(pathlib.Path(dir).resolve())
        self.pki = pki or certs.cluster_pki(name)
        self.jwt_issuer = jwt_issuer
        # The names kube-apiserver must reach (the issuer's host, at least): {"dex.a.lab": "127.0.0.1:port"}.
        self.resolve = dict(resolve or {})
        for host, target in self.resolve.items():
            try:
                parse_map([f"{host}={target}"])
            except ValueError:
                raise ValueError(f"resolve[{host!r}] = {target!r}: give the name's listener as 127.0.0.1:PORT "
                                 f"(kube-apiserver reaches lab names on loopback only)") from None
        self._binaries = binaries
        self.verbosity = verbosity
        self.start_attempts = start_attempts
        # Certificates only the control plane's own parts use: etcd's serving and client certificates, the
        # controller manager's serving certificate.
        self._internal_ca = certs.CA(f"lab control-plane CA ({name})")
        self._kcm_client = self.pki.client_ca.issue_client("system:kube-controller-manager")
        self._processes: dict[str, Process] = {}
        self.ports: dict[str, int] = {}
        self._discovery: dict[tuple[str, str], tuple[str, bool]] = {}
        self.startup_seconds: dict[str, float] = {}
        # Where install_crds took Deckhouse's x-kubernetes-sensitive-data out of the CRDs given to start().
        self.stripped: list[str] = []

    # --- what the lab reads ---

    @property
    def binaries(self) -> builder.Binaries:
        if self._binaries is None:
            self._binaries = builder.require_built()
        return self._binaries

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def ca_pem(self) -> bytes:
        """The CA that signs kube-apiserver's serving certificate (the lab's public CA of this cluster)."""
        return self.pki.public_ca.cert_pem

    @property
    def tls_server_name(self) -> str:
        return certs.api_host(self.name)

    @property
    def admin_kubeconfig(self) -> pathlib.Path:
        """cluster-admin by client certificate (CN=admin, O=system:masters), usable by kubectl as is."""
        return self.files.admin_kubeconfig

    def kubeconfig(self, user: Mapping[str, Any]) -> dict:
        """A kubeconfig for this API server with `user` (a kubeconfig user entry: a token, or client cert data)."""
        return certs.kubeconfig(self.name, self.url, self.ca_pem, self.tls_server_name, dict(user))

    def ssl_context(self, cert: certs.CertKey | None = None) -> ssl.SSLContext:
        """A client context trusting this API server, presenting `cert` if given (`self.pki.admin` for the admin).

        None by default, for bearer tokens: kube-apiserver authenticates a client certificate before a token, so a
        request carrying both is the certificate's user, whatever the token says."""
        return certs.client_ssl_context(self.ca_pem, cert)

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._processes.items() if p.exited() is None}

    def info(self) -> dict:
        return {"apiServer": self.url if "apiserver" in self.ports else None, "ports": dict(self.ports),
                "pids": self.pids(), "logs": {n: str(self.files.log(n)) for n in self._processes},
                "kubeconfig": str(self.admin_kubeconfig), "versions": {
                    "kube": self.binaries.kube_version, "etcd": self.binaries.etcd_version},
                "startupSeconds": dict(self.startup_seconds)}

    # --- start and stop ---

    async def start(self, timeout: float = START_TIMEOUT, *, crds: Iterable[os.PathLike | str | Mapping] = ()) -> None:
        """Start every process in order and return once each is ready; on failure, stop what started and raise
        StartError quoting the log of the one that failed.

        `crds` are installed (`install_crds`) before kube-controller-manager starts, as on a cluster whose CRDs
        long exist: its garbage collector reads discovery at start and then only every 30 s, so a CRD installed
        after it started has its objects' dependents collected only from that next reading on."""
        bins = self.binaries
        deadline = time.monotonic() + timeout
        self._write_files()
        try:
            t0 = time.monotonic()
            if self.resolve:
                await self._start_proxy(deadline)
                self.startup_seconds["proxy"] = round(time.monotonic() - t0, 2)
            te = time.monotonic()
            await self._start_with_ports("etcd", ("etcd", "etcd-peer"), deadline, lambda: [
                str(bins.etcd), *etcd_args(self.name, self.files, self.ports["etcd"], self.ports["etcd-peer"])],
                self._etcd_ready)
            self.startup_seconds["etcd"] = round(time.monotonic() - te, 2)
            t1 = time.monotonic()
            await self._start_with_ports("kube-apiserver", ("apiserver",), deadline, lambda: [
                str(bins.kube_apiserver), *apiserver_args(self.files, self.ports["apiserver"], self.ports["etcd"],
                                                          verbosity=self.verbosity)],
                self._apiserver_ready)
            self.startup_seconds["kube-apiserver"] = round(time.monotonic() - t1, 2)
            self._write_kubeconfigs()
            crds = list(crds)
            if crds:
                tc = time.monotonic()
                self.stripped = await self.install_crds(crds)
                self.startup_seconds["crds"] = round(time.monotonic() - tc, 2)
            t2 = time.monotonic()
            await self._start_with_ports("kube-controller-manager", ("controller-manager",), deadline, lambda: [
                str(bins.kube_controller_manager), *controller_manager_args(
                    self.files, self.ports["controller-manager"], self.name, verbosity=self.verbosity)],
                self._kcm_ready)
            self.startup_seconds["kube-controller-manager"] = round(time.monotonic() - t2, 2)
            self.startup_seconds["total"] = round(time.monotonic() - t0, 2)
        except BaseException:
            await self.stop()
            raise
        self._write_pids()
        log.info("control plane of %s ready in %.1f s at %s", self.name, self.startup_seconds["total"], self.url)

    async def restart_apiserver(self, timeout: float = START_TIMEOUT) -> None:
        """Stop kube-apiserver and start it again on the same port, as an upgrade or a crash of the API server
        does: etcd keeps every object, while the new process's watch cache starts at etcd's current revision, so a
        watch from an older resourceVersion is answered 410 Gone (`too old resource version`) and must relist."""
        proc = self._processes.get("kube-apiserver")
        if proc is None:
            raise StartError(f"the control plane of {self.name} is not started")
        await proc.stop(STOP_TIMEOUT)
        new = self._spawn("kube-apiserver", [str(self.binaries.kube_apiserver), *apiserver_args(
            self.files, self.ports["apiserver"], self.ports["etcd"], verbosity=self.verbosity)])
        await self._wait(new, self._apiserver_ready, time.monotonic() + timeout)
        self._write_pids()

    def route(self, host: str, target: str) -> None:
        """From now on kube-apiserver reaches `host` (a name of `resolve`) at `target` (127.0.0.1:PORT): the next
        CONNECT through the proxy goes there, without a restart (a kept plane and the next cluster's Dex)."""
        if host not in self.resolve:
            raise ValueError(f"{host!r} is not a name this control plane resolves ({', '.join(sorted(self.resolve))})")
        parse_map([f"{host}={target}"])
        self.resolve[host] = target
        write_routes(self.files.proxy_routes, self.resolve)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll kube-apiserver's /readyz (as the admin) until it answers 200; StartError after `timeout` seconds
        or at once if kube-apiserver is not running."""
        proc = self._processes.get("kube-apiserver")
        if proc is None:
            raise StartError(f"the control plane of {self.name} is not started")
        await self._wait(proc, self._apiserver_ready, time.monotonic() + timeout, stop_on_timeout=False)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every process, the last started first, each by its pid."""
        for name in reversed(list(self._processes)):
            await self._processes[name].stop(timeout)
        self._processes.clear()
        with contextlib.suppress(OSError):
            self.files.pids.unlink()

    async def __aenter__(self) -> "RealControlPlane":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def _env(self) -> dict[str, str]:
        env = go_env(dict(os.environ))
        if "proxy" in self.ports:
            # Go never proxies loopback addresses (etcd, the controller manager's own calls): only the names.
            env["HTTPS_PROXY"] = f"http://127.0.0.1:{self.ports['proxy']}"
            env["NO_PROXY"] = "127.0.0.1,localhost,::1"
        return env

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.files.log(name), self._env())
        self._processes[name] = proc
        return proc

    async def _start_proxy(self, deadline: float) -> None:
        self.files.proxy_port.unlink(missing_ok=True)
        write_routes(self.files.proxy_routes, self.resolve)
        proc = self._spawn("proxy", [sys.executable, "-m", "lab.real.proxy", "--port-file", str(self.files.proxy_port),
                                     "--routes-file", str(self.files.proxy_routes)])

        async def ready() -> bool:
            try:
                self.ports["proxy"] = int(self.files.proxy_port.read_text())
                return True
            except (OSError, ValueError):
                return False

        await self._wait(proc, ready, deadline)

    async def _start_with_ports(self, name: str, port_names: tuple[str, ...], deadline: float, argv,
                                ready) -> None:
        for attempt in range(1, self.start_attempts + 1):
            for p in port_names:
                self.ports[p] = free_port()
            proc = self._spawn(name, argv())
            try:
                await self._wait(proc, ready, deadline)
                return
            except StartError:
                if not proc.port_clash() or attempt == self.start_attempts:
                    raise
                log.info("%s lost a port to another process (attempt %d); retrying with new ports", name, attempt)
                await proc.stop(STOP_TIMEOUT)

    async def _wait(self, proc: Process, ready, deadline: float, *, stop_on_timeout: bool = True) -> None:
        """Poll `ready()` until it is true; fail at once when the process exits, or at the deadline (stopping a
        process that is still starting then)."""
        while True:
            rc = proc.exited()
            if rc is not None:
                raise StartError(f"{proc.name} exited with code {rc} while starting; the end of "
                                 f"{proc.log_path}:\n{tail(proc.log_path)}")
            if await ready():
                return
            if time.monotonic() > deadline:
                if stop_on_timeout:
                    await proc.stop(STOP_TIMEOUT)
                raise StartError(f"{proc.name} was not ready after {time.monotonic() - proc.started:.0f} s; the "
                                 f"end of {proc.log_path}:\n{tail(proc.log_path)}")
            await asyncio.sleep(POLL_INTERVAL)

    async def _get_ok(self, url: str, ctx: ssl.SSLContext) -> bool:
        """GET `url` is 200. A blocking request in a thread, whose socket is closed when it returns: an asyncio
        TLS connection closed just before its event loop ends (a test's) is reported as an unclosed transport."""
        return await asyncio.to_thread(get_ok_blocking, url, ctx)

    async def _etcd_ready(self) -> bool:
        return await self._get_ok(f"https://127.0.0.1:{self.ports['etcd']}/health", self._etcd_client_context())

    async def _apiserver_ready(self) -> bool:
        return await self._get_ok(f"{self.url}/readyz", self.ssl_context(self.pki.admin))

    async def _kcm_ready(self) -> bool:
        ctx = certs.client_ssl_context(self._internal_ca.cert_pem)
        return await self._get_ok(f"https://127.0.0.1:{self.ports['controller-manager']}/healthz", ctx)

    def _etcd_client_context(self) -> ssl.SSLContext:
        return certs.client_ssl_context(self._internal_ca.cert_pem, self._etcd_client)

    # --- files ---

    def _write_files(self) -> None:
        f = self.files
        ca = self._internal_ca
        etcd_server = ca.issue_server(["localhost"], ["127.0.0.1"])
        self._etcd_client = ca.issue_client("kube-apiserver-etcd-client")
        kcm_serving = ca.issue_server(["localhost"], ["127.0.0.1"])
        write(f.etcd_ca, ca.cert_pem, 0o644)
        write(f.etcd_cert, etcd_server.cert_pem, 0o644)
        write(f.etcd_key, etcd_server.key_pem)
        write(f.etcd_client_cert, self._etcd_client.cert_pem, 0o644)
        write(f.etcd_client_key, self._etcd_client.key_pem)
        write(f.serving_cert, self.pki.api.cert_pem, 0o644)
        write(f.serving_key, self.pki.api.key_pem)
        write(f.client_ca, self.pki.client_ca.cert_pem, 0o644)
        if not f.sa_key.exists():
            # The cluster's ServiceAccount signing key: kept across restarts of the same directory, so that tokens
            # issued before a restart stay valid, as on a real cluster.
            key = ec.generate_private_key(ec.SECP256R1())
            write(f.sa_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
            write(f.sa_pub, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
        write(f.authn_config, json.dumps(authentication_configuration(self.jwt_issuer), indent=2))
        write(f.kcm_cert, kcm_serving.cert_pem, 0o644)
        write(f.kcm_key, kcm_serving.key_pem)
        f.etcd_data.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _write_kubeconfigs(self) -> None:
        def cert_user(ck: certs.CertKey) -> dict:
            import base64
            return {"client-certificate-data": base64.b64encode(ck.cert_pem).decode(),
                    "client-key-data": base64.b64encode(ck.key_pem).decode()}

        # JSON, which every YAML reader reads the same: Go's YAML 1.1 takes an unquoted cluster name `y`, `n`,
        # `on` or `off` for a boolean, and PyYAML does not quote them.
        write(self.files.admin_kubeconfig, json.dumps(self.kubeconfig(cert_user(self.pki.admin)), indent=2))
        write(self.files.kcm_kubeconfig, json.dumps(self.kubeconfig(cert_user(self._kcm_client)), indent=2))

    def _write_pids(self) -> None:
        write(self.files.pids, json.dumps({"pids": self.pids(), "ports": self.ports}, indent=2) + "\n", 0o644)
