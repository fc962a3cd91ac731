"""Sync: what an established peering does with the peer's entrance, over mTLS with the exchanged credentials.

- renew our client certificate once it is due (`/peering/v1/certificate`, a CSR for the same key), also once it
  has expired while the peer was away: the peer's entrance accepts it for the renewal alone, and until the renewal
  succeeds nothing else is tried (its failure is the sync's: rules/renewal.py says what it means);
- a joiner delivers the certificate it issued for the inviter's key (`/peering/v1/credentials`) until it arrives
  (once per key: the inviter's renewals of it come back in the answers of `/peering/v1/certificate`);
- pull the peer's offer when due (periodic with jitter, at once after a notify, with a backoff after a failure);
- after the status is written, announce a changed offer of ours (`/peering/v1/notify`).

A failure never takes anything away: the previous status.peer stays, and the failure is remembered
(`PeerMemory.sync_error`, in the outcome's memory) for Ready until a pull succeeds. status.peer.lastSyncTime moves
only when a pull learnt something (`rules.offer.same_peer`), so a steady state writes nothing.

Each step takes the memory the pass recalled and returns it with what it learnt (`PeerMemory.learnt`); nothing
here writes the shared `Memory`: the reconciler keeps the outcome's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from contract.peer_secret import PeerCredentials
from control import pki
from control.clock import Clock
from control.connstring import format_time
from control.kube import KubeSession
from control.peerclient import Answer, PeerClient
from control.reconcilers.clusterpeer.observe import Observed
from control.peer_secret import PeeringGone, update_peer_secret
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import conditions as cond
from control.rules import join as join_rules
from control.rules import offer as offer_rules
from control.rules import renewal
from control.rules.spec import JOIN

log = logging.getLogger("peering.control.clusterpeer")


@dataclass(frozen=True)
class SyncOutcome:
    #: The peer Secret's values after this phase (a renewed client certificate).
    values: PeerCredentials
    #: status.peer: the fresh one after a pull that learnt something, else the previous one.
    peer: dict | None
    #: The last failure toward the peer, (reason, message), or None after a successful pull.
    error: tuple[str, str] | None
    #: A joiner's certificate for the inviter's key has not reached the inviter yet.
    undelivered: bool
    #: When the next pull is due.
    wait: float
    #: What the phase leaves in the memory (the pull's time and failures, a delivery, a renewal and its failure).
    memory: PeerMemory


@dataclass(frozen=True)
class Renewal:
    """What `_renew` did: the values after it, its failure (None once renewed or when none is due), and the
    certificate to fall back on while the peer learns the new one."""
    values: PeerCredentials
    error: tuple[str, str] | None
    previous: str


@dataclass(frozen=True)
class Announced:
    #: When to try the announcement again while it is still due, else None.
    wait: float | None
    memory: PeerMemory


def _issue_times(*pems: str) -> list:
    """When each certificate (the first of each bundle) was issued; none for what cannot be read."""
    out = []
    for pem in pems:
        try:
            out.append(pki.issued_at(pem))
        except pki.PKIError:
            continue
    return out


def _key_of(cert_pem: str) -> str:
    """The fingerprint of a certificate's public key (the newest of a bundle); "" without a readable one."""
    try:
        return pki.public_key_fingerprint(cert_pem) if cert_pem else ""
    except pki.PKIError:
        return ""


def _tls(answer: Answer) -> dict:
    return dict(refused_certificate=answer.refused_certificate, tls_alert=answer.tls_alert,
                untrusted_server=answer.untrusted_server)


def failure(answer: Answer) -> tuple[str, str]:
    return renewal.call_failure(answer.status, answer.body, **_tls(answer))


def _in_force(cert_pem: str, now) -> bool:
    try:
        return pki.valid_at(cert_pem, now)
    except pki.PKIError:
        return False


def _renew_in(cert_pem: str, now) -> float:
    """Seconds until the certificate is due for renewal (0 when it is, or cannot be read)."""
    try:
        return max(0.0, (pki.renewal_time(cert_pem) - now).total_seconds())
    except pki.PKIError:
        return 0.0


