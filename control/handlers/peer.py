"""The peer operations on `/peering/v1/` (mTLS; the gateway already mapped the client certificate to a live peer):

- `offer` (GET): our offer for this peer (status.offer) and our name for the peering;
- `notify` (POST): the peer's offer changed; pull it now;
- `credentials` (POST): the joiner delivers the certificate its CA issued for our key (idempotent);
- `certificate` (POST): the peer renews its client certificate with a CSR for the same key.

Each reads the informers' caches, not the API: a peer may call as often as the gateway's bound per peer lets it
(gateway/peercalls.py), and the module shares its API budget with its own control loop. An answer that changes
nothing (an offer, a renewal answered again, a delivery made before) costs the API server nothing; a write carries
the cached resourceVersion and is read again from the API only when it meets a newer one. The offer stays as
fresh as a read of the API was: the reconciler notifies the peer right after it writes a new offer, and until this
process's watch has delivered that write the status it wrote (`Context.written_status`) is served instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from contract import reasons
from contract.names import CA_SECRET, MANAGED_BY_SELECTOR, peer_secret_name
from gateway.protocol import PeerCall
from contract.errors import Refusal
from contract.peer_secret import PeerCredentials

from control import pki
from control.kube import CLUSTERPEERS, SECRETS
from control.peer_secret import PeeringGone, update_peer_secret
from control.rules import credentials as creds
from control.rules import join as join_rules

if TYPE_CHECKING:
    from control.context import Context

log = logging.getLogger("peering.control.peer")


#: Certificates issued to one peer that stay known at once: the newest and the two before it. With renewal at half
#: of the lifetime two are valid at a time; the third covers a renewal answered but lost. One that has expired stays
#: until renewals push it out: it admits nothing but the renewal (gateway/admission.py), so a peer whose renewal
#: answer was lost after an outage can ask again with the certificate it still holds.
KEEP_ISSUED = 3


def _bad(exc: join_rules.JoinError) -> Refusal:
    return Refusal(400, exc.reason, exc.message)


def _certs(bundle: str) -> list[str]:
    end = "-----END CERTIFICATE-----"
    return [part.strip() + "\n" + end + "\n" for part in bundle.split(end) if "BEGIN CERTIFICATE" in part]


class PeerHandlers:
    def __init__(self, ctx: "Context", *, pull_now: Callable[[str], None]) -> None:
        self.ctx = ctx
        self.kube = ctx.kube
        self.namespace = ctx.namespace
        self.pull_now = pull_now
        self.clusterpeers = ctx.informers.get(CLUSTERPEERS)
        self.secrets = ctx.informers.get(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR)

    def register(self) -> None:
        h = self.ctx.handlers
        h.add_peer_op("offer", self.offer)
        h.add_peer_op("notify", self.notify)
        h.add_peer_op("credentials", self.credentials)
        h.add_peer_op("certificate", self.certificate)

    async def offer(self, call: PeerCall) -> dict:
        offer = self.ctx.current_status(self.clusterpeers.get(call.peer.name)).get("offer")
        if not isinstance(offer, dict):
            raise Refusal(503, reasons.NOT_READY, "the offer of this peering is not computed yet; retry later")
        return join_rules.offer_message(call.peer.name, offer)

    async def notify(self, call: PeerCall) -> dict:
        self.pull_now(call.peer.name)
        return {}

    async def _update_secret(self, name: str, change: Callable[[PeerCredentials], PeerCredentials | None]
                             ) -> PeerCredentials:
        """Apply `change` to the peer Secret's values, from the cache first, and write it with the resourceVersion
        read (`update_peer_secret`)."""
        def cached() -> tuple[dict | None, dict | None]:
            return self.clusterpeers.get(name), self.secrets.get(peer_secret_name(name), self.namespace)
        try:
            values = await update_peer_secret(self.kube, self.namespace, name, change, cached=cached)
        except PeeringGone:
            raise Refusal(403, reasons.PEER_UNKNOWN, "this peering no longer exists here") from None
        if values is None:
            raise Refusal(409, reasons.CONFLICT, "the credentials changed meanwhile; retry")
        return values

    async def credentials(self, call: PeerCall) -> dict:
        own_uuid = self.ctx.cluster_uuid()

        def change(values: PeerCredentials) -> PeerCredentials | None:
            if not values.client_key or not values.peer_ca:
                raise Refusal(409, reasons.NOT_JOINED, "this side holds no key for the peering yet")
            key_fp = pki.public_key_fingerprint(pki.csr_for_key(values.client_key, own_uuid))
            try:
                cert = join_rules.check_credentials(call.body, own_key_fingerprint=key_fp, own_uuid=own_uuid,
                                                    peer_ca_pem=values.peer_ca, now=self.ctx.clock.now(),
                                                    expired_ok=True)
            except join_rules.JoinError as exc:
                raise _bad(exc) from None
            if values.client_cert == cert or _outlasts(values.client_cert, cert):
                return None  # delivered before (idempotent), or renewed since: a delivery never takes one back
            return values.replace(client_cert=cert)

        await self._update_secret(call.peer.name, change)
        self.pull_now(call.peer.name)
        log.info("credentials received", extra={"clusterpeer": call.peer.name})
        return {}

    async def certificate(self, call: PeerCall) -> dict:
        try:
            csr = join_rules.parse_certificate_request(call.body)
        except join_rules.JoinError as exc:
            raise _bad(exc) from None
        ca = creds.cluster_ca(self.secrets.get(CA_SECRET, self.namespace))
        if ca is None:
            raise Refusal(503, reasons.NOT_READY, "the peering CA is not available; retry later")
        now = self.ctx.clock.now()
        issued: list[str] = []
        fresh: list[bool] = []

        def change(values: PeerCredentials) -> PeerCredentials | None:
            current = _certs(values.issued)
            if not current or pki.public_key_fingerprint(current[0]) != pki.public_key_fingerprint(csr):
                raise Refusal(403, reasons.KEY_MISMATCH, "a renewal must keep the key of the current certificate")
            if not pki.needs_renewal(current[0], now):
                # Issued within its first half already (a retry, or the peer has not stored our last answer yet):
                # answer it again rather than issue one more, so retries cannot push a certificate out.
                issued[:], fresh[:] = [current[0]], [False]
                return None
            cert = pki.issue_client_cert(ca, csr, values.peer_uuid or call.peer.uuid, now=now,
                                         lifetime=self.ctx.settings.control.client_lifetime)
            issued[:], fresh[:] = [cert], [True]
            # The earlier certificates stay known (at most KEEP_ISSUED in all), so the one the peer holds keeps
            # working while it stores the new one, and its open connections too, until each expires; an expired
            # one keeps only the right to ask for this renewal again.
            return values.replace(issued="".join([cert, *current[:KEEP_ISSUED - 1]]))

        await self._update_secret(call.peer.name, change)
        log.info("client certificate renewed for peer" if fresh[0] else "client certificate answered again (renewed "
                 "recently)", extra={"clusterpeer": call.peer.name})
        # The peer reaches us: after an outage it is back, so our own calls toward it (our renewal, our pull) are
        # tried now rather than after the backoff they reached meanwhile.
        self.pull_now(call.peer.name)
        # The peer calls with it at once: answer once this replica admits it (it keeps its previous one for the
        # replicas that have not caught up).
        await self.ctx.admitted(call.peer.name, issued[0])
        return join_rules.certificate_answer(issued[0])


def _outlasts(stored: str, delivered: str) -> bool:
    """Whether the client certificate stored already expires after the delivered one (the peer's renewal answer
    came before a delivery that read its Secret earlier, or a joiner delivers again after its restart)."""
    try:
        return bool(stored) and pki.not_after(stored) > pki.not_after(delivered)
    except pki.PKIError:
        return False
