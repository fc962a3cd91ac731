"""The ClusterPeer reconciler: one level-based pass per ClusterPeer that brings the peering to what its spec and
the peer's offer ask for, and computes the whole status in one place (`desired_status`) from what it observed.

A pass, in order:
1. Read the caches: the ClusterPeer, its `peer-<name>` Secret, the CA, capabilities, projects, namespaces.
2. The invitation (Invite) or the join (Join) while the credentials exchange is not complete.
3. Once complete: deliver our certificate to the inviter if not yet done (Join), renew our client certificate when
   due, pull the peer's offer when due (periodic with jitter, or at once after a notify).
4. Keep the peer's TokenExchangeProvider as the offer says.
5. Compute status (phase, Ready and the other conditions, offer, peer, access, grants...) and write it only if it
   differs; tell the peer when our offer changed.
The grants and ProjectPeers that follow from the status are written by `reconcilers.grants`.

Nothing is written when nothing changed, so a steady state makes no API writes. Failures of the peer never revoke:
they set Ready False with a reason and leave grants, provider and pairs as they are.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import TYPE_CHECKING, Iterable

from contract import reasons
from contract.names import (CA_SECRET, ENTRANCE_TLS_SECRET, JOIN_TLS_SECRET, MANAGED_BY_SELECTOR, peer_secret_name,
                            provider_name)
from control import connstring, pki
from control.kube import (CLUSTERPEERS, NAMESPACES, PEERINGCAPABILITIES, SECRETS, AlreadyExists, ApiError,
                          Conflict, KubeSession, NotFound)
from control.optional import PROJECTS, TOKENEXCHANGEPROVIDERS
from control.peerclient import Answer, PeerClient
from control.facts import ISSUER_TTL, Discovery, Issuer
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import conditions as cond
from control.rules import credentials as creds
from control.rules import grants as grants_rules
from control.rules import invite as invite_rules
from control.rules import join as join_rules
from control.rules import offer as offer_rules
from control.rules import ownership, projects as project_rules
from control.rules import provider as provider_rules
from control.rules.access import desired_access
from control.rules.capabilities import LocalCapability, local_capability
from control.rules.effective import effective_capabilities, offered_capabilities
from control.selfcheck import SelfCheck, conditions_of
from control.workqueue import Result, Watch, key_of

if TYPE_CHECKING:
    from control.context import Context

log = logging.getLogger("peering.control.clusterpeer")

NAME = "clusterpeer"
#: The longest a healthy peering waits between passes (self-check, renewal, invite expiry are all re-checked).
MAX_REQUEUE = 300.0
CREDENTIALS_UNDELIVERED = "CredentialsPending"



def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def owner_names(obj: dict) -> list[str]:
    """Names of the ClusterPeers owning `obj` (ownerReferences of kind ClusterPeer)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r["name"] for r in refs if isinstance(r, dict) and r.get("kind") == "ClusterPeer" and r.get("name")]


def made_with_other_ca(status: dict, ca_pem: str) -> bool:
    """Whether the status of a ClusterPeer shows it was established with a peering CA other than `ca_pem`."""
    old = (status.get("access") or {}).get("caBundle") if isinstance(status.get("access"), dict) else None
    if not isinstance(old, str) or not old.strip():
        return False
    try:
        return pki.fingerprint(old) != pki.fingerprint(ca_pem)
    except pki.PKIError:
        return True


def sync_failure(answer: Answer) -> tuple[str, str]:
    """(reason, message) of a failed offer pull; a refused client certificate says the peer probably revoked us."""
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.refused_certificate or (answer.status in (401, 403) and body.get("reason") == reasons.PEER_UNKNOWN):
        return cond.PEER_REFUSED_CERTIFICATE, ""
    if answer.status is None:
        return cond.PEER_UNREACHABLE, (f"the peer's entrance did not answer ({answer.body}); the peering stays "
                                       "and the sync is retried. Check that peering-gateway.<domain> of the peer is "
                                       "reachable from here")
    detail = body.get("message") if isinstance(body.get("message"), str) else ""
    return cond.PEER_UNREACHABLE, (f"the peer's entrance answered HTTP {answer.status}"
                                   + (f" ({body.get('reason')}: {detail[:300]})" if detail else "")
                                   + "; the peering stays and the sync is retried")