def _expiry(cert_pem: str) -> str:
    try:
        return format_time(pki.not_after(cert_pem))
    except pki.PKIError:
        return "an unknown time (the certificate cannot be read)"


def _expired_at(cert_pem: str, now):
    """When the certificate expired, if it has; None while it is valid or not yet, or cannot be read."""
    try:
        end = pki.not_after(cert_pem)
    except pki.PKIError:
        return None
    return end if end < now else None


def _outage(obs: Observed, mem: PeerMemory, held: PeerCredentials, client_cert: str) -> PeerMemory:
    """`mem` with the outage this pass saw: our client certificate as the pass found it (`held`) had expired (the
    peer was away longer than it lasted), and `client_cert` is what the Secret holds after the renewal. The note of
    its one Event is made once a certificate in force replaced the expired one, whoever stored it: our renewal, or
    the peer's delivery of the very certificate it answered that renewal with (a joiner back from a restart
    delivers what it issued last), which may reach our handlers before this pass stores the answer."""
    if _expired_at(held.client_cert, obs.now) is not None and held.client_cert != mem.outage_cert:
        mem = mem.learnt(outage_cert=held.client_cert, outage_noted=False)
    expired = mem.outage_cert
    if not expired or mem.outage_noted or client_cert == expired or not _in_force(client_cert, obs.now):
        return mem
    # Before the pull of this pass moves it: the last successful sync is when the outage began.
    contact = renewal.last_contact(mem.last_sync, obs.status, _issue_times(expired, held.issued))
    note = renewal.outage_note(contact, obs.now, pki.not_after(expired), pki.not_after(client_cert))
    return mem.learnt(outage_noted=True, outage_note=note)


