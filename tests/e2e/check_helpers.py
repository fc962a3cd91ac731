"""Running `peering check` against a lab cluster from a test, and reading its lines."""

from __future__ import annotations

import asyncio
import os

from lab.cluster import peering_executable


async def check(cluster, *args: str, kubeconfig: str | None = None, domain: bool = True,
                resolve: dict[str, str] | None = None) -> tuple[int, str]:
    """`peering check` as a process, with the cluster's kubeconfig, the lab's names (`resolve` sends some elsewhere)
    and what the lab trusts; `domain` False leaves the public domain template for the check to find."""
    cmd = [*peering_executable(), "check", "--kubeconfig", kubeconfig or str(cluster.path("kubeconfig"))]
    if domain:
        cmd += ["--public-domain-template", f"%s.{cluster.name}.lab"]
    for host, target in sorted({**cluster.process_resolve(), **(resolve or {})}.items()):
        cmd += ["--resolve", f"{host}={target}"]
    proc = await asyncio.create_subprocess_exec(
        *cmd, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SSL_CERT_FILE": str(cluster.path("ca-bundle.crt"))})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    print(f"$ peering check {' '.join(args)}  (cluster {cluster.name}, exit {proc.returncode})\n{text}{err.decode()}")
    assert "eyJ" not in text and "d8peer1." not in text, "a token or a connection string in the output"
    return proc.returncode, text


def line(text: str, check_name: str, mark: str = "✗") -> tuple[str, str]:
    """The first line of `check_name` with `mark` and its fix (empty when it has none)."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith(f"{mark} {check_name}:"):
            fix = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    fix: ") else ""
            return ln, fix
    raise AssertionError(f"no line {mark} {check_name}: in\n{text}")
