"""What every reconciler and request handler of the process is given: the settings, the one API session, the
shared informers, the handler registry, the controller that runs the reconcilers, the clock, the gateway's
exchange failures, and what they share (the discovery cache, the Event recorder, the ClusterPeer reconciler's
memory, the client toward the peers).

It is built by `control.process.Runtime` (the composition root) with everything it holds, before any reconciler
is made from it, and imports nothing of the reconcilers or the handlers, so that they may all import it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Callable

from contract.names import CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_NAMESPACE
from gateway.resolve import OverrideResolver

from control.clock import SYSTEM, Clock
from control.config import Settings
from control.events import EventRecorder
from control.facts import Discovery
from control.feed import Published, cluster_uuid_from
from control.handlers.dispatch import Handlers
from control.informers import Informers
from control.kube import CONFIGMAPS, KubeSession
from control.peerclient import PeerClient
from control.reconcilers.memory import Memory
from control.rules.served import admits_certificate
from control.watch import ObjectPoller

if TYPE_CHECKING:
    from control.workqueue import Controller


@dataclasses.dataclass
class Context:
    """What a reconciler factory gets: the settings, the API session, the shared informers, the handlers."""

    settings: Settings
    kube: KubeSession
    informers: Informers
    handlers: Handlers
    controller: "Controller | None" = None
    """What runs the reconcilers on the Lease holder (made before them, empty); None where none run (a test of
    the handlers alone): `enqueue` does nothing then and `leading` is false."""
    exchange_failures: Callable[[], dict[str, tuple[str, str]]] = lambda: {}
    """The gateway's last failed token exchange per Dex connector (reason, message); see Gateway."""
    clock: Clock = SYSTEM
    """Where every reconciler reads the time (a test gives a fake one)."""
    published: Published | None = None
    """The registry this replica's gateway decides on (the feed's): what the control loop announces is held back
    until it is served here. None where no gateway runs in the process (a tool, a test of the rules): nothing is
    held back then."""
    written_status: dict[str, tuple[str, dict]] = dataclasses.field(default_factory=dict)
    """The status the ClusterPeer reconciler of this process last wrote, by ClusterPeer: the resourceVersion that
    write replaced, and the status written (`current_status`)."""

    def current_status(self, cp: dict | None) -> dict:
        """The status of the cached ClusterPeer `cp` as this process last knows the API to hold it: the status its
        reconciler wrote while the cache still holds the object that write replaced (the watch has not delivered
        it yet), else the cached one. A peer handler answers from it as fresh as a read of the API would be for
        what this process wrote, without one."""
        meta = (cp or {}).get("metadata") or {}
        written = self.written_status.get(meta.get("name") or "")
        if written is not None and written[0] == meta.get("resourceVersion"):
            return written[1]
        return (cp or {}).get("status") or {}

    def enqueue(self, reconciler: str, key: str) -> None:
        """Queue `key` for the named reconciler now (a request handler's nudge); a replica that does not lead has
        no running queue and ignores it: the leader's own periodic pass covers it."""
        if self.controller is None or not self.leading:
            return
        for runner in self.controller.runners:
            if runner.reconciler.name == reconciler:
                runner.queue.add(key)

    @property
    def namespace(self) -> str:
        return self.settings.kube.namespace

    @property
    def leading(self) -> bool:
        """Whether this replica holds the Lease (its reconcilers run)."""
        return self.controller is not None and self.controller.leading

    @functools.cached_property
    def events(self) -> EventRecorder:
        """The one writer of Kubernetes Events, silent unless this replica leads."""
        return EventRecorder(self.kube, identity=self.settings.lease.identity, leading=lambda: self.leading,
                             clock=self.clock)

    @functools.cached_property
    def discovery(self) -> Discovery:
        """One discovery cache (resource scopes) for every reconciler that needs it."""
        return Discovery(self.kube, clock=self.clock)

    @functools.cached_property
    def peer_memory(self) -> Memory:
        """What the ClusterPeer reconciler keeps between passes, which the peer handlers (a pull now) and the
        metrics (the last sync) read too."""
        return Memory(sync_interval=self.settings.control.peer_sync_interval, clock=self.clock)

    @functools.cached_property
    def peer_client(self) -> PeerClient:
        """The one client toward the peers' join endpoints and entrances (with the settings' host overrides)."""
        return PeerClient(OverrideResolver(self.settings.resolve))

    async def close(self) -> None:
        """Close what the Context made (the peer client and its resolver, once used)."""
        client = self.__dict__.pop("peer_client", None)
        if client is not None:
            await client.close()
            await client.resolver.close()

    async def admitted(self, clusterpeer: str, cert_pem: str) -> bool:
        """Wait (at most `served_wait`) until this replica's entrance admits `cert_pem` as ClusterPeer
        `clusterpeer`'s peer: an answer that hands a peer a certificate is sent then (rules/served.py). False when
        it did not in time (the answer goes anyway: the entrance catches up, the peer retries)."""
        if self.published is None:
            return True
        return await self.published.until(lambda registry: admits_certificate(registry, clusterpeer, cert_pem),
                                          self.settings.control.served_wait)

    async def entrance_serves(self) -> bool:
        """Wait (at most `served_wait`) until this replica's gateway serves valid server certificates: a process
        back after an outage longer than they last serves none until its leader renewed them, and a peer that it
        calls before then cannot call back (the renewal of an expired client certificate makes the peer pull at
        once). False when it did not in time (the call goes anyway: the peer retries with its backoff)."""
        if self.published is None:
            return True
        return await self.published.until_serving(self.settings.control.served_wait)

    def cluster_uuid_informer(self) -> ObjectPoller:
        """The shared reader of kube-system/d8-cluster-uuid (a GET poller: the process may only get it)."""
        return self.informers.get_object(CONFIGMAPS, CLUSTER_UUID_CONFIGMAP, namespace=CLUSTER_UUID_NAMESPACE)

    def cluster_uuid(self) -> str:
        """This cluster's UUID from the cache ("" until the ConfigMap is seen)."""
        return cluster_uuid_from(self.cluster_uuid_informer().get(CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_NAMESPACE))
