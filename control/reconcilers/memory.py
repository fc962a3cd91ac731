"""What the ClusterPeer reconciler observed over the network and keeps between passes (not in the API): the last
join refusal, the last offer sync's failure, when to pull the peer's offer next, whether our credentials reached
the inviter. Losing it on a restart is harmless: every fact is observed again on the next pass.

A pass reads it once (`Memory.recall`), each phase gets that value and hands back what it learnt in its outcome
(`JoinOutcome.memory`, `SyncOutcome.memory`, `Announced.memory`), and the reconciler writes the last one back
(`Memory.keep`), the one writer. A request handler only asks for a pull now (`Memory.pull_now`): the next pass
recalls the memory with its pull due, however a pass in flight meanwhile ends."""

from __future__ import annotations

import dataclasses
import random

from control.clock import SYSTEM, Clock


@dataclasses.dataclass(frozen=True)
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
    #: The note of the Event of a renewal after an outage (our certificate had expired), until it is recorded
    #: (the pass that renewed may end before its Events, a status write meeting a newer object).
    outage_note: str = ""
    #: Our client certificate as a pass of this process last found it expired (the peer away longer than it
    #: lasted), and whether the note of the renewal after that outage was made: one Event per outage, however many
    #: passes (or caches behind a write) see the expired certificate.
    outage_cert: str = ""
    outage_noted: bool = False

    def learnt(self, **changes) -> "PeerMemory":
        """This memory with what a phase learnt."""
        return dataclasses.replace(self, **changes)


class Memory:
    """PeerMemory by ClusterPeer name, and the sync interval with jitter."""

    def __init__(self, sync_interval: float = 30.0, jitter: float = 0.2, clock: Clock = SYSTEM) -> None:
        self.sync_interval = sync_interval
        self.jitter = jitter
        self.clock = clock
        self._peers: dict[str, PeerMemory] = {}
        self._pull_now: set[str] = set()

    def get(self, name: str) -> PeerMemory:
        """What is kept of `name` (an empty memory for a peering not seen yet)."""
        return self._peers.get(name) or PeerMemory()

    def recall(self, name: str) -> PeerMemory:
        """The memory a pass of `name` starts from: what is kept, with a pull due at once when a handler asked
        for one since the last recall."""
        mem = self.get(name)
        if name in self._pull_now:
            self._pull_now.discard(name)
            mem = mem.learnt(pull_at=0.0, sync_failures=0)
        return mem

    def keep(self, name: str, mem: PeerMemory) -> None:
        """Keep what a pass of `name` learnt (the reconciler, once per pass)."""
        self._peers[name] = mem

    def known(self, name: str) -> bool:
        return name in self._peers

    def forget(self, name: str) -> None:
        self._peers.pop(name, None)
        self._pull_now.discard(name)

    def next_pull(self) -> float:
        """A jittered moment for the next periodic pull, so that many peers do not pull in step."""
        spread = self.sync_interval * self.jitter
        return self.clock.monotonic() + self.sync_interval + random.uniform(-spread, spread)

    def retry_after(self, failures: int) -> float:
        """Backoff for a failed pull or join: fast at first, never slower than the sync interval."""
        return min(self.sync_interval, 0.25 * (2 ** min(failures, 10)))

    def announced(self, mem: PeerMemory, offer: dict, ok: bool) -> PeerMemory:
        """`mem` with how announcing `offer` with a notify went. It is done once the peer took it, or after about a
        sync interval of failures, when the peer's own periodic pulls (which fetch the current offer) take over;
        until then it is tried again after a backoff (`notify_at`). A fresh peering's first announcement can arrive
        before the peer admits our certificate, so a failure is never taken for done at once."""
        if not ok:
            delay = self.retry_after(mem.notify_failures)
            if delay < self.sync_interval:
                return mem.learnt(notify_failures=mem.notify_failures + 1, notify_at=self.clock.monotonic() + delay)
        return mem.learnt(notified_offer=offer, notify_failures=0, notify_at=0.0)

    def pull_now(self, name: str) -> None:
        """Pull at once: the peer called (a notify, a delivery, a renewal), so it is there; a pull that fails now
        backs off from the shortest delay again, not from where an outage left the backoff. Taken by the next
        `recall` (the caller queues the ClusterPeer)."""
        self._pull_now.add(name)