def desired_status(*, cp: dict, now: datetime.datetime, state: cond.PeeringState, invite: dict | None,
                   offer: dict, peer: dict | None, effective: list[str], grants: list[dict], access: dict | None,
                   paired: int, token_exchange: cond.Cond | None, selfcheck: tuple[cond.Cond, cond.Cond] | None
                   ) -> dict:
    """The whole status of a ClusterPeer from what the pass observed (pure). Unchanged conditions keep their
    lastTransitionTime, so an unchanged world yields a status equal to the stored one and no write."""
    current = cp.get("status") or {}
    generation = (cp.get("metadata") or {}).get("generation")
    ready = cond.readiness(state, now)
    conditions = list(current.get("conditions") or [])
    conditions = cond.set_condition(conditions, cond.READY, ready.ready, generation=generation, now=now)
    if token_exchange is not None:
        conditions = cond.set_condition(conditions, cond.TOKEN_EXCHANGE_READY, token_exchange,
                                        generation=generation, now=now)
    else:
        conditions = [c for c in conditions if c.get("type") != cond.TOKEN_EXCHANGE_READY]
    if selfcheck is not None:
        conditions = cond.set_condition(conditions, cond.CLIENT_CERT_ENFORCED, selfcheck[0], generation=generation,
                                        now=now)
        conditions = cond.set_condition(conditions, cond.SERVER_CERT_OURS, selfcheck[1], generation=generation,
                                        now=now)
    status: dict = {"phase": ready.phase, "conditions": conditions, "offer": offer,
                    "effectiveCapabilities": effective, "grants": grants, "pairedProjectsCount": paired}
    if generation is not None:
        status["observedGeneration"] = generation
    if invite is not None:
        status["invite"] = invite
    if peer is not None:
        status["peer"] = peer
    if access is not None:
        status["access"] = access
    return status


