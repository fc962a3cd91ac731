"""Upstream Dex, built from its Go module (`build.py`), as one process on loopback: what the differential test
holds the lab's Dex (lab/dex.py) to.

    dex = UpstreamDex(DIR, "https://dex.t.lab/", serving=cert, ca_pem=ca, config={"staticClients": [...], ...})
    await dex.start()        # returns once its discovery document answers over TLS
    dex.port                 # https://127.0.0.1:<port>, serving `cert` (which must name 127.0.0.1)
    await dex.stop()         # SIGTERM by its pid, SIGKILL after a bound

`config` is Dex's config file as a dict (`staticClients`, `connectors`, `expiry`, `oauth2`, ...); this sets the
rest: `issuer`, `storage` (memory), `web` (https only, on 127.0.0.1 with `serving`) and `logger` (debug, JSON, so
that a refusal's reason is in the log). The port is picked by binding 127.0.0.1:0; a clash with another process
that took it meanwhile is seen in Dex's log and retried with a new port, as for the control plane. Files under
DIR: `config.yaml` (0600: it holds the client secrets), `tls.crt`, `tls.key` and `dex.log`.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from typing import Mapping

import yaml

from lab import certs
from lab.real import build as builder
from lab.real.process import (POLL_INTERVAL, STOP_TIMEOUT, Process, StartError, free_port, get_ok_blocking, go_env, tail,
                              write)

START_TIMEOUT = 30.0
START_ATTEMPTS = 3
# Set here, whatever `config` says: where Dex listens and keeps its state is the runner's business.
_OWNED_KEYS = ("issuer", "storage", "web", "logger")


class UpstreamDex:
    """The built `dex` binary serving `issuer` with `config`, its files under `dir`."""

    def __init__(self, dir: os.PathLike | str, issuer: str, *, serving: certs.CertKey, ca_pem: bytes,
                 config: Mapping, binary: pathlib.Path | None = None) -> None:
        owned = [k for k in _OWNED_KEYS if k in config]
        if owned:
            raise ValueError(f"config sets {', '.join(owned)}: UpstreamDex sets those itself; leave them out")
        self.dir = pathlib.Path(dir)
        self.issuer = issuer
        self.config = dict(config)
        self._serving = serving
        self._ca_pem = ca_pem
        self._binary = binary
        self.port = 0
        self._process: Process | None = None

    @property
    def log_path(self) -> pathlib.Path:
        return self.dir / "dex.log"

    def _render(self) -> dict:
        return {
            **self.config,
            "issuer": self.issuer,
            "storage": {"type": "memory"},
            "web": {"https": f"127.0.0.1:{self.port}", "tlsCert": str(self.dir / "tls.crt"),
                    "tlsKey": str(self.dir / "tls.key")},
            "logger": {"level": "debug", "format": "json"},
        }

    def _ready_url(self) -> str:
        path = self.issuer.split("://", 1)[-1].partition("/")[2].rstrip("/")
        return f"https://127.0.0.1:{self.port}/{path + '/' if path else ''}.well-known/openid-configuration"

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start Dex and return once discovery answers 200; StartError quoting its log when it does not."""
        binary = self._binary or builder.require_dex()
        write(self.dir / "tls.crt", self._serving.cert_pem, 0o644)
        write(self.dir / "tls.key", self._serving.key_pem)
        ctx = certs.client_ssl_context(self._ca_pem)
        env = go_env(dict(os.environ))
        deadline = time.monotonic() + timeout
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            write(self.dir / "config.yaml", yaml.safe_dump(self._render(), sort_keys=False))
            proc = Process("dex", [str(binary), "serve", str(self.dir / "config.yaml")], self.log_path, env)
            self._process = proc
            try:
                await self._wait(proc, ctx, deadline)
                return
            except StartError:
                await proc.stop(STOP_TIMEOUT)
                self._process = None
                if not proc.port_clash() or attempt == START_ATTEMPTS:
                    raise

    async def _wait(self, proc: Process, ctx, deadline: float) -> None:
        url = self._ready_url()
        while True:
            rc = proc.exited()
            if rc is not None:
                raise StartError(f"dex exited with code {rc} while starting; the end of {self.log_path}:\n"
                                 f"{tail(self.log_path)}")
            if await asyncio.to_thread(get_ok_blocking, url, ctx):
                return
            if time.monotonic() > deadline:
                raise StartError(f"dex did not serve {url} within {time.monotonic() - proc.started:.0f} s; the "
                                 f"end of {self.log_path}:\n{tail(self.log_path)}")
            await asyncio.sleep(POLL_INTERVAL)

    async def stop(self) -> None:
        proc, self._process = self._process, None
        if proc is not None:
            await proc.stop(STOP_TIMEOUT)

    async def __aenter__(self) -> "UpstreamDex":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
