"""Deckhouse's module manager as a lab cluster needs it: the ModuleConfigs and Modules (deckhouse.io/v1alpha1) of the
modules the guide touches, user-authn and peering, kept as deckhouse-controller keeps them.

- At start it writes a Module per module (`properties` from its module.yaml: stage, source Embedded, namespace,
  requirements, disable options) and registers its webhook (lab/module_webhook.py), which validates every
  ModuleConfig write on both backends.
- It watches the ModuleConfigs. A module is enabled when its config says `enabled: true` (user-authn also without a
  config: Deckhouse's bundle enables it) and every module of its `requirements.modules` is enabled: disabling
  user-authn disables peering.
- Enabling peering renders charts/peering as Deckhouse does (lab/deckhouse_module.py: the config's settings with
  their defaults, `global.*` from ModuleConfig global and the cluster) and applies every object of a kind the API
  server serves, in install order; a changed setting re-renders it and deletes what is no longer rendered. The
  chart's DexClient goes to user-authn (lab/userauthn_module.py: the Dex client and its Secret), and the module's
  ServiceAccount gets a token for its process, which the cluster then starts (its "Deployment").
- Disabling it stops the process and deletes the release's objects, its namespace last; the CRDs and ClusterPeers
  stay, as the guide says; the `modules.deckhouse.io/allow-disabling` annotation is then removed.
- The Module's status says it: PHASE Reconciling while it is applied, Ready once applied and its process started,
  Error (IsReady False, ModuleError) when an object could not be applied (retried every second), and when off
  Downloaded with EnabledByModuleManager False: "turned off by module config", or "turned off because of unmet module
  dependencies: 1 error occurred: dependency 'user-authn' is disabled". ModuleConfig's status has its settings
  version (VERSION), or "Ignored: unknown module name".

The cluster (LabCluster) is handed in: `api`, `pki`, `uuid`, `name`, `dex`, `dex_client_secret`,
`public_domain_template`, `user_authn_up()`/`_down()`, `peering_token(token)`, `peering_up()`/`_down()`.
Deckhouse's Module turns Ready without waiting for the Pods; the lab's waits for its process.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from lab import certs, deckhouse_module, userauthn_module
from lab.apiserver.errors import ApiError
from lab.module_webhook import ALLOW_DISABLING, Known, WebhookServer, enabled_value, settings_verdict
from lab.module_status import GROUP, merged, module_object, module_status, same_status

log = logging.getLogger(__name__)

PEERING = deckhouse_module.MODULE_NAME
USER_AUTHN = userauthn_module.MODULE
# The order an install needs; other kinds after these. An uninstall goes the other way.
INSTALL_ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
RETRY_SECONDS = 1.0
# The module's ServiceAccount token outlives any lab run.
TOKEN_SECONDS = 7 * 24 * 3600
# user-authn as Deckhouse ships it (modules/150-user-authn): its module.yaml has no requirements and no disable
# confirmation.
USER_AUTHN_DEFINITION = {"name": USER_AUTHN, "weight": 150, "stage": "General Availability",
                         "namespace": userauthn_module.NAMESPACE}
# The settings versions each module's schema knows (peering's one): global's and user-authn's settings are at version
# 2 (the lab checks no global setting, and takes user-authn's version 1 as 2, where Deckhouse converts it).
SETTINGS_VERSIONS = {"global": (1, 2), USER_AUTHN: (1, 2)}
TURNED_OFF_BY_CONFIG = ("ModuleConfig", "turned off by module config")
TURNED_OFF_BY_BUNDLE = ("Bundle", "turned off by bundle")


class ModuleManager:
    """The module manager of one lab cluster; `start()` at seed time, `run()` once the cluster may start
    processes, `stop()` before its API server goes."""

    def __init__(self, cluster: Any, *, other_modules: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.other_modules = tuple(other_modules)
        pki = cluster.pki
        self.ca_pem = pki.public_ca.cert_pem
        self.webhook = WebhookServer(certs.server_ssl_context(pki.public_ca.issue_server(
            ["deckhouse.d8-system.svc"], ["127.0.0.1"])))
        self.definitions = {PEERING: deckhouse_module.definition(), USER_AUTHN: USER_AUTHN_DEFINITION}
        self.schemas = {PEERING: deckhouse_module.config_schema(), USER_AUTHN: userauthn_module.SETTINGS_SCHEMA}
        self.enabled: set[str] = set()
        self.release: list[dict] = []
        # The values the release was last applied with: a pass with the same values applies nothing.
        self.applied_values: dict | None = None
        self.processes_allowed = False
        self.processes_started = False
        self.process_failed = False
        self.dex_clients: userauthn_module.DexClients | None = None
        self.modules: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._publish()

    @property
    def api(self) -> Any:
        return self.cluster.api

    def known(self) -> Known:
        return Known(self.definitions, self.schemas, frozenset(self.enabled), self.modules, SETTINGS_VERSIONS)

    def _publish(self) -> None:
        self.webhook.known = self.known()

    # --- lifecycle ---

    async def start(self, configs: list[dict]) -> None:
        """The webhook and its configuration, a Module per module, the given ModuleConfigs, and a first pass."""
        self.dex_clients = userauthn_module.DexClients(self.cluster.dex, self.cluster.dex_client_secret)
        await self.webhook.start()
        self.api.create(self.webhook.configuration(self.ca_pem))
        for definition in self.definitions.values():
            self.api.create(module_object(definition))
        self.modules = frozenset(self.definitions)
        self._publish()
        await asyncio.to_thread(self._wait_webhook)
        await self.reconcile()
        for cfg in configs:   # one at a time, as an administrator would: user-authn enabled before peering
            self.api.create(cfg)
            await self.reconcile()

    def _wait_webhook(self, timeout: float = 30.0) -> None:
        """A real kube-apiserver starts calling a new webhook a moment after its configuration is stored: wait until
        a write the webhook refuses is refused (a dry run, which stores nothing)."""
        if not hasattr(self.api, "request"):
            return   # the emulator reads its configurations at each write
        import time

        probe = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": PEERING},
                 "spec": {"settings": {"logLevel": "Info"}}}
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api.request("POST", f"/apis/{GROUP}/v1alpha1/moduleconfigs", probe, params={"dryRun": "All"})
            except ApiError as e:
                if "spec.version is required" in e.message:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster {self.cluster.name}: kube-apiserver did not call the module manager's "
                                   f"webhook within {timeout:.0f}s")
            time.sleep(0.1)   # bounded poll: kube-apiserver signals nothing when its webhook configuration is loaded

    async def run(self) -> None:
        """Start the processes of enabled modules, then follow the ModuleConfigs."""
        self.processes_allowed = True
        await self.reconcile()
        self._task = asyncio.create_task(self._watch(), name=f"module-manager-{self.cluster.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.webhook.stop()

    async def _watch(self) -> None:
        worker = asyncio.create_task(self._work())
        try:
            while True:
                try:
                    async for _ in self.api.watch(GROUP, "moduleconfigs"):
                        self._dirty.set()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a broken watch is started again, as an informer does
                    log.info("cluster %s: module manager's watch ended (%s); watching again", self.cluster.name, e)
                self._dirty.set()
                await asyncio.sleep(0.2)
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                if not await self.reconcile():
                    asyncio.get_running_loop().call_later(RETRY_SECONDS, self._dirty.set)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster %s: module manager pass failed; retrying", self.cluster.name)
                asyncio.get_running_loop().call_later(RETRY_SECONDS, self._dirty.set)

    # --- one pass ---

    def _configs(self) -> dict[str, dict]:
        return {c["metadata"]["name"]: c for c in self.api.list(GROUP, "moduleconfigs")}

    async def reconcile(self) -> bool:
        """One pass over every module; False when something is to be tried again."""
        async with self._lock:
            configs = self._configs()
            self._config_statuses(configs)
            ua_config = configs.get(USER_AUTHN)
            ua = enabled_value(ua_config) is not False
            peering_config = configs.get(PEERING)
            wanted = enabled_value(peering_config) is True
            peering = wanted and ua
            if not peering and PEERING in self.enabled:
                await self._disable_peering(peering_config)
            if ua and USER_AUTHN not in self.enabled:
                await self.cluster.user_authn_up()
            if not ua and USER_AUTHN in self.enabled:
                await self.cluster.user_authn_down()
            (self.enabled.add if ua else self.enabled.discard)(USER_AUTHN)
            self._publish()
            if ua:
                self.dex_clients.set_settings((ua_config or {}).get("spec", {}).get("settings"))
            self._write_status(USER_AUTHN, by_config=enabled_value(ua_config) is True, enabled=ua, phase="Ready",
                               off=TURNED_OFF_BY_CONFIG)
            if peering:
                return await self._enable_peering(configs)
            off = TURNED_OFF_BY_CONFIG if peering_config is not None else TURNED_OFF_BY_BUNDLE
            if wanted:
                off = ("ModuleDependencyExtender", "turned off because of unmet module dependencies: 1 error "
                                                   f"occurred: dependency '{USER_AUTHN}' is disabled")
            self._write_status(PEERING, by_config=wanted, enabled=False, phase="", off=off)
            return True

    def _config_statuses(self, configs: Mapping[str, dict]) -> None:
        for name, cfg in configs.items():
            if name in self.definitions or name == "global":
                verdict = settings_verdict(name, cfg, self.known())
                latest = max(SETTINGS_VERSIONS.get(name, (1,)))
                version = str(int((cfg.get("spec") or {}).get("version") or latest))
                status = {"version": "" if not verdict.allowed else version,
                          "message": f"Error: {verdict.message}" if not verdict.allowed else ""}
            else:
                status = {"version": "", "message": "Ignored: unknown module name"}
            if (cfg.get("status") or {}) != status:
                self._update_status({**cfg, "status": status})

    def _update_status(self, obj: dict) -> None:
        try:
            self.api.update(obj, subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):   # gone, or changed: the watch brings it back
                raise

    def _write_status(self, name: str, **state) -> None:
        module = self.api.get(GROUP, "modules", name)
        if module is None:
            return
        status = module_status(module.get("status"), **state)
        if not same_status(module.get("status"), status):
            self._update_status({**module, "status": status})

    # --- peering ---

    def _values(self, configs: Mapping[str, dict]) -> dict:
        settings = (configs[PEERING].get("spec") or {}).get("settings") or {}
        modules = (((configs.get("global") or {}).get("spec") or {}).get("settings") or {}).get("modules") or {}
        return deckhouse_module.module_values(
            settings, public_domain_template=modules.get("publicDomainTemplate") or self.cluster.public_domain_template,
            cluster_uuid=self.cluster.uuid, https=modules.get("https"),
            enabled_modules=sorted(self.enabled | {PEERING} | set(self.other_modules)),
            high_availability=len(self.cluster.replicas) > 1, kubernetes_version=self.cluster.kubernetes_version())

    def _served(self, objs: list[dict]) -> list[dict]:
        served = [o for o in objs if self.api.registry.by_kind(o["apiVersion"], o["kind"]) is not None]
        for obj in served:
            if obj["kind"] == "Deployment":
                # As scaled to the lab's replicas (the chart runs 1, and 2 in high availability, which the lab
                # renders with more than one replica).
                obj["spec"]["replicas"] = len(self.cluster.replicas)
        return sorted(served, key=lambda o: INSTALL_ORDER.index(o["kind"]) if o["kind"] in INSTALL_ORDER
                      else len(INSTALL_ORDER))

    async def _enable_peering(self, configs: Mapping[str, dict]) -> bool:
        verdict = settings_verdict(PEERING, configs[PEERING], self.known())
        if not verdict.allowed:
            # Deckhouse keeps the module as its last valid settings made it; the config's status says why.
            return True
        first = PEERING not in self.enabled
        if first:
            self._write_status(PEERING, by_config=True, enabled=True, phase="Reconciling")
        values = self._values(configs)
        try:
            if values != self.applied_values:
                await self._install(values)
        except (ApiError, OSError) as e:
            self._write_status(PEERING, by_config=True, enabled=True, phase="Error",
                               error=f"the release could not be applied: {e}")
            return False
        self.enabled.add(PEERING)
        self._publish()
        if first or not (self.processes_started or self.process_failed):
            await self._start_process()
        if not self.process_failed:
            self._write_status(PEERING, by_config=True, enabled=True,
                               phase="Ready" if self.processes_started else "Reconciling")
        return True

    async def _install(self, values: dict) -> None:
        """Render the chart for `values`, apply what the API server serves, delete what is no longer rendered."""
        rendered = await asyncio.to_thread(deckhouse_module.render, values)
        objs = self._served(rendered)
        for obj in objs:
            self._apply(obj)
        keep = {self._ref(o) for o in objs}
        for gone in reversed([o for o in self.release if self._ref(o) not in keep]):
            self._delete(gone)
        self.release = objs
        for obj in rendered:
            if obj["kind"] == "DexClient":
                self._dex_client(obj)
        if any(o["kind"] == "MutatingAdmissionPolicy" for o in objs):
            await self._until_clusterpeers_writable()
        self.applied_values = values

    async def _until_clusterpeers_writable(self, timeout: float = 30.0) -> None:
        """Until kube-apiserver takes a ClusterPeer write (a dry-run create): a MutatingAdmissionPolicy that matches
        a custom resource answers every write of it 503 "Resource kind ... not found" until the policy's type
        converter has learnt the CRD's schema, whatever its failurePolicy. Deckhouse installs the module long before
        anyone creates a ClusterPeer; the lab's tests create one at once, so the install ends once writes pass."""
        probe = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                 "metadata": {"name": "lab-admission-probe"}, "spec": {"type": "Invite"}}
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await asyncio.to_thread(self.api.request, "POST", "/apis/peering.deckhouse.io/v1alpha1/clusterpeers",
                                        probe, params={"dryRun": "All"})
                return
            except ApiError as e:
                if e.code not in (404, 503) or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.1)  # a bounded poll of the API server's own readiness

    async def _start_process(self) -> None:
        """The ServiceAccount's token for the process (a Pod's mounted token), and the process once allowed. A
        process that does not start fails the cluster's start; later, it makes the Module's phase Error, until the
        module is disabled and enabled again."""
        sa = self.api.get("", "serviceaccounts", "peering", deckhouse_module.NAMESPACE)
        token, _ = self.api.sa_issuer.issue(deckhouse_module.NAMESPACE, "peering", sa["metadata"]["uid"], [],
                                            TOKEN_SECONDS)
        self.cluster.peering_token(token)
        if not self.processes_allowed:
            return
        try:
            await self.cluster.peering_up()
        except (RuntimeError, OSError, asyncio.TimeoutError) as e:
            if self._task is None:
                raise   # the cluster's start: it fails with the process's own words, as without a module manager
            log.warning("cluster %s: the peering process did not start: %s", self.cluster.name, e)
            self._write_status(PEERING, by_config=True, enabled=True, phase="Error",
                               error=f"the module's process did not start: {str(e).splitlines()[0]}")
            self.process_failed = True
            return
        self.processes_started = True
        self.process_failed = False

    def _dex_client(self, obj: dict) -> None:
        spec = userauthn_module.DexClientSpec.of(obj)
        self.dex_clients.add(spec)
        secret = userauthn_module.dex_client_secret(spec.name, spec.namespace, self.cluster.dex_client_secret)
        self._apply(secret)

    async def _disable_peering(self, cfg: dict | None) -> None:
        await self.cluster.peering_down()
        self.processes_started = self.process_failed = False
        for obj in reversed(self.release):
            self._delete(obj)
        self.release = []
        self.applied_values = None
        for spec in list(self.dex_clients.clients.values()):
            if spec.namespace == deckhouse_module.NAMESPACE:
                self.dex_clients.remove(spec)
        self.enabled.discard(PEERING)
        self._publish()
        if cfg is not None and ALLOW_DISABLING in ((cfg.get("metadata") or {}).get("annotations") or {}):
            fresh = self.api.get(GROUP, "moduleconfigs", PEERING)
            if fresh is not None:
                annotations = dict(fresh["metadata"].get("annotations") or {})
                annotations.pop(ALLOW_DISABLING, None)
                fresh["metadata"]["annotations"] = annotations
                try:
                    self.api.update(fresh)
                except ApiError as e:
                    if e.code not in (404, 409):
                        raise

    # --- objects ---

    def _ref(self, obj: Mapping) -> tuple:
        meta = obj.get("metadata") or {}
        return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta.get("name")

    def _resource(self, obj: Mapping):
        return self.api.registry.by_kind(obj["apiVersion"], obj["kind"])

    def _apply(self, obj: dict) -> None:
        res = self._resource(obj)
        meta = obj["metadata"]
        ns = meta.get("namespace") if res.namespaced else None
        existing = self.api.get(res.group, res.plural, meta["name"], ns)
        if existing is None:
            self.api.create(obj)
            return
        body = merged(existing, obj)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        if body != existing:
            self.api.update(body)

    def _delete(self, obj: Mapping) -> None:
        res = self._resource(obj)
        meta = obj["metadata"]
        try:
            self.api.delete(res.group, res.plural, meta["name"], meta.get("namespace") if res.namespaced else None)
        except ApiError as e:
            if e.code != 404:
                raise
