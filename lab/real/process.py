"""The processes of the real backend: started with a log of their own, killed with the lab, stopped by pid."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.client
import logging
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse

log = logging.getLogger(__name__)

START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0
POLL_INTERVAL = 0.1
# A port taken between our probe bind and the process's own bind shows up as this in the process's log.
_PORT_CLASH = ("address already in use", "bind: address already in use")
PROXY_VARS = {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
# Go's collector at its default (GOGC=100) is a third of kube-apiserver's CPU to ready and a quarter of etcd's; a
# lab's plane lives minutes and starts dozens of times in a test run, so it trades memory for CPU: GOGC=400
# measured 2.4-2.5 CPU-s to a ready kube-apiserver against 3.5-4.1 (RSS ~420 MiB against ~290), etcd 0.7 against
# 1.0. Behaviour is the same; a GOGC in the environment wins.
GO_GC_PERCENT = "400"


def go_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a Go component of the lab: without proxy variables of the caller's, with the lab's GOGC."""
    out = {k: v for k, v in env.items() if k.lower() not in PROXY_VARS}
    out.setdefault("GOGC", GO_GC_PERCENT)
    return out


class StartError(Exception):
    """A control-plane process did not come up; the message quotes the end of its log."""


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the caller retries if it is gone by the time it binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path: pathlib.Path, data: bytes | str, mode: int = 0o600) -> None:
    """Atomically, private by default: most of these files are keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def tail(path: pathlib.Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# Resolved here, not in the child: between fork and exec the child only makes this one foreign call.
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if the lab process dies without stopping us, the kernel kills us. SIGKILL,
    since all of them get it at once: a kube-apiserver told to stop gracefully while its etcd goes away hangs."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Process:
    """One started binary: its Popen (stopped by pid), its log, and where its log was when it started."""

    def __init__(self, name: str, argv: list[str], log_path: pathlib.Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as f:
            self.log_offset = f.tell()
            f.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            f.flush()
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        return self.popen.poll()

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def port_clash(self) -> bool:
        text = self.log_since_start().lower()
        return any(s in text for s in _PORT_CLASH)

    async def stop(self, timeout: float) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.popen.poll() is None:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", self.name, self.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            while self.popen.poll() is None:
                await asyncio.sleep(0.05)




def get_ok_blocking(url: str, ctx: ssl.SSLContext) -> bool:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=5)
    try:
        conn.request("GET", u.path or "/")
        r = conn.getresponse()
        r.read()
        return r.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()

