"""The peering processes of a lab cluster: the replicas of the module's Deployment, each with its own Lease
identity, ports and log, started, watched, stopped and spread across by the balancers (`Replicas`, the methods
`LabCluster` has for them)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pathlib
import signal
import sys
from typing import Any

import aiohttp

from lab.layout import NAMESPACE, ROOT, gather_all

log = logging.getLogger(__name__)

@dataclasses.dataclass
class Replica:
    """One peering process of a cluster: a replica of the module's Deployment."""

    index: int
    identity: str
    """Its Lease holder identity (its Pod's name)."""
    ports_file: pathlib.Path
    log: pathlib.Path
    process: asyncio.subprocess.Process | None = None
    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    state: str = "not started"
    watcher: asyncio.Task | None = None
    returncode: int | None = None
    """How its last process ended (None while it runs, or before it first ran)."""
    stopped_by: int | None = None
    """The signal `stop_replica` sent it last (None: it was not stopped by the lab)."""

    def info(self) -> dict:
        return {"index": self.index, "identity": self.identity, "state": self.state,
                "pid": self.process.pid if self.process else None, "ports": self.ports, "log": str(self.log)}


def peering_executable() -> list[str] | None:
    """How to run the `peering` console script here, or None while `control/cli.py` does not exist."""
    script = pathlib.Path(sys.executable).with_name("peering")
    if script.exists():
        return [str(script)]
    if (ROOT / "control" / "cli.py").exists():
        return [sys.executable, "-m", "control.cli"]
    return None


def default_peering_command(cluster: Any) -> list[str] | None:
    """The real peering process for `cluster`, with its listeners on loopback and the lab's resolver map."""
    exe = peering_executable()
    if exe is None:
        return None
    c = cluster.name
    cmd = exe + [
        "run",
        "--kubeconfig", str(cluster.path("peering-kubeconfig")),
        "--namespace", NAMESPACE,
        "--public-domain-template", f"%s.{c}.lab",
        "--bind-host", "127.0.0.1",
        "--entrance-port", "0", "--join-port", "0", "--egress-port", "0", "--ops-port", "0",
        "--ports-file", str(cluster.path("ports.json")),
        "--dex-url", cluster.dex_issuer,
        "--dex-ca-file", str(cluster.path("public-ca.crt")),
        "--identity", f"lab-{c}",
    ]
    for host, target in sorted(cluster.process_resolve().items()):
        cmd += ["--resolve", f"{host}={target}"]
    return cmd



