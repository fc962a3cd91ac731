"""Join: the joining side redeems the inviter's connection string with `POST /v1/join` and stores what the answer
brings (the inviter's CA, the certificate it issued for our key, the one we issue for its key).

A string naming our own cluster UUID is refused before anything is sent, an answer from an inviter claiming a live
peer's UUID is refused before anything is stored (ClusterUUIDInUse; the inviter itself refuses a joiner it already
peers with, with the same reason, which is shown as it is). The key is stored before the request leaves the
cluster, so a repeated join presents the same key and the inviter answers it again. Once the answer checks, the
inviter's UUID is claimed (`control/uuid_claim.py`) before the answer is stored: of concurrent joins of this
cluster toward one inviting cluster, whichever workers run them, one stores its answer and the others are
ClusterUUIDInUse naming it (an honest inviter refuses them first, by its own claim); after the answer, so that what
the inviter says of the string (TokenUsed, ClusterNotExpected, ...) is what the administrator reads. Each write is
resumable: a crash after the key's write joins again with it, one after the claim finds the claim its own, a crash
after the answer's
write finds the answer stored and goes on to deliver our half. A refusal the administrator must fix
(`conditions.PERMANENT_JOIN_REASONS`) releases the claim and is not retried until the spec changes (a ClusterPeer
made again under the same name is a new spec); any other failure keeps the claim and is retried with a backoff.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Callable

from contract import reasons
from contract.peer_secret import PeerCredentials
from control import pki, uuid_claim
from control.clock import Clock
from control.kube import KubeSession
from control.peerclient import PeerClient
from control.reconcilers.clusterpeer.observe import MAX_REQUEUE, Observed
from control.peer_secret import write_peer_secret
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import conditions as cond
from control.rules import join as join_rules
from control.rules import offer as offer_rules

log = logging.getLogger("peering.control.clusterpeer")


@dataclass(frozen=True)
class JoinOutcome:
    #: The peer Secret's values after this phase.
    values: PeerCredentials
    #: What the phase leaves in the memory: the refusal and its backoff, or their end and the first pull's time.
    memory: PeerMemory
    #: status.peer from the join answer, when this pass joined.
    peer: dict | None = None
    #: A spec problem found before any call (a connection string that cannot be used).
    problem: tuple[str, str] | None = None
    #: When to look again (a retry after a transient failure, or at once after the join).
    wait: float = MAX_REQUEUE
    #: A write met a concurrent one: stop this pass and run it again soon, on fresher caches.
    requeue: bool = False


class Joiner:
    def __init__(self, kube: KubeSession, client: PeerClient, memory: Memory, clock: Clock, *, namespace: str,
                 entrance_host: str, client_cert_lifetime: datetime.timedelta = pki.CLIENT_CERT_LIFETIME,
                 uuids_in_use: Callable[[str], dict[str, str]] = lambda name: {}) -> None:
        self.kube = kube
        #: The cluster UUIDs the other live ClusterPeers stand for (`rules.join.uuids_in_use`), by ClusterPeer.
        self.uuids_in_use = uuids_in_use
        self.client_cert_lifetime = client_cert_lifetime
        self.client = client
        self.memory = memory
        self.clock = clock
        self.namespace = namespace
        self.entrance_host = entrance_host

    async def join(self, obs: Observed, mem: PeerMemory) -> JoinOutcome:
        values, secret = obs.values, obs.secret
        uid = (obs.cp.get("metadata") or {}).get("uid") or ""
        owners = {ref.get("uid") for ref in ((secret or {}).get("metadata") or {}).get("ownerReferences") or ()}
        if owners and uid not in owners:
            # The Secret of an earlier ClusterPeer of this name, not yet collected: its key and answer belong to
            # that join. Start afresh (the write replaces it, or meets its deletion and runs again).
            values = PeerCredentials()
        if values.peer_ca and values.client_cert:
            # The answer arrived earlier; only our half is missing (a crash between the two writes).
            return JoinOutcome(values, mem)
        inv = obs.spec.invitation
        if obs.spec.problem is not None or inv is None:
            return JoinOutcome(values, mem, problem=obs.spec.problem)
        # The spec a refusal was seen with: the object (its uid: a ClusterPeer deleted and made again under the same
        # name is a new join, even when no pass saw it absent) and its generation.
        generation = (uid, int(obs.generation or 0))
        if mem.join_error is not None and mem.join_error[0][0] != generation[0]:
            mem = mem.learnt(join_error=None, join_failures=0, join_retry_at=0.0)
        if mem.join_error is not None and mem.join_error[0] == generation and \
                mem.join_error[1] in cond.PERMANENT_JOIN_REASONS:
            # The inviter refused for a reason only a new connection string fixes: do not knock again.
            return JoinOutcome(values, mem)
        if self.clock.monotonic() < mem.join_retry_at:
            return JoinOutcome(values, mem, wait=mem.join_retry_at - self.clock.monotonic())
        claim = join_rules.claimed_uuid_problem(inv.cluster_uuid, own_uuid=obs.own_uuid, in_use={},
                                                side="the inviting cluster")
        if claim is not None:
            # A string naming this cluster itself: nothing leaves the cluster.
            return self._failed(obs, mem, values, generation, reasons.CLUSTER_UUID_IN_USE, claim)
        if not values.client_key:
            # Keep the key before the CSR leaves the cluster, so a repeated join presents the same key.
            material = pki.make_key_and_csr(obs.own_uuid)
            keyed = PeerCredentials(client_key=material.key_pem)
            secret = await write_peer_secret(self.kube, obs.cp, self.namespace, keyed, secret)
            if secret is None:
                return JoinOutcome(values, mem, requeue=True)
            values = keyed
        csr = pki.csr_for_key(values.client_key, obs.own_uuid)
        body = join_rules.join_request(inv, cluster_uuid=obs.own_uuid, alias=obs.key, entrance=self.entrance_host,
                                       ca_pem=obs.ca.cert_pem, csr_pem=csr, offer=obs.offer)
        answer = await self.client.join(inv, body)
        if not answer.ok:
            reason, message = join_rules.join_failure(answer.status, answer.body)
            return await self._lost(obs, mem, values, generation, reason, message)
        try:
            checked = join_rules.check_join_answer(answer.body, inv, own_uuid=obs.own_uuid,
                                                   own_key_fingerprint=pki.public_key_fingerprint(csr), now=obs.now)
            ours = offer_rules.own_keys_problem(checked.offer, obs.offer)
            if ours is not None:
                raise join_rules.JoinError(join_rules.INVALID_ANSWER, ours)
            # An honest inviter refuses a join of a cluster it already peers with (ClusterUUIDInUse, shown as it
            # is); an inviter that accepted while claiming a live peer's UUID is not stored.
            claim = join_rules.claimed_uuid_problem(checked.cluster_uuid, own_uuid=obs.own_uuid,
                                                    in_use=self.uuids_in_use(obs.key), side="the inviting cluster")
            if claim is not None:
                raise join_rules.JoinError(reasons.CLUSTER_UUID_IN_USE, claim)
            issued = pki.issue_client_cert(obs.ca, checked.csr_pem, checked.cluster_uuid, now=obs.now,
                                           lifetime=self.client_cert_lifetime)
        except join_rules.JoinError as exc:
            return await self._lost(obs, mem, values, generation, exc.reason, exc.message)
        except pki.PKIError as exc:
            return await self._lost(obs, mem, values, generation, join_rules.INVALID_ANSWER,
                                f"the inviting cluster's certificate request cannot be signed: {exc.message}")
        # The claim of the inviter's UUID (control/uuid_claim.py) before anything of the answer is stored: of
        # concurrent joins of this cluster toward one inviting cluster exactly one stores its answer (an honest
        # inviter has refused the others by its own claim already). After the answer, not before the request: what
        # the inviter says of the string (TokenUsed, ClusterNotExpected, ...) is what the administrator reads.
        try:
            await uuid_claim.claim(self.kube, self.namespace, obs.cp, checked.cluster_uuid)
        except uuid_claim.UUIDClaimed as exc:
            return self._failed(obs, mem, values, generation, reasons.CLUSTER_UUID_IN_USE,
                                exc.message(own_uuid=obs.own_uuid, side="the inviting cluster"))
        except uuid_claim.ClaimContended:
            return JoinOutcome(values, mem, requeue=True)
        new_values = values.replace(peer_ca=checked.ca_pem, client_cert=checked.certificate_pem, issued=issued,
                                    peer_uuid=checked.cluster_uuid, peer_entrance=checked.entrance)
        if await write_peer_secret(self.kube, obs.cp, self.namespace, new_values, secret) is None:
            return JoinOutcome(values, mem, requeue=True)
        mem = mem.learnt(join_error=None, join_failures=0, pull_at=self.memory.next_pull(),
                         last_sync=obs.now.timestamp())
        peer = offer_rules.peer_status(checked.offer, alias=checked.alias, cluster_uuid=checked.cluster_uuid,
                                       endpoint=checked.entrance, last_sync=obs.now)
        log.info("joined", extra={"clusterpeer": obs.key, "peer": checked.cluster_uuid})
        # Right after the join our status (with the offer the inviter pulls once it has our certificate) is
        # written first; the next pass, a moment later, delivers the certificate.
        return JoinOutcome(new_values, mem, peer=peer, wait=0.05)

    async def _lost(self, obs: Observed, mem: PeerMemory, values: PeerCredentials, generation: tuple[str, int],
                    reason: str, message: str) -> JoinOutcome:
        """A failure of a join that may hold the claim of the inviter's UUID (an earlier pass took it and then
        could not store the answer): one the administrator must fix (`conditions.PERMANENT_JOIN_REASONS`) releases
        it before it is recorded, so another ClusterPeer may join that cluster; any other is retried and keeps it."""
        if reason in cond.PERMANENT_JOIN_REASONS:
            inv = obs.spec.invitation
            assert inv is not None
            await uuid_claim.release(self.kube, self.namespace, obs.cp, inv.cluster_uuid)
        return self._failed(obs, mem, values, generation, reason, message)

    def _failed(self, obs: Observed, mem: PeerMemory, values: PeerCredentials, generation: tuple[str, int], reason: str,
                message: str) -> JoinOutcome:
        failures = mem.join_failures + 1
        wait = self.memory.retry_after(failures)
        log.warning("join refused", extra={"clusterpeer": obs.key, "reason": reason})
        return JoinOutcome(values, mem.learnt(join_error=(generation, reason, message), join_failures=failures,
                                              join_retry_at=self.clock.monotonic() + wait), wait=wait)
