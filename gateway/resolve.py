"""Name overrides for every outgoing HTTP client, so lab host names are real TLS names on loopback."""

from __future__ import annotations

import socket
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver


def parse_resolve_args(values: list[str]) -> dict[str, str]:
    """Turn repeatable `--resolve host=ip:port` flags into a map; a malformed flag raises ValueError saying which."""
    result: dict[str, str] = {}
    for value in values or ():
        host, sep, target = value.partition("=")
        ip, colon, port = target.rpartition(":")
        if not sep or not host or not colon or not ip or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--resolve {value!r}: expected host=ip:port, for example api.x.lab=127.0.0.1:6443")
        result[host.strip().lower().rstrip(".")] = f"{ip.strip('[]')}:{int(port)}"
    return result


def split_authority(authority: str, default_port: int = 443) -> tuple[str, int]:
    """`host[:port]` of a URL (brackets of an IPv6 literal removed), the port defaulting to HTTPS's."""
    host, _, port = authority.rpartition(":") if authority.rsplit(":", 1)[-1].isdigit() else (authority, "", "")
    return host.strip("[]"), int(port) if port else default_port


def split_target(target: str) -> tuple[str, int]:
    ip, _, port = target.rpartition(":")
    return ip.strip("[]"), int(port)


class OverrideResolver(AbstractResolver):
    """Sends a connection to a mapped host (whatever port was asked) to its mapped address; DNS otherwise."""

    def __init__(self, overrides: dict[str, str] | None = None, fallback: AbstractResolver | None = None) -> None:
        self._overrides = {h.lower().rstrip("."): split_target(t) for h, t in (overrides or {}).items()}
        self._fallback = fallback
        self._own_fallback = fallback is None

    def lookup(self, host: str) -> tuple[str, int] | None:
        return self._overrides.get(host.lower().rstrip("."))

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        hit = self.lookup(host)
        if hit is not None:
            ip, mapped_port = hit
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            return [ResolveResult(hostname=host, host=ip, port=mapped_port, family=fam, proto=0,
                                  flags=socket.AI_NUMERICHOST)]
        if self._fallback is None:
            self._fallback = DefaultResolver()
        return await self._fallback.resolve(host, port, family)

    async def close(self) -> None:
        if self._fallback is not None and self._own_fallback:
            await self._fallback.close()
            self._fallback = None

    def __repr__(self) -> str:  # pragma: no cover - diagnostics only
        return f"OverrideResolver({sorted(self._overrides)})"

    def __reduce__(self) -> Any:  # workers rebuild it from the same map
        return (OverrideResolver, ({h: f"{ip}:{p}" for h, (ip, p) in self._overrides.items()},))