class Replicas:
    """The replicas of a `LabCluster` (lab/cluster.py)."""

    async def start_peering(self) -> None:
        """Start every replica of the peering process (`replicas`), concurrently; each joins the balancers once its
        `/readyz` answers."""
        if self.peering_command is None:
            self.peering_state = "disabled"
            return
        base = self.peering_command(self)
        if base is None:
            self.peering_state = "absent: control/cli.py with `peering run` does not exist yet"
            log.info("cluster %s: no peering process (%s)", self.name, self.peering_state)
            return
        # Asked once per start (a test's command may set things up as it is asked); every replica runs it.
        self._peering_base = base
        self.peering_state = "starting"
        await gather_all(self.start_replica(r.index) for r in self.replicas)
        self.peering_state = "running"
        self._write_files()

    def replica_command(self, index: int) -> list[str] | None:
        """The command of replica `index`: the peering command of the last `start_peering`, with, when there are
        several replicas, the replica's own ports file and Lease identity (later flags win in `peering run`)."""
        cmd = self._peering_base
        if cmd is None or len(self.replicas) == 1:
            return cmd
        replica = self.replicas[index]
        return cmd + ["--ports-file", str(replica.ports_file), "--identity", replica.identity]

    async def start_replica(self, index: int) -> None:
        """Start (or start again) replica `index`; returns once it is ready and behind the balancers."""
        replica = self.replicas[index]
        if replica.process is not None and replica.process.returncode is None:
            raise RuntimeError(f"cluster {self.name}: replica {index} ({replica.identity}) already runs; stop it first")
        cmd = self.replica_command(index)
        if cmd is None:
            raise RuntimeError(f"cluster {self.name}: replica {index} cannot start before the peering process was "
                               "started once (start_peering), or without a peering command")
        replica.ports_file.unlink(missing_ok=True)
        env = {**os.environ, "SSL_CERT_FILE": str(self.path("ca-bundle.crt")), "PYTHONUNBUFFERED": "1"}
        logf = open(replica.log, "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, env=env, cwd=str(ROOT),
            )
        finally:
            logf.close()
        replica.process = proc
        replica.state = "starting"
        replica.returncode = replica.stopped_by = None
        try:
            replica.ports = await self._wait_ready(replica, proc)
        except BaseException:
            # The start may be failing because it is being cancelled: the process must still be reaped, so the stop
            # runs as its own task that a second cancellation cannot cut short before the child is waited for.
            stopping = asyncio.ensure_future(self.stop_replica(index))
            try:
                await asyncio.shield(stopping)
            except asyncio.CancelledError:
                await stopping
                raise
            raise
        replica.state = "running"
        # Like the endpoints controller: a replica that exits leaves the Service's endpoints.
        replica.watcher = asyncio.ensure_future(self._watch_exit(replica, proc))
        self._publish_endpoints()
        await self._publish_workload()

    async def _watch_exit(self, replica: "Replica", proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        exited = replica.process is proc  # not stopped by stop_replica, which publishes the Pods itself
        if exited:
            replica.state = f"exited ({proc.returncode})"
            replica.returncode = proc.returncode
            log.info("cluster %s: replica %d (%s) exited with %s", self.name, replica.index, replica.identity,
                     proc.returncode)
        self._publish_endpoints()
        if exited:
            await self._publish_workload()

    async def _publish_workload(self) -> None:
        """Like the kubelet and the deployment controller: the replicas' Pods and the Deployment's status."""
        if self.workload is not None:
            await self.workload.publish(self.replicas)

    def _publish_endpoints(self) -> None:
        """The balancers send to the replicas that are running (ready, not exited, not being stopped)."""
        live = [r for r in self.replicas if r.state == "running" and r.process is not None
                and r.process.returncode is None]
        if self.ingress is not None:
            self.ingress.set_backends([r.ports["join"] for r in live])
        if self.entrance_lb is not None:
            self.entrance_lb.set_targets([r.ports["entrance"] for r in live])
        if self.egress_svc is not None:
            self.egress_svc.set_targets([r.ports["egress"] for r in live])

    async def _wait_ready(self, replica: "Replica", proc: asyncio.subprocess.Process) -> dict[str, int]:
        # `proc`, not `replica.process`: a concurrent stop clears the attribute while this poll is still running.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        ports: dict[str, int] | None = None
        what = f"cluster {self.name}: the peering process" + (f" (replica {replica.index}, {replica.identity})"
                                                               if len(self.replicas) > 1 else "")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"{what} exited with {proc.returncode}; "
                                       f"see {replica.log}:\n{self._log_tail(replica.log)}")
                if loop.time() > deadline:
                    raise TimeoutError(f"{what} was not ready within "
                                       f"{self.ready_timeout:.0f}s; see {replica.log}:\n{self._log_tail(replica.log)}")
                if ports is None and replica.ports_file.exists():
                    ports = {k: int(v) for k, v in json.loads(replica.ports_file.read_text()).items()}
                if ports is not None:
                    try:
                        async with http.get(f"http://127.0.0.1:{ports['ops']}/readyz") as r:
                            if r.status == 200:
                                return ports
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        pass
                # Bounded poll: the process signals nothing else we could wait on.
                await asyncio.sleep(0.1)

    def _log_tail(self, path: pathlib.Path | None = None, lines: int = 20) -> str:
        try:
            return "\n".join((path or self.path("peering.log")).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop_replica(self, index: int, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Stop replica `index` with `sig` (SIGTERM: a clean stop, which releases the Lease; SIGKILL: a crash) and
        wait for it to exit; its exit code, or None when it was not running.

        With SIGTERM it leaves the balancers first, as a terminating Pod leaves its Service's endpoints; a killed
        one stays in them until its exit is seen, and meanwhile the balancers skip it because it refuses
        connections. A process that ignores SIGTERM for `timeout` seconds is killed."""
        replica = self.replicas[index]
        proc, replica.process = replica.process, None
        watcher, replica.watcher = replica.watcher, None
        if proc is None:
            return None
        if sig != signal.SIGKILL:
            replica.state = "stopping"
            self._publish_endpoints()
        if proc.returncode is None:
            proc.send_signal(sig)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("cluster %s: the peering process %s ignored signal %s for %ss; killing it", self.name,
                            replica.identity, sig, timeout)
                proc.kill()
                await proc.wait()
        replica.state = f"stopped (exit {proc.returncode})"
        replica.returncode, replica.stopped_by = proc.returncode, sig
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self._publish_endpoints()
        await self._publish_workload()
        return proc.returncode

    async def stop_peering(self) -> None:
        """Stop every replica (SIGTERM, concurrently)."""
        if all(r.process is None for r in self.replicas):
            return
        await asyncio.gather(*(self.stop_replica(r.index) for r in self.replicas))
        codes = [r.state.removeprefix("stopped (exit ").rstrip(")") for r in self.replicas]
        self.peering_state = f"stopped (exit {', '.join(codes)})"

    def leader(self) -> "Replica | None":
        """The replica that holds the Lease `d8-peering/peering` now (by its holder identity), or None."""
        lease = self.api.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return next((r for r in self.replicas if r.identity == holder), None)

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The first replica's process (the only one unless `replicas` > 1)."""
        return self.replicas[0].process

    @property
    def ports(self) -> dict[str, int]:
        """The first replica's ports."""
        return self.replicas[0].ports

