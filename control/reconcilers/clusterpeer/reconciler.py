"""The ClusterPeer reconciler: one level-based pass per ClusterPeer, phase by phase (see the package docstring),
then the whole status computed in one place (`rules.status.clusterpeer_status`) from what the phases observed,
and written only if it differs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from contract.names import (CA_SECRET, ENTRANCE_TLS_SECRET, JOIN_TLS_SECRET, MANAGED_BY_SELECTOR, peer_secret_name,
                            provider_name)
from control import pki, uuid_claim
from control import connstring
from control.connstring import format_time
from control.clusterpeer_status import write_status
from control.facts import Discovery, Issuer
from contract.peer_secret import PeerCredentials
from control.kube import CLUSTERPEERS, NAMESPACES, PEERINGCAPABILITIES, SECRETS, Conflict, KubeSession, NotFound
from control.optional import PROJECTS, TOKENEXCHANGEPROVIDERS
from control.peer_secret import drop_peer_secret
from control.peerclient import PeerClient
from control.reconcilers.clusterpeer import invite as invite_phase
from control.reconcilers.clusterpeer.join import Joiner
from control.reconcilers.clusterpeer.observe import MAX_REQUEUE, NAME, Observed, observe
from control.reconcilers.clusterpeer.provider import ProviderKeeper
from control.reconcilers.clusterpeer.sync import SyncOutcome, Syncer
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import conditions as cond
from control.rules import credentials as creds
from control.rules import events as event_rules
from control.rules import invite as invite_rules
from control.rules import join as join_rules
from control.rules import projects as project_rules
from control.rules.access import desired_access
from control.rules.served import admits_certificate, served_capabilities
from control.rules.capabilities import validated_capabilities
from control.rules.entitlements import NONE, Entitlements, entitlements
from control.rules.ownership import owner_names
from control.rules.spec import INVITE, JOIN
from control.rules.status import KEEP, clusterpeer_status
from control.selfcheck import SelfCheck, conditions_of
from control.workqueue import Result, Watch, key_of

if TYPE_CHECKING:
    from control.context import Context

log = logging.getLogger("peering.control.clusterpeer")


class ClusterPeerReconciler:
    name = NAME

    def __init__(self, ctx: "Context", *, client: PeerClient, memory: Memory, selfcheck: SelfCheck | None,
                 peering_version: str, discovery: Discovery | None = None) -> None:
        self.ctx = ctx
        self.kube: KubeSession = ctx.kube
        self.namespace = ctx.namespace
        self.settings = ctx.settings
        self.clock = ctx.clock
        self.client = client
        self.memory = memory
        self.selfcheck = selfcheck
        self.peering_version = peering_version
        self.discovery = discovery or ctx.discovery
        self.issuer = Issuer(ctx.kube, ttl=ctx.settings.control.issuer_refresh_interval, clock=ctx.clock)
        inf = ctx.informers
        self.clusterpeers = inf.get(CLUSTERPEERS)
        self.secrets = inf.get(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR)
        self.capabilities = inf.get(PEERINGCAPABILITIES)
        self.providers = inf.get(TOKENEXCHANGEPROVIDERS)
        self.namespaces = inf.get(NAMESPACES)
        self.projects = inf.get(PROJECTS)
        join_tls = f"metadata.name={JOIN_TLS_SECRET}"
        self.join_tls = inf.get(SECRETS, namespace=self.namespace, field_selector=join_tls)
        self.joiner = Joiner(ctx.kube, client, memory, ctx.clock, namespace=self.namespace,
                             entrance_host=self.settings.entrance_host,
                             client_cert_lifetime=self.settings.control.client_lifetime,
                             uuids_in_use=self._uuids_in_use)
        published = ctx.published
        self.syncer = Syncer(ctx.kube, client, memory, ctx.clock, namespace=self.namespace, admits=(
            (lambda name, cert: admits_certificate(published.registry, name, cert)) if published is not None else
            (lambda name, cert: True)), entrance_serves=ctx.entrance_serves)
        self.provider = ProviderKeeper(ctx.kube, self.providers, exchange_failures=ctx.exchange_failures)
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

    async def _drop_copies(self, cp: dict, keys: list[str]) -> Result:
        """Remove the annotations that hold a copy of the connection string (kubectl's client-side apply writes
        one; the chart's admission policies refuse or strip it where they run, this covers the rest): a merge
        patch setting each to null, with the resourceVersion read, so that nothing else of the object changes.
        The log line and the Event name the keys only."""
        meta = cp.get("metadata") or {}
        try:
            await self.kube.patch(CLUSTERPEERS, meta.get("name"), {"metadata": {"annotations": dict.fromkeys(keys)}},
                                  resource_version=meta.get("resourceVersion"))
        except Conflict:
            return Result(requeue=True)
        except NotFound:
            return Result()
        log.warning("removed annotations holding a copy of the connection string",
                    extra={"clusterpeer": meta.get("name"), "annotations": keys})
        await self.ctx.events.emit_all(cp, [event_rules.connection_string_copy_removed(keys)])
        return Result(requeue=True)

    def _uuids_in_use(self, name: str) -> dict[str, str]:
        """The cluster UUIDs the live ClusterPeers other than `name` stand for (`rules.join.uuids_in_use`)."""
        return join_rules.uuids_in_use(((key_of(cp), cp, PeerCredentials.from_secret(self.secrets.get(
            peer_secret_name(key_of(cp)), self.namespace))) for cp in self.clusterpeers.items()), exclude=name)

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
            self.ctx.written_status.pop(key, None)
            return Result()
        if (cp.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        copies = connstring.copies_in((cp.get("metadata") or {}).get("annotations"))
        if copies:
            return await self._drop_copies(cp, copies)
        own_uuid = self.ctx.cluster_uuid()
        ca = creds.cluster_ca(self.secrets.get(CA_SECRET, self.namespace))
        if not own_uuid or ca is None:
            # The certificates reconciler creates the CA on first start; the UUID comes from Deckhouse.
            return Result(requeue_after=1.0)
        await self.discovery.refresh()
        obs = observe(cp, now=self.clock.now(), own_uuid=own_uuid, ca=ca, issuer=await self.issuer.refresh(),
                      peer_secret=self.secrets.get(peer_secret_name(key), self.namespace),
                      local_capabilities=validated_capabilities(self.capabilities.items(),
                                                                self.discovery.namespaced),
                      local_projects=project_rules.local_projects(self.projects.items(), self.namespaces.items()),
                      projects_absent=PROJECTS.absent_message() if self.projects.available is False else None,
                      peering_version=self.peering_version)
        result, learnt = await self._phases(obs, self.memory.recall(key))
        # What the phases learnt, handed back in their outcomes, is kept in this one place.
        self.memory.keep(key, learnt)
        return result

    async def _phases(self, obs: Observed, mem: PeerMemory) -> tuple[Result, PeerMemory]:
        """The phases of one pass from what it observed and the memory it starts with; the result, and the memory
        as the phases' outcomes leave it."""
        cp, key, own_uuid = obs.cp, obs.key, obs.own_uuid
        waits = [MAX_REQUEUE]

        # Invite or join, while the credentials exchange is not complete.
        values, peer, credentials = obs.values, obs.stored_peer, obs.credentials
        invite, problem, just_joined = None, None, False
        if obs.other_ca:
            invite = KEEP  # nothing is attempted for a peering of the old CA; its status is the evidence
        elif obs.spec.type == INVITE:
            invited = invite_phase.invite(obs, join_host=self.settings.join_host,
                                          entrance_host=self.settings.entrance_host, join_ca=self._join_ca)
            invite, problem = invited.invite, invited.problem
            replaced = invite_rules.recorded_redeemer(obs.stored_invite)
            if replaced is not None and invite_rules.recorded_redeemer(invite) is None:
                # A string re-issued over a redemption that could not complete: that redemption stands for its
                # joiner's UUID no more, and its claim goes before the status says so (a crash between the two
                # writes finds the same re-issue in the next pass, and releases again: a no-op).
                await uuid_claim.release(self.kube, self.namespace, cp, replaced.cluster_uuid)
            waits.append(invited.wait)
            if invited.drop_secret and obs.secret is not None:
                # The copy this pass judged: a concurrent change, such as the joiner's certificate arriving, keeps it.
                await drop_peer_secret(self.kube, self.namespace, key, obs.secret)
                return Result(requeue_after=0.5), mem
        elif obs.spec.type == JOIN and credentials.progress != "complete":
            joined = await self.joiner.join(obs, mem)
            mem = joined.memory
            if joined.requeue:
                return Result(requeue=True), mem
            values, problem = joined.values, joined.problem
            waits.append(joined.wait)
            if joined.peer is not None:
                peer, just_joined = joined.peer, True
            credentials = creds.credentials_state(values, obs.ca.cert_pem, obs.now)
        elif obs.spec.type not in (INVITE, JOIN):
            problem = obs.spec.problem

        # Once established: renew, deliver, pull; then what the peering entitles to, and the provider.
        established = credentials.progress == "complete" and not obs.other_ca
        synced, derived, token_exchange, access = None, NONE, None, KEEP if obs.other_ca else None
        if established:
            synced = await self.syncer.sync(obs, mem, values, peer, just_joined=just_joined)
            values, peer, mem = synced.values, synced.peer, synced.memory
            waits.append(synced.wait)
            peer_uuid = (peer or {}).get("clusterUUID") or values.peer_uuid
            derived = entitlements(cp, peer=peer, local_capabilities=obs.local_capabilities,
                                   local_projects=obs.local_projects)
            token_exchange = await self.provider.keep(cp, peer=peer, own_uuid=own_uuid,
                                                      effective=derived.capability_names)
            # Announced only once served: the registry publish that serves the rest queues this key again.
            published = self.ctx.published
            access = desired_access(key, peer_uuid, obs.ca.cert_pem, derived.capability_names,
                                    None if published is None else served_capabilities(published.registry, key))

        selfcheck = None
        if self.selfcheck is not None:
            seen = await self.selfcheck.result()
            if seen is not None:  # None: the entrance did not answer, not confirmed yet; the conditions stay
                selfcheck = conditions_of(seen, obs.ca.cert_pem, self.selfcheck.host, obs.now)
            waits.append(max(0.5, self.selfcheck.due_in()))

        status = self._status(obs, mem, credentials=credentials.progress, problem=problem, invite=invite,
                              peer=peer, synced=synced, derived=derived, token_exchange=token_exchange,
                              access=access, selfcheck=selfcheck)
        if status != obs.status:
            try:
                await write_status(self.kube, cp, status)
            except Conflict:
                return Result(requeue=True), mem
            except NotFound:
                return Result(), mem
            # The peer handlers serve it until the watch delivers it (the notify below makes the peer pull now).
            self.ctx.written_status[key] = ((cp.get("metadata") or {}).get("resourceVersion") or "", status)
            await self.ctx.events.emit_all(cp, event_rules.clusterpeer_events(obs.status, status, now=obs.now))
        if established:
            renewed, seen = event_rules.certificate_events(mem.seen_certs, values, outage=mem.outage_note)
            mem = mem.learnt(seen_certs=seen, outage_note="")
            await self.ctx.events.emit_all(cp, renewed)
            # The objects that follow from the status (grants, ProjectPeers) are the grants reconciler's: this
            # pass stays short however many projects are paired.
            announced = await self.syncer.announce(obs, mem, values)
            mem = announced.memory
            if announced.wait is not None:
                waits.append(announced.wait)
        return Result(requeue_after=min(waits)), mem

    def _status(self, obs: Observed, mem: PeerMemory, *, credentials: str, problem: tuple[str, str] | None,
                invite: dict | None, peer: dict | None, synced: SyncOutcome | None, derived: Entitlements,
                token_exchange: cond.Cond | None, access: dict | None,
                selfcheck: tuple[cond.Cond, cond.Cond] | None) -> dict:
        """The status from what the pass observed: Ready and the phase (`rules.conditions.readiness`, where each
        reason is chosen), then every field and condition (`rules.status.clusterpeer_status`)."""
        state = cond.PeeringState(
            type=obs.spec.type, credentials=credentials, credentials_from_other_ca=obs.other_ca,
            spec_error=problem, invite=obs.stored_invite if invite is KEEP else invite,
            join_error=(mem.join_error[1], mem.join_error[2]) if mem.join_error else None,
            has_peer_offer=peer is not None, sync_error=synced.error if synced else None,
            credentials_undelivered=synced.undelivered if synced else False, token_exchange=token_exchange,
            projects_absent=obs.projects_absent)
        return clusterpeer_status(
            obs.status, generation=obs.generation, now=obs.now, readiness=cond.readiness(state, obs.now),
            token_exchange=token_exchange, client_cert=selfcheck[0] if selfcheck else KEEP,
            server_cert=selfcheck[1] if selfcheck else KEEP, invite=invite, offer=obs.offer, peer=peer,
            effectiveCapabilities=derived.capability_names, grants=derived.grants.status, access=access,
            pairedProjectsCount=derived.paired_count)
