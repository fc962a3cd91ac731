"""What the ClusterPeer reconciler observed over the network and keeps between passes (not in the API): the last
join refusal, the last offer sync's failure, when to pull the peer's offer next, whether our credentials reached
the inviter. Shared with the request handlers (a notify asks for a pull now). Losing it on a restart is harmless:
every fact is observed again on the next pass."""

from __future__ import annotations

import dataclasses
import random

from control.clock import SYSTEM, Clock


@dataclasses.dataclass
class PeerMemory:
    #: ((uid, generation) of the spec it was seen with, reason, message) of the last join refusal.
    join_error: tuple[tuple[str, int], str, str] | None = None
    #: monotonic time before which a transient join failure is not retried.
    join_retry_at: float = 0.0
    join_failures: int = 0
    #: (reason, message) of the last failed sync; None after a successful one.
    sync_error: tuple[str, str] | None = None
    #: monotonic time of the next offer pull; 0 means now.
    pull_at: float = 0.0
    sync_failures: int = 0
    #: the key (public key fingerprint) of the inviter for which a certificate we issued was delivered with
    #: /peering/v1/credentials (by this process): renewals keep the key, and the inviter gets a renewed certificate
    #: in the answer to its own renewal, so only a new key needs a delivery.
    delivered: str = ""
    #: our offer as last announced with /peering/v1/notify (so a changed offer is announced once).
    notified_offer: dict | None = None
    #: monotonic time before which a failed announcement is not tried again, and the failures in a row.
    notify_at: float = 0.0
    notify_failures: int = 0
    #: the wall time (Unix seconds) of the last pull the peer answered with a valid offer; 0 before one.
    last_sync: float = 0.0
    #: fingerprints of the certificates last seen in the peer Secret, by key (CLIENT_CERT, ISSUED_CERT): a change of
    #: one is a renewal (an Event).
    seen_certs: dict = dataclasses.field(default_factory=dict)
    #: our client certificate before the last renewal, used again while the peer's entrance refuses the new one
    #: (it learns a certificate it issued through its own watch, a moment after answering); "" once it took it.
    previous_client_cert: str = ""
    #: (reason, message) of the last failed renewal of our client certificate; None once one succeeded or none is
    #: due. While the certificate is outside its validity period it is the sync's failure too.
    renew_error: tuple[str, str] | None = None
    #: The note of the Event of a renewal after an outage (our certificate had expired), until it is recorded.
    outage_note: str = ""


class Memory:
    """PeerMemory by ClusterPeer name, and the sync interval with jitter."""

    def __init__(self, sync_interval: float = 30.0, jitter: float = 0.2, clock: Clock = SYSTEM) -> None:
        self.sync_interval = sync_interval
        self.jitter = jitter
        self.clock = clock
        self._peers: dict[str, PeerMemory] = {}

    def get(self, name: str) -> PeerMemory:
        mem = self._peers.get(name)
        if mem is None:
            mem = self._peers[name] = PeerMemory()
        return mem

    def known(self, name: str) -> bool:
        return name in self._peers

    def forget(self, name: str) -> None:
        self._peers.pop(name, None)

    def next_pull(self) -> float:
        """A jittered moment for the next periodic pull, so that many peers do not pull in step."""
        spread = self.sync_interval * self.jitter
        return self.clock.monotonic() + self.sync_interval + random.uniform(-spread, spread)

    def retry_after(self, failures: int) -> float:
        """Backoff for a failed pull or join: fast at first, never slower than the sync interval."""
        return min(self.sync_interval, 0.25 * (2 ** min(failures, 10)))

    def announced(self, mem: PeerMemory, offer: dict, ok: bool) -> None:
        """Record how announcing `offer` with a notify went. It is done once the peer took it, or after about a
        sync interval of failures, when the peer's own periodic pulls (which fetch the current offer) take over;
        until then it is tried again after a backoff (`mem.notify_at`). A fresh peering's first announcement can
        arrive before the peer admits our certificate, so a failure is never taken for done at once."""
        if not ok:
            delay = self.retry_after(mem.notify_failures)
            mem.notify_failures += 1
            if delay < self.sync_interval:
                mem.notify_at = self.clock.monotonic() + delay
                return
        mem.notified_offer, mem.notify_failures, mem.notify_at = offer, 0, 0.0

    def pull_now(self, name: str) -> None:
        """Pull at once: the peer called (a notify, a delivery, a renewal), so it is there; a pull that fails now
        backs off from the shortest delay again, not from where an outage left the backoff."""
        mem = self.get(name)
        mem.pull_at, mem.sync_failures = 0.0, 0