class Syncer:
    def __init__(self, kube: KubeSession, client: PeerClient, memory: Memory, clock: Clock, *,
                 namespace: str, admits: Callable[[str, str], bool] = lambda clusterpeer, cert_pem: True,
                 entrance_serves: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.kube = kube
        self.client = client
        self.memory = memory
        self.clock = clock
        self.namespace = namespace
        #: Whether this replica's entrance admits a certificate (PEM) as the ClusterPeer's peer now: a joiner
        #: delivers the certificate it issued only then, since the inviter calls with it at once
        #: (rules/served.py); the registry publish that admits it queues the ClusterPeer again.
        self.admits = admits
        #: Waits (bounded) until this replica's gateway serves: a renewal after an outage makes the peer pull from
        #: us at once, which needs our entrance up (Context.entrance_serves).
        self.entrance_serves = entrance_serves

    async def sync(self, obs: Observed, mem: PeerMemory, values: PeerCredentials, peer: dict | None, *,
                   just_joined: bool) -> SyncOutcome:
        held = values
        renewed = await self._renew(obs, mem, values)
        values = renewed.values
        mem = _outage(obs, mem.learnt(renew_error=renewed.error, previous_client_cert=renewed.previous), held,
                      values.client_cert)
        undelivered = self._undelivered(obs, mem, values)
        if mem.renew_error is not None and not _in_force(values.client_cert, obs.now):
            # Our certificate admits nothing but its renewal at the peer: the renewal's failure is the sync's, and
            # it is tried again with the backoff of a failed pull.
            reason, message = mem.renew_error
            if reason == cond.PEER_UNREACHABLE:
                message = renewal.expired_meanwhile(message, _expiry(values.client_cert))
            mem = self._pull_failed(mem, (reason, message))
            return SyncOutcome(values=values, peer=peer, error=mem.sync_error, undelivered=undelivered,
                               wait=max(0.05, mem.pull_at - self.clock.monotonic()), memory=mem)
        if undelivered and not just_joined and self.admits(obs.key, values.issued):
            mem = await self._deliver(obs, mem, values)
        if mem.pull_at <= self.clock.monotonic() or peer is None:
            peer, mem = await self._pull(obs, mem, values, peer)
        wait = mem.pull_at - self.clock.monotonic()
        renew_in = _renew_in(values.client_cert, obs.now)
        if renew_in > 0:
            wait = min(wait, renew_in)  # renewed at half of its lifetime, whatever the sync interval
        return SyncOutcome(values=values, peer=peer, error=mem.sync_error,
                           undelivered=self._undelivered(obs, mem, values), wait=max(0.05, wait), memory=mem)

    @staticmethod
    def _undelivered(obs: Observed, mem: PeerMemory, values: PeerCredentials) -> bool:
        """A joiner has not delivered the certificate it issued for the inviter's key. By that key: the inviter
        renews it over /peering/v1/certificate for the same key, whose answer it gets at once, so a renewal (which
        changes issued.crt) leaves nothing to deliver."""
        return obs.spec.type == JOIN and mem.delivered != _key_of(values.issued)

    async def announce(self, obs: Observed, mem: PeerMemory, values: PeerCredentials) -> Announced:
        """Tell the peer our offer changed, once the status holding it is written; says when to try again while
        the announcement is still due."""
        if obs.offer == mem.notified_offer:
            return Announced(None, mem)
        if self.clock.monotonic() >= mem.notify_at:
            answer, previous = await self._call(mem, values, "notify", body={})
            mem = self.memory.announced(mem.learnt(previous_client_cert=previous), obs.offer, answer.ok)
        if obs.offer != mem.notified_offer:
            return Announced(max(0.05, mem.notify_at - self.clock.monotonic()), mem)
        return Announced(None, mem)

    async def _call(self, mem: PeerMemory, values: PeerCredentials, op: str, body: dict | None = None
                    ) -> tuple[Answer, str]:
        """The answer, and the certificate to fall back on after it (`PeerMemory.previous_client_cert`)."""
        answer = await self._call_with(values, values.client_cert, op, body)
        previous = mem.previous_client_cert
        if not previous:
            return answer, previous
        if failure(answer)[0] == cond.PEER_REFUSED_CERTIFICATE and pki.valid_at(previous, self.clock.now()):
            # Just renewed, and the peer's entrance (or one of its replicas) has not learnt the certificate it
            # issued yet: the one before stays accepted there until it expires, so use it meanwhile.
            return await self._call_with(values, previous, op, body), previous
        if answer.status is not None:
            return answer, ""  # the entrance answered the new certificate: it knows it
        return answer, previous

    async def _call_with(self, values: PeerCredentials, cert: str, op: str, body: dict | None) -> Answer:
        return await self.client.call(values.peer_entrance, op, body=body, peer_ca_pem=values.peer_ca,
                                      client_cert_pem=cert, client_key_pem=values.client_key)

    async def _deliver(self, obs: Observed, mem: PeerMemory, values: PeerCredentials) -> PeerMemory:
        # The newest certificate only: issued.crt keeps the last ones issued, but one is delivered.
        answer, previous = await self._call(mem, values, "credentials",
                                            join_rules.credentials_message(pki.newest(values.issued)))
        mem = mem.learnt(previous_client_cert=previous)
        if answer.ok:
            return mem.learnt(delivered=_key_of(values.issued), pull_at=0.0)
        log.info("credentials not delivered yet", extra={"clusterpeer": obs.key, "status": answer.status})
        return mem.learnt(sync_error=failure(answer))

    async def _renew(self, obs: Observed, mem: PeerMemory, values: PeerCredentials) -> Renewal:
        """Renew our client certificate once it is due, or at once once it expired (the peer was away longer than
        it lasted); keep the old one on any failure, and say why."""
        held = values.client_cert
        if not pki.needs_renewal(held, obs.now):
            return Renewal(values, None, mem.previous_client_cert)
        csr = pki.csr_for_key(values.client_key, obs.own_uuid)
        if self.entrance_serves is not None and not _in_force(held, obs.now):
            # Back from an outage: the peer answers the renewal with a pull from us at once; our entrance first.
            await self.entrance_serves()
        answer, previous = await self._call(mem, values, "certificate", join_rules.certificate_request(csr))
        if not answer.ok:
            error = renewal.renewal_failure(obs.key, answer.status, answer.body, **_tls(answer))
            log.warning("client certificate renewal failed", extra={"clusterpeer": obs.key, "status": answer.status,
                                                                     "reason": error[0]})
            return Renewal(values, error, previous)
        try:
            cert = join_rules.check_credentials(answer.body, own_key_fingerprint=pki.public_key_fingerprint(csr),
                                                own_uuid=obs.own_uuid, peer_ca_pem=values.peer_ca, now=obs.now)
        except join_rules.JoinError as exc:
            log.warning("renewed certificate refused", extra={"clusterpeer": obs.key, "error": exc.message})
            return Renewal(values, (cond.PEER_UNREACHABLE, f"the peer answered the renewal of our client "
                                    f"certificate with one this peering cannot use ({exc.message}); retried"),
                           previous)

        before: list[str] = []

        def change(stored: PeerCredentials) -> PeerCredentials | None:
            # Written over what the Secret holds now, not over this pass's copy: the peer handlers write the same
            # Secret (the certificate we issue to the peer), and a renewal lost to that race would be asked for
            # again and again with a certificate the peer stops accepting.
            if stored.client_key != values.client_key:
                return None
            current = stored.client_cert
            before[:] = [current]
            if current and not pki.needs_renewal(current, obs.now) and pki.not_after(current) >= pki.not_after(cert):
                return None
            return stored.replace(client_cert=cert)

        try:
            written = await update_peer_secret(self.kube, self.namespace, obs.key, change)
        except PeeringGone:
            return Renewal(values, mem.renew_error, previous)
        if written is None or written.client_cert != cert:
            return Renewal(values if written is None else written, mem.renew_error, previous)
        if before == [cert]:
            # An earlier pass stored it already (this one read a cache behind that write, and the peer answered
            # the same certificate again): nothing was renewed now.
            return Renewal(written, None, previous)
        log.info("client certificate renewed", extra={"clusterpeer": obs.key,
                                                      "after_outage": _expired_at(held, obs.now) is not None})
        return Renewal(written, None, held)

    def _pull_failed(self, mem: PeerMemory, error: tuple[str, str]) -> PeerMemory:
        """`mem` after a failed pull (or a renewal failing in its stead): the failure, and the backoff's next try."""
        failures = mem.sync_failures + 1
        return mem.learnt(sync_error=error, sync_failures=failures,
                          pull_at=self.clock.monotonic() + self.memory.retry_after(failures))

    async def _pull(self, obs: Observed, mem: PeerMemory, values: PeerCredentials, peer: dict | None
                    ) -> tuple[dict | None, PeerMemory]:
        """Fetch the peer's offer; the previous status.peer stays on any failure (a failed sync never revokes)."""
        answer, previous = await self._call(mem, values, "offer")
        mem = mem.learnt(previous_client_cert=previous)
        if not answer.ok:
            return peer, self._pull_failed(mem, failure(answer))
        mem = mem.learnt(pull_at=self.memory.next_pull())
        try:
            alias, offer = join_rules.parse_offer_message(answer.body)
        except join_rules.JoinError as exc:
            return peer, mem.learnt(sync_error=(exc.reason, exc.message))
        check = offer_rules.validate_offer(offer)
        if not check.ok:
            return peer, mem.learnt(sync_error=(check.reason, check.message))
        ours = offer_rules.own_keys_problem(offer, obs.offer)
        if ours is not None:
            return peer, mem.learnt(sync_error=(offer_rules.OFFER_INVALID, ours))
        failed_before = mem.sync_error is not None
        mem = mem.learnt(sync_error=None, sync_failures=0, last_sync=obs.now.timestamp())
        fresh = offer_rules.peer_status(offer, alias=alias, cluster_uuid=values.peer_uuid,
                                        endpoint=values.peer_entrance, last_sync=obs.now)
        if not failed_before and offer_rules.same_peer(peer, fresh):
            return peer, mem
        return fresh, mem