class ClusterPeerReconciler:
    name = NAME

    def __init__(self, ctx: "Context", *, client: PeerClient, memory: Memory, selfcheck: SelfCheck | None,
                 peering_version: str, discovery: Discovery | None = None) -> None:
        self.ctx = ctx
        self.kube: KubeSession = ctx.kube
        self.namespace = ctx.namespace
        self.settings = ctx.settings
        self.client = client
        self.memory = memory
        self.selfcheck = selfcheck
        self.peering_version = peering_version
        self.discovery = discovery or ctx.discovery
        self.issuer = Issuer(ctx.kube, ttl=getattr(ctx.settings.control, "issuer_refresh_interval", ISSUER_TTL),
                             clock=ctx.clock)
        inf = ctx.informers
        self.clusterpeers = inf.get(CLUSTERPEERS)
        self.secrets = inf.get(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR)
        self.capabilities = inf.get(PEERINGCAPABILITIES)
        self.providers = inf.get(TOKENEXCHANGEPROVIDERS)
        self.namespaces = inf.get(NAMESPACES)
        self.projects = inf.get(PROJECTS)
        join_tls = f"metadata.name={JOIN_TLS_SECRET}"
        self.join_tls = inf.get(SECRETS, namespace=self.namespace, field_selector=join_tls)
        every = self._every_key
        self.watches = (
            Watch(CLUSTERPEERS),
            Watch(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR, keys=self._secret_keys),
            Watch(PEERINGCAPABILITIES, keys=every),
            Watch(TOKENEXCHANGEPROVIDERS, keys=self._provider_keys),
            Watch(NAMESPACES, keys=every),
            Watch(PROJECTS, keys=every),
            # Only read when a string is issued; watched so that the cache is synced before the first one.
            Watch(SECRETS, namespace=self.namespace, field_selector=join_tls, keys=lambda e, o: ()),
        )

    async def close(self) -> None:
        await self.client.close()

    # -- event to key mapping ----------------------------------------------------------------------------------

    def _every_key(self, event: str, obj: dict) -> Iterable[str]:
        return [key_of(cp) for cp in self.clusterpeers.items()]

    def _secret_keys(self, event: str, obj: dict) -> Iterable[str]:
        name = (obj.get("metadata") or {}).get("name", "")
        if name in (CA_SECRET, ENTRANCE_TLS_SECRET):
            if self.selfcheck is not None:
                self.selfcheck.invalidate()
            return self._every_key(event, obj)
        return owner_names(obj)

    def _provider_keys(self, event: str, obj: dict) -> Iterable[str]:
        name = (obj.get("metadata") or {}).get("name", "")
        keys = set(owner_names(obj))
        for cp in self.clusterpeers.items():
            if provider_name(key_of(cp)) == name:
                keys.add(key_of(cp))
        return keys

    # -- reading -----------------------------------------------------------------------------------------------

    def _local_capabilities(self) -> dict[str, LocalCapability]:
        return {c.name: c for c in (local_capability(o, self.discovery.namespaced) for o in self.capabilities.items())
                if c.name}

    def _local_projects(self) -> dict[str, list[str]]:
        return project_rules.local_projects(self.projects.items(), self.namespaces.items())

    def _projects_absent(self) -> str | None:
        """Why projects cannot pair here: the Project API is not served (None while it is, or is not known)."""
        return PROJECTS.absent_message() if self.projects.available is False else None

    def _join_ca(self) -> str | None:
        """The CA of the join endpoint's certificate when it is in the module's Secret (a private CA travels in
        the connection string); None means the certificate is publicly trusted."""
        values = creds.secret_values(self.join_tls.get(JOIN_TLS_SECRET, self.namespace))
        return values.get("ca.crt") or None

    # -- the pass ----------------------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        cp = self.clusterpeers.get(key)
        if cp is None:
            # Deleted: owned objects go by garbage collection, the registry drops the peer on its own.
            self.memory.forget(key)
            return Result()
        if (cp.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        now = _utcnow()
        own_uuid = self.ctx.cluster_uuid()
        ca_values = creds.secret_values(self.secrets.get(CA_SECRET, self.namespace))
        ca_pem, ca_key = ca_values.get("tls.crt", ""), ca_values.get("tls.key", "")
        if not own_uuid or not ca_pem or not ca_key:
            # The certificates reconciler creates the CA on first start; the UUID comes from Deckhouse.
            return Result(requeue_after=1.0)
        ca = pki.CertAndKey(ca_pem, ca_key)
        await self.discovery.refresh()
        issuer_url, jwks = await self.issuer.refresh()
        mem = self.memory.get(key)
        spec = cp.get("spec") or {}
        ptype = spec.get("type") or ""
        status = cp.get("status") or {}
        generation = int((cp.get("metadata") or {}).get("generation") or 0)
        waits: list[float] = [MAX_REQUEUE]

        local = self._local_capabilities()
        local_projects = self._local_projects()
        opened = [c for c in spec.get("capabilities") or [] if isinstance(c, str)]
        offer = offer_rules.build_offer(issuer_url=issuer_url, jwks=jwks, projects=local_projects,
                                        capabilities=offered_capabilities(opened, local),
                                        peering_version=self.peering_version)

        secret = self.secrets.get(peer_secret_name(key), self.namespace)
        values = creds.secret_values(secret)
        cstate = creds.credentials_state(values, ca_pem, now)
        # A re-enabled module has a new CA and, its namespace having been removed, no peer Secret: the status of
        # an established peering still names the CA it was made with (status.access.caBundle).
        other_ca = cstate.from_other_ca or made_with_other_ca(status, ca_pem)
        spec_error: tuple[str, str] | None = None
        invite = None
        peer = status.get("peer") if isinstance(status.get("peer"), dict) else None
        just_joined = False

        if other_ca:
            invite = status.get("invite") if isinstance(status.get("invite"), dict) else None
        elif ptype == "Invite":
            invite, spec_error, wait = self._invite(cp, status.get("invite"), own_uuid, ca_pem, now,
                                                    joined=cstate.progress != "none")
            waits.append(wait)
        elif ptype == "Join" and cstate.progress != "complete":
            outcome = await self._join(cp, mem, values, secret, own_uuid, ca, offer, now, generation)
            if isinstance(outcome, Result):
                return outcome
            spec_error, values, joined_peer, wait = outcome
            if joined_peer is not None:
                peer, just_joined = joined_peer, True
            waits.append(wait)
            cstate = creds.credentials_state(values, ca_pem, now)
        elif ptype not in ("Invite", "Join"):
            spec_error = (cond.INVALID_SPEC, f"spec.type {ptype!r} is not Invite or Join; set one of them")

        complete = cstate.progress == "complete" and not other_ca
        if complete:
            values = await self._renew(key, mem, values, own_uuid, now)
            # Right after the join, our status (with the offer the inviter pulls as soon as it has its
            # certificate) is written first; the next pass, a moment later, delivers the certificate.
            if ptype == "Join" and mem.delivered != values.get("issued.crt") and not just_joined:
                await self._deliver(key, mem, values)
            if mem.pull_at <= time.monotonic() or peer is None:
                peer = await self._pull(key, mem, values, peer, now, offer)
            waits.append(max(0.05, mem.pull_at - time.monotonic()))

        peer_uuid = (peer or {}).get("clusterUUID") or values.get("peer-uuid", "")
        eff = effective_capabilities(opened, (peer or {}).get("capabilities") if peer else None, local)
        pairs = project_rules.pair_projects(local_projects, (peer or {}).get("projects")) if complete else []
        grants = grants_rules.desired_grants(cp, peer_uuid, eff.effective, local,
                                             project_rules.paired_namespaces(pairs)) if complete \
            else grants_rules.Grants()
        token_exchange = None
        access = None
        if complete:
            token_exchange = await self._provider(cp, peer, peer_uuid, own_uuid, eff.names)
            access = desired_access(key, peer_uuid, ca_pem, eff.names)
        elif other_ca:
            access = status.get("access")  # kept: it is what tells this peering was made with the old CA
        sync_error = mem.sync_error if complete else None
        if complete and ptype == "Join" and mem.delivered != values.get("issued.crt") and sync_error is None:
            sync_error = (CREDENTIALS_UNDELIVERED, "the inviting cluster has not received our certificate for its "
                          "key yet (POST /peering/v1/credentials); retrying")

        selfcheck = None
        if self.selfcheck is not None:
            result = await self.selfcheck.result()
            selfcheck = conditions_of(result, ca_pem, self.selfcheck.host, now)
            waits.append(max(0.5, self.selfcheck.due_in()))

        state = cond.PeeringState(
            type=ptype, credentials=cstate.progress, credentials_from_other_ca=other_ca,
            spec_error=spec_error, invite=invite,
            join_error=(mem.join_error[1], mem.join_error[2]) if mem.join_error else None,
            has_peer_offer=peer is not None, sync_error=sync_error, token_exchange=token_exchange,
            projects_absent=self._projects_absent())
        new_status = desired_status(cp=cp, now=now, state=state, invite=invite, offer=offer, peer=peer,
                                    effective=eff.names if complete else [], grants=grants.status, access=access,
                                    paired=project_rules.pairs_count(pairs), token_exchange=token_exchange,
                                    selfcheck=selfcheck)
        if new_status != status:
            try:
                await self.kube.update_status(CLUSTERPEERS, {**cp, "status": new_status})
            except Conflict:
                return Result(requeue=True)
            except NotFound:
                return Result()
        if complete and offer != mem.notified_offer:
            if time.monotonic() >= mem.notify_at:
                await self._notify(mem, values, offer)
            if offer != mem.notified_offer:
                waits.append(max(0.05, mem.notify_at - time.monotonic()))
        # The objects that follow from the status (grants, ProjectPeers) are the grants reconciler's: this pass
        # stays short however many projects are paired.
        return Result(requeue_after=min(waits))

    # -- invite ------------------------------------------------------------------------------------------------

    def _invite(self, cp: dict, current: dict | None, own_uuid: str, ca_pem: str, now: datetime.datetime, *,
                joined: bool) -> tuple[dict | None, tuple[str, str] | None, float]:
        """status.invite to write, a spec error, and when to look again (the expiry)."""
        spec = (cp.get("spec") or {}).get("invite") or {}
        current = current if isinstance(current, dict) else None
        if joined:
            return current, None, MAX_REQUEUE
        try:
            ttl = invite_rules.parse_ttl(spec.get("tokenTTL"))
        except invite_rules.InviteError as exc:
            return current, (exc.reason, exc.message), MAX_REQUEUE
        decision = invite_rules.decide_invite(current, ttl=ttl, now=now)
        if decision.issue:
            token = invite_rules.generate_token()
            inv = connstring.Invitation(
                cluster_uuid=own_uuid, join_url=f"https://{self.settings.join_host}",
                entrance_host=self.settings.entrance_host, ca_pin=pki.spki_pin(ca_pem), token_id=token.token_id,
                token_secret=token.secret, expires_at=decision.expires_at, join_ca_pem=self._join_ca())
            try:
                text = connstring.encode(inv)
            except ValueError as exc:
                return current, (cond.INVALID_SPEC, str(exc)), MAX_REQUEUE
            current = invite_rules.invite_status(token, text, decision.expires_at)
            log.info("connection string issued", extra={"clusterpeer": key_of(cp), "why": decision.why,
                                                        "tokenID": token.token_id})
        expires = invite_rules.parse_time(current.get("expiresAt")) if current else None
        wait = (expires - now).total_seconds() + 0.5 if expires and not current.get("used") else MAX_REQUEUE
        return current, None, max(0.5, wait)

    # -- join --------------------------------------------------------------------------------------------------

    async def _join(self, cp: dict, mem: PeerMemory, values: dict, secret: dict | None, own_uuid: str,
                    ca: pki.CertAndKey, offer: dict, now: datetime.datetime, generation: int):
        """Join the inviting cluster; returns Result to stop the pass, or (spec_error, values, peer, wait)."""
        key = key_of(cp)
        spec = (cp.get("spec") or {}).get("join") or {}
        if values.get("peer-ca.crt") and values.get("client.crt"):
            # The answer arrived earlier; only our half is missing (a crash between the two writes).
            return None, values, None, MAX_REQUEUE
        try:
            inv = connstring.decode(spec.get("connectionString") or "", now=now,
                                    expected_cluster_uuid=spec.get("expectedClusterUUID") or None)
        except connstring.ConnectionStringError as exc:
            return (exc.reason, exc.message), values, None, MAX_REQUEUE
        if mem.join_error is not None and mem.join_error[0] == generation and \
                mem.join_error[1] in cond.PERMANENT_JOIN_REASONS:
            # The inviter refused for a reason only a new connection string fixes: do not knock again.
            return None, values, None, MAX_REQUEUE
        if time.monotonic() < mem.join_retry_at:
            return None, values, None, mem.join_retry_at - time.monotonic()
        if not values.get("client.key"):
            # Keep the key before the CSR leaves the cluster, so a repeated join presents the same key.
            material = pki.make_key_and_csr(own_uuid)
            obj = creds.peer_secret(cp, self.namespace, {"client.key": material.key_pem})
            try:
                await self.kube.create(SECRETS, obj)
            except AlreadyExists:
                return Result(requeue=True)
            values = {"client.key": material.key_pem}
        csr = pki.csr_for_key(values["client.key"], own_uuid)
        body = join_rules.join_request(inv, cluster_uuid=own_uuid, alias=key, entrance=self.settings.entrance_host,
                                       ca_pem=ca.cert_pem, csr_pem=csr, offer=offer)
        answer = await self.client.join(inv, body)
        if not answer.ok:
            reason, message = join_rules.join_failure(answer.status, answer.body)
            return self._join_failed(key, mem, values, generation, reason, message)
        try:
            checked = join_rules.check_join_answer(answer.body, inv, own_uuid=own_uuid,
                                                   own_key_fingerprint=pki.public_key_fingerprint(csr))
            ours = offer_rules.own_keys_problem(checked.offer, offer)
            if ours is not None:
                raise join_rules.JoinError(join_rules.INVALID_ANSWER, ours)
            issued = pki.issue_client_cert(ca, checked.csr_pem, checked.cluster_uuid, now=now)
        except join_rules.JoinError as exc:
            return self._join_failed(key, mem, values, generation, exc.reason, exc.message)
        except pki.PKIError as exc:
            return self._join_failed(key, mem, values, generation, join_rules.INVALID_ANSWER,
                                     f"the inviting cluster's certificate request cannot be signed: {exc.message}")
        new_values = {**values, "peer-ca.crt": checked.ca_pem, "client.crt": checked.certificate_pem,
                      "issued.crt": issued, "peer-uuid": checked.cluster_uuid, "peer-entrance": checked.entrance}
        if not await self._write_secret(cp, new_values):
            return Result(requeue=True)
        mem.join_error, mem.join_failures, mem.pull_at = None, 0, self.memory.next_pull()
        peer = offer_rules.peer_status(checked.offer, alias=checked.alias, cluster_uuid=checked.cluster_uuid,
                                       endpoint=checked.entrance, last_sync=now)
        log.info("joined", extra={"clusterpeer": key, "peer": checked.cluster_uuid})
        return None, new_values, peer, 0.05

    def _join_failed(self, key: str, mem: PeerMemory, values: dict, generation: int, reason: str, message: str):
        mem.join_error = (generation, reason, message)
        mem.join_failures += 1
        wait = self.memory.retry_after(mem.join_failures)
        mem.join_retry_at = time.monotonic() + wait
        log.warning("join refused", extra={"clusterpeer": key, "reason": reason})
        return None, values, None, wait

    async def _write_secret(self, cp: dict, values: dict) -> bool:
        """Create or replace the peer Secret with `values`; False on a conflict (the caller requeues)."""
        key = key_of(cp)
        obj = creds.peer_secret(cp, self.namespace, {k: v for k, v in values.items() if k in creds.KEYS})
        current = self.secrets.get(peer_secret_name(key), self.namespace)
        try:
            if current is None:
                await self.kube.create(SECRETS, obj)
            else:
                obj["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
                await self.kube.update(SECRETS, obj)
        except Conflict:
            return False
        return True

    # -- after the exchange ------------------------------------------------------------------------------------

    def _call_args(self, values: dict) -> dict:
        return {"peer_ca_pem": values.get("peer-ca.crt", ""), "client_cert_pem": values.get("client.crt", ""),
                "client_key_pem": values.get("client.key", "")}

    async def _deliver(self, key: str, mem: PeerMemory, values: dict) -> None:
        answer = await self.client.call(values.get("peer-entrance", ""), "credentials",
                                        body=join_rules.credentials_message(values["issued.crt"]),
                                        **self._call_args(values))
        if answer.ok:
            mem.delivered = values["issued.crt"]
            mem.pull_at = 0.0
        else:
            mem.sync_error = sync_failure(answer)
            log.info("credentials not delivered yet", extra={"clusterpeer": key, "status": answer.status})

    async def _renew(self, key: str, mem: PeerMemory, values: dict, own_uuid: str,
                     now: datetime.datetime) -> dict:
        """Renew our client certificate over /peering/v1/certificate once it is due; keep the old one on failure."""
        if not pki.needs_renewal(values["client.crt"], now):
            return values
        csr = pki.csr_for_key(values["client.key"], own_uuid)
        answer = await self.client.call(values.get("peer-entrance", ""), "certificate",
                                        body=join_rules.certificate_request(csr), **self._call_args(values))
        if not answer.ok:
            log.warning("client certificate renewal failed", extra={"clusterpeer": key, "status": answer.status})
            return values
        try:
            cert = join_rules.check_credentials(answer.body, own_key_fingerprint=pki.public_key_fingerprint(csr),
                                                own_uuid=own_uuid, peer_ca_pem=values["peer-ca.crt"])
        except join_rules.JoinError as exc:
            log.warning("renewed certificate refused", extra={"clusterpeer": key, "error": exc.message})
            return values
        new_values = {**values, "client.crt": cert}
        cp = self.clusterpeers.get(key)
        if cp is not None and await self._write_secret(cp, new_values):
            log.info("client certificate renewed", extra={"clusterpeer": key})
            return new_values
        return values

    async def _pull(self, key: str, mem: PeerMemory, values: dict, peer: dict | None,
                    now: datetime.datetime, own_offer: dict) -> dict | None:
        """Fetch the peer's offer; the previous status.peer stays on any failure (a failed sync never revokes)."""
        answer = await self.client.call(values.get("peer-entrance", ""), "offer", **self._call_args(values))
        if not answer.ok:
            mem.sync_error = sync_failure(answer)
            mem.sync_failures += 1
            mem.pull_at = time.monotonic() + self.memory.retry_after(mem.sync_failures)
            return peer
        mem.pull_at = self.memory.next_pull()
        try:
            alias, offer = join_rules.parse_offer_message(answer.body)
        except join_rules.JoinError as exc:
            mem.sync_error = (exc.reason, exc.message)
            return peer
        check = offer_rules.validate_offer(offer)
        if not check.ok:
            mem.sync_error = (check.reason, check.message)
            return peer
        ours = offer_rules.own_keys_problem(offer, own_offer)
        if ours is not None:
            mem.sync_error = (offer_rules.OFFER_INVALID, ours)
            return peer
        failed_before = mem.sync_error is not None
        mem.sync_error, mem.sync_failures = None, 0
        fresh = offer_rules.peer_status(offer, alias=alias, cluster_uuid=values.get("peer-uuid", ""),
                                        endpoint=values.get("peer-entrance", ""), last_sync=now)
        if peer is not None and not failed_before and \
                {k: v for k, v in fresh.items() if k != "lastSyncTime"} == \
                {k: v for k, v in peer.items() if k != "lastSyncTime"}:
            # lastSyncTime moves only when the sync learnt something (a change, or recovery after a failure):
            # a steady state writes nothing.
            return peer
        return fresh

    async def _notify(self, mem: PeerMemory, values: dict, offer: dict) -> None:
        answer = await self.client.call(values.get("peer-entrance", ""), "notify", body={},
                                        **self._call_args(values))
        self.memory.announced(mem, offer, answer.ok)

    # -- derived objects ---------------------------------------------------------------------------------------

    async def _provider(self, cp: dict, peer: dict | None, peer_uuid: str, own_uuid: str,
                        effective: list[str]) -> cond.Cond:
        """Keep the peer's TokenExchangeProvider as the offer says and return TokenExchangeReady."""
        key = key_of(cp)
        name = provider_name(key)
        issuer = (peer or {}).get("issuer") or {}
        resource = self.providers.resource
        if resource is None:
            return cond.token_exchange_condition(cond.ProviderObservation(
                api_absent=TOKENEXCHANGEPROVIDERS.absent_message()))
        existing = self.providers.get(name)
        ours = existing is None or ownership.belongs_to(existing, key)
        if not issuer.get("url") or not issuer.get("jwks"):
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, issuer_published=False,
                                                                          ours=ours))
        problem = offer_rules.jwks_problem(issuer["jwks"])
        if problem is not None:
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, jwks_problem=problem,
                                                                          ours=ours))
        if not ours:
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, ours=False))
        want = provider_rules.desired_provider(cp, peer_uuid=peer_uuid, local_uuid=own_uuid, issuer_url=issuer["url"],
                                               jwks=issuer["jwks"], effective=effective,
                                               api_version=resource.api_version)
        obj = existing
        try:
            if existing is None:
                obj = await self.kube.create(resource, want)
            elif not (existing.get("metadata") or {}).get("deletionTimestamp") and (
                    existing.get("spec") != want["spec"] or
                    (existing.get("metadata") or {}).get("ownerReferences") != want["metadata"]["ownerReferences"]):
                meta = {**(existing.get("metadata") or {}), "labels": {**((existing.get("metadata") or {})
                                                                          .get("labels") or {}),
                                                                       **want["metadata"]["labels"]},
                        "ownerReferences": want["metadata"]["ownerReferences"]}
                obj = await self.kube.update(resource, {**existing, "metadata": meta,
                                                                     "spec": want["spec"]})
        except AlreadyExists:
            obj = None  # our own create lags in the cache, or a foreign one appeared: the next pass tells
        except Conflict:
            obj = existing
        except NotFound:
            # The API went away between discovery and the write: ask discovery again now.
            self.providers.poke()
            return cond.token_exchange_condition(cond.ProviderObservation(
                api_absent=TOKENEXCHANGEPROVIDERS.absent_message()))
        except ApiError as exc:
            return cond.token_exchange_condition(cond.ProviderObservation(api_error=f"{exc.code} {exc.reason}: "
                                                                                     f"{exc.message[:300]}"))
        return cond.token_exchange_condition(cond.ProviderObservation(
            obj=obj, ours=True, exchange_failure=self.ctx.exchange_failures().get(name)))
