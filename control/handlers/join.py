"""`POST /v1/join`: the inviting side redeems a connection string (DESIGN.md §4).

Order: when the gateway says the attempt's token ID is over its limit of refused joins (`JoinCall.token_limited`),
the token checked against the cache first (`rules.invite.token_matches`, constant time, no API read: only a token
that verifies goes on, anything else is 429 TooManyAttempts); the request's shape
(`rules.join.parse_join_request`), the invite found by token ID in a fresh list (the cache may lag the
string the administrator just read), then the
decision on a fresh read (`rules.invite.redeem`: constant time, unknown and wrong tokens alike), the claimed cluster
UUID (never ours, never one another live ClusterPeer stands for: ClusterUUIDInUse, checked against the caches
first and then made atomic by claiming it, `control/uuid_claim.py`; a redemption that loses after the claim
releases it), then marking the token used and
recording the redeemer (its cluster UUID and key fingerprint) in one status write with a resourceVersion
precondition: of any number of concurrent redemptions exactly one write succeeds; the others read again and see
"used". Only then is the joiner's CSR signed and the peer Secret written. A repeated join by the same cluster with
the same key is answered again from the Secret, or, when a crash came between the two writes, the Secret is
rebuilt. A join with another key that finds the redemption without its Secret marks it abandoned: the reconciler
issues a fresh string. Refusals are
`Refusal`s the gateway answers as Status objects (and counts towards its per-address rate limit).
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Callable

from contract import reasons
from contract.names import CA_SECRET, MANAGED_BY_SELECTOR, peer_secret_name
from gateway.protocol import JoinCall
from contract.errors import Refusal
from contract.peer_secret import PeerCredentials

from control import pki, uuid_claim
from control.clusterpeer_status import write_invite
from control.kube import CLUSTERPEERS, SECRETS, Conflict, NotFound
from control.peer_secret import replace_peer_secret
from control.rules import offer as offer_rules
from control.rules import credentials as creds
from control.rules import invite as invite_rules
from control.rules import join as join_rules

if TYPE_CHECKING:
    from control.context import Context

log = logging.getLogger("peering.control.join")

#: How often a redemption reads again after losing a write race before giving up (it then sees "used").
MAX_ATTEMPTS = 5
#: How long after its status write a redemption without its Secret counts as cut short by a crash rather than still
#: under way in another replica (signing and one Secret write take well under a second).
STRANDED_AFTER = datetime.timedelta(seconds=30)
#: Read in place of an unknown token ID's ClusterPeer (a name no ClusterPeer can have: it ends with a dot).
UNKNOWN_NAME = "no-such-invite."


def _refuse(reason: str, message: str) -> Refusal:
    return Refusal(join_rules.JOIN_REFUSAL_CODES.get(reason, 403), reason, message)


def _not_ready(what: str) -> Refusal:
    return Refusal(503, reasons.NOT_READY, f"this cluster cannot accept joins yet ({what}); retry later")


def _invite_of(token_id: str, clusterpeers) -> tuple[str | None, dict | None]:
    """Of `clusterpeers`, the Invite whose current invite has this token ID, and that status.invite."""
    for cp in clusterpeers:
        if (cp.get("spec") or {}).get("type") != "Invite":
            continue
        inv = (cp.get("status") or {}).get("invite") or {}
        if inv.get("tokenID") == token_id:
            return (cp.get("metadata") or {}).get("name"), inv
    return None, None


def _first_cert(bundle: str) -> str:
    end = "-----END CERTIFICATE-----"
    head, sep, _ = bundle.partition(end)
    return head + sep + "\n" if sep else bundle


class JoinHandler:
    def __init__(self, ctx: "Context", *, on_joined: Callable[[str], None] | None = None) -> None:
        self.ctx = ctx
        self.kube = ctx.kube
        self.namespace = ctx.namespace
        self.on_joined = on_joined
        self.clusterpeers = ctx.informers.get(CLUSTERPEERS)
        self.secrets = ctx.informers.get(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR)

    async def _find(self, token_id: str) -> str | None:
        """The name of the Invite ClusterPeer whose current invite has this token ID, from a fresh list: the cache
        may not hold yet the invite whose connection string the administrator has just read from the API server,
        and a join refused TokenInvalid is final for the joiner. Every join lists, known token ID or not."""
        return _invite_of(token_id, (await self.kube.list(CLUSTERPEERS)).get("items") or [])[0]

    def _cached_invite(self, token_id: str) -> tuple[str | None, dict | None]:
        """The Invite ClusterPeer whose current invite has this token ID, and that status.invite (from the cache)."""
        return _invite_of(token_id, self.clusterpeers.items())

    def _token_verifies(self, body) -> bool:
        """Whether the body's token is an Invite's current token, from the cache (no API read): constant time, an
        unknown token ID hashed and compared like a known one (`invite.token_matches`)."""
        token = body.get("token") if isinstance(body, dict) else None
        parts = invite_rules.split_token(token) if isinstance(token, str) else None
        stored = self._cached_invite(parts[0])[1] if parts else None
        return invite_rules.token_matches(stored, token)

    async def __call__(self, call: JoinCall) -> dict:
        if call.token_limited and not self._token_verifies(call.body):
            # Guesses at a token ID that failed too often: refused before any parsing or API read. The token's
            # holder is not (its token verifies), so nobody can stall a join by guessing at its public token ID.
            log.info("join refused", extra={"remote": call.remote, "reason": reasons.TOO_MANY_ATTEMPTS})
            raise Refusal(429, reasons.TOO_MANY_ATTEMPTS, "too many refused join attempts for this connection "
                          "string's token in a minute; wait a minute and check the connection string")
        try:
            req = join_rules.parse_join_request(call.body, now=self.ctx.clock.now())
        except join_rules.JoinError as exc:
            raise _refuse(exc.reason, exc.message) from None
        own_uuid = self.ctx.cluster_uuid()
        ca_values = creds.secret_values(await self.kube.get_or_none(SECRETS, CA_SECRET, self.namespace))
        if not own_uuid or not ca_values.get("tls.crt") or not ca_values.get("tls.key"):
            raise _not_ready("no cluster UUID or peering CA yet")
        ca = pki.CertAndKey(ca_values["tls.crt"], ca_values["tls.key"])
        parts = invite_rules.split_token(req.token)
        name = await self._find(parts[0]) if parts else None
        # An unknown token ID costs the same reads as a known one, so the answer's timing does not tell them apart.
        lookup = name or UNKNOWN_NAME
        claimed: dict | None = None  # the ClusterPeer this call took the claim of the joiner's UUID for
        for _ in range(MAX_ATTEMPTS):
            cp = await self.kube.get_or_none(CLUSTERPEERS, lookup)
            secret = await self.kube.get_or_none(SECRETS, peer_secret_name(lookup), self.namespace)
            if name is None:
                cp = secret = None
            values = PeerCredentials.from_secret(secret)
            status = (cp or {}).get("status") or {}
            stored = status.get("invite") if cp else None
            redeemed_by = invite_rules.recorded_redeemer(stored) or creds.redeemer(values)
            expected = (((cp or {}).get("spec") or {}).get("invite") or {}).get("expectedClusterUUID")
            now = self.ctx.clock.now()
            decision = invite_rules.redeem(stored, req.token, req.cluster_uuid, expected, now,
                                           joiner_key_fingerprint=req.key_fingerprint, redeemed_by=redeemed_by)
            if not decision.ok:
                if decision.reason == reasons.TOKEN_USED and cp is not None and secret is None and \
                        invite_rules.stranded(stored, now, STRANDED_AFTER):
                    # A crash left the redemption before its Secret and a join with another key came: it can never
                    # complete. Mark it so the reconciler issues a fresh string, with its reason.
                    try:
                        await write_invite(self.kube, cp, invite_rules.mark_abandoned(stored, now))
                    except Conflict:
                        continue
                    decision = invite_rules.Redemption("refuse", reasons.TOKEN_USED, (
                        "the connection string was redeemed by a join with another key that never completed; the "
                        "inviting cluster issues a new connection string (Ready reason RedeemedWithAnotherKey): "
                        "join with that one"))
                if claimed is not None:
                    await self._release_lost(claimed, stored, req.cluster_uuid)
                log.info("join refused", extra={"remote": call.remote, "reason": decision.reason})
                raise _refuse(decision.reason, decision.message)
            assert cp is not None and name is not None and stored is not None
            if not isinstance(status.get("offer"), dict):
                raise _not_ready("the offer of this peering is not computed yet")
            ours = offer_rules.own_keys_problem(req.offer, status["offer"])
            if ours is not None:
                log.info("join refused", extra={"remote": call.remote, "reason": reasons.MALFORMED})
                raise _refuse(reasons.MALFORMED, ours)
            claim = join_rules.claimed_uuid_problem(req.cluster_uuid, own_uuid=own_uuid,
                                                    in_use=self._uuids_in_use(name), side="the joining cluster")
            if claim is not None:
                log.info("join refused", extra={"remote": call.remote, "reason": reasons.CLUSTER_UUID_IN_USE})
                raise _refuse(reasons.CLUSTER_UUID_IN_USE, claim)
            # The cache check above is the fast refusal; the claim is the atomic one (control/uuid_claim.py), taken
            # before anything of this redemption is stored.
            try:
                await uuid_claim.claim(self.kube, self.namespace, cp, req.cluster_uuid)
            except uuid_claim.UUIDClaimed as exc:
                log.info("join refused", extra={"remote": call.remote, "reason": reasons.CLUSTER_UUID_IN_USE})
                raise _refuse(reasons.CLUSTER_UUID_IN_USE,
                              exc.message(own_uuid=own_uuid, side="the joining cluster")) from None
            except uuid_claim.ClaimContended:
                raise _not_ready("the claim of the joining cluster's UUID keeps changing") from None
            claimed = cp
            if decision.outcome == "reanswer":
                if creds.redeemer(values) == redeemed_by and values.client_key:
                    issued = _first_cert(values.issued)
                    await self._served(name, issued)
                    return self._answer(own_uuid, name, ca, issued, pki.csr_for_key(values.client_key, own_uuid),
                                        status["offer"])
                break  # the status names this joiner but a crash lost what came after: rebuild it below
            try:
                used = invite_rules.mark_used(stored, invite_rules.Redeemer(req.cluster_uuid, req.key_fingerprint), now)
                await write_invite(self.kube, cp, used)
            except Conflict:
                continue  # someone else wrote first: read again; the token is then used (or still free)
            break
        else:
            if claimed is not None:
                await self._release_lost(claimed, stored, req.cluster_uuid)
            raise _refuse(reasons.TOKEN_USED, "the connection string is being redeemed by another join; a string is valid "
                          "for one connection, ask the inviting cluster for a new one")
        return await self._complete(req, name, own_uuid, ca, status["offer"])

    async def _complete(self, req: join_rules.JoinRequest, name: str, own_uuid: str, ca: pki.CertAndKey,
                        offer: dict) -> dict:
        """What follows the redemption's status write: sign, store the peer Secret, answer. Run again whole when a
        crash cut it short, the status write being the record of who redeemed."""
        material = pki.make_key_and_csr(own_uuid)
        now = self.ctx.clock.now()
        try:
            issued = pki.issue_client_cert(ca, req.csr_pem, req.cluster_uuid, now=now,
                                           lifetime=self.ctx.settings.control.client_lifetime)
        except pki.PKIError as exc:
            raise _refuse(reasons.INVALID_CSR, exc.message) from None
        fresh_cp = await self.kube.get(CLUSTERPEERS, name)
        values = PeerCredentials(peer_ca=req.ca_pem, client_key=material.key_pem, issued=issued,
                                 peer_uuid=req.cluster_uuid, peer_entrance=req.entrance)
        try:
            # A Secret left by an earlier, unfinished exchange of this ClusterPeer is replaced by the redemption
            # just won.
            await replace_peer_secret(self.kube, fresh_cp, self.namespace, values)
        except (Conflict, NotFound):
            raise _not_ready("the credentials could not be stored; join again") from None
        log.info("join accepted", extra={"clusterpeer": name, "peer": req.cluster_uuid})
        if self.on_joined is not None:
            self.on_joined(name)
        await self._served(name, issued)
        return self._answer(own_uuid, name, ca, issued, material.cert_pem, offer)

    async def _release_lost(self, cp: dict, stored: dict | None, cluster_uuid: str) -> None:
        """Release the claim of `cluster_uuid` this call took for `cp` once its redemption is known to have lost:
        the invite, as last read, is not redeemed by that cluster (another cluster redeemed it, or it expired or
        was reissued meanwhile). A redemption by the same cluster (another call of the same joiner) keeps it; a
        claim another ClusterPeer holds is never touched (`uuid_claim.release`)."""
        redeemer = invite_rules.recorded_redeemer(stored)
        if redeemer is not None and redeemer.cluster_uuid.lower() == cluster_uuid.lower():
            return
        await uuid_claim.release(self.kube, self.namespace, cp, cluster_uuid)

    async def _served(self, name: str, issued: str) -> None:
        """The joiner calls with the certificate the answer carries at once: answer once this replica admits it."""
        if not await self.ctx.admitted(name, issued):
            log.warning("join answered before this replica's entrance admits the certificate it carries",
                        extra={"clusterpeer": name, "waited": self.ctx.settings.control.served_wait})

    def _uuids_in_use(self, name: str) -> dict[str, str]:
        """The cluster UUIDs the other live ClusterPeers of this cluster stand for (from the caches)."""
        peers = []
        for cp in self.clusterpeers.items():
            key = (cp.get("metadata") or {}).get("name") or ""
            peers.append((key, cp, PeerCredentials.from_secret(self.secrets.get(peer_secret_name(key),
                                                                                  self.namespace))))
        return join_rules.uuids_in_use(peers, exclude=name)

    def _answer(self, own_uuid: str, name: str, ca: pki.CertAndKey, certificate: str, csr: str, offer: dict) -> dict:
        return join_rules.join_answer(cluster_uuid=own_uuid, alias=name, entrance=self.ctx.settings.entrance_host,
                                      ca_pem=ca.cert_pem, certificate_pem=certificate, csr_pem=csr, offer=offer)
