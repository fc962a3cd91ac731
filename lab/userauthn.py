"""The lab's user-authn: turns TokenExchangeProvider objects into Dex connectors and reports on them.

TokenExchangeProvider is the contract the module assumes of Deckhouse's user-authn (docs/user-authn-contract.md;
no Deckhouse release has it): for each cluster-scoped `deckhouse.io/v1alpha1` TokenExchangeProvider, Dex gets a
token-exchange connector whose id is the provider's name, and the provider's `status.conditions[type=Ready]`
says whether that worked:

| reason | when |
|---|---|
| ProviderReady (True) | Dex accepts the issuer's tokens through connector `<name>` |
| InvalidSpec | no issuer, an issuer that is not an https URL, no usernamePrefix or one starting with `system:`, a jwks that is not a JWK Set of public keys, audiences that are not a list of strings |
| PrefixConflict | the usernamePrefix overlaps (one starts with the other) the prefix of an older provider: a user name could then come from either; the newer provider loses |
| DiscoveryFailed | jwks is empty and `<issuer>/.well-known/openid-configuration` or its `jwks_uri` could not be read or gave no JWK Set |
| ApplyError | Dex could not be configured |

The connector names the exchanged identity (lab/dex_connector.py has the rules): email = usernamePrefix + the subject
token's `sub`, email_verified = true, name = usernamePrefix + `sub`, preferred_username = `sub`, no groups.
Dex puts them into the exchanged token only for the scopes asked (`email`, `profile`, `groups`).

When the TokenExchangeProvider CRD is not installed (a Deckhouse whose user-authn does not have the feature),
this controller waits for it and starts serving providers once the CRD appears; if the CRD is deleted, every
connector goes and it waits again.

Lab only: the annotation `lab.deckhouse.io/fail: ApplyError|DiscoveryFailed` makes the provider fail with that
reason on purpose, and `lab.deckhouse.io/delay-seconds: "N"` makes user-authn take N seconds before it applies
a change, so that tests (also through kubectl, from other processes) can see the module wait for it.

The Dex clients user-authn makes of its settings and of DexClients (the `kubernetes` client only with
`publishAPI.enabled`) are lab/userauthn_module.py's.

The rules are plain functions (`spec_problem`, `prefix_conflicts`, `ready_condition`, `status_patch`); the class
`UserAuthn` only watches, fetches discovery documents and writes.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import aiohttp
from jwcrypto import jwk
from jwcrypto.common import JWException

from lab.apiserver.errors import ApiError
from lab.dex import Dex

log = logging.getLogger(__name__)

GROUP = "deckhouse.io"
VERSION = "v1alpha1"
PLURAL = "tokenexchangeproviders"
CRD_NAME = f"{PLURAL}.{GROUP}"

FAIL_ANNOTATION = "lab.deckhouse.io/fail"
DELAY_ANNOTATION = "lab.deckhouse.io/delay-seconds"
FAILABLE = ("ApplyError", "DiscoveryFailed")
# A failed discovery is retried after this long, as the real controller requeues.
DISCOVERY_RETRY_SECONDS = 5.0
# The most a provider may ask user-authn to dawdle; a typo must not wedge a test for an hour.
MAX_DELAY_SECONDS = 600.0


@dataclass(frozen=True)
class Outcome:
    """What user-authn concluded about one provider: Ready's status, reason and message."""

    ready: bool
    reason: str
    message: str


def _spec(obj: Mapping) -> Mapping:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def parse_jwks(value: Any) -> tuple[dict | None, str]:
    """A JWK Set of public keys from a JSON text or an object; (None, why) when it is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            return None, f"jwks is not JSON ({e.msg} at position {e.pos})"
    if not isinstance(value, Mapping) or not isinstance(value.get("keys"), list):
        return None, 'jwks is not a JWK Set: expected a JSON object with a "keys" array (RFC 7517 §5)'
    if not value["keys"]:
        return None, "jwks has no keys: give at least one public key, or leave jwks empty to use discovery"
    for i, key in enumerate(value["keys"]):
        if not isinstance(key, Mapping):
            return None, f"jwks.keys[{i}] is not a JSON object"
        try:
            parsed = jwk.JWK(**key)
        except (JWException, ValueError, TypeError) as e:
            return None, f"jwks.keys[{i}] is not a valid JWK ({e})"
        if parsed.has_private:
            return None, f"jwks.keys[{i}] contains private key material: publish only public keys"
    return dict(value), ""


def spec_problem(obj: Mapping) -> str | None:
    """Why the provider's own spec cannot be applied (reason InvalidSpec), or None."""
    spec = _spec(obj)
    issuer = spec.get("issuer")
    if not isinstance(issuer, str) or not issuer:
        return "spec.issuer is required: set it to the URL of the token issuer (its `iss` claim)"
    parts = urllib.parse.urlsplit(issuer)
    if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        return f"spec.issuer {issuer!r} is not an https URL without query or fragment"
    prefix = spec.get("usernamePrefix")
    if not isinstance(prefix, str) or not prefix:
        return ("spec.usernamePrefix is required: without a prefix the issuer's subjects could name any user "
                "of this cluster")
    if prefix.startswith("system:"):
        return (f"spec.usernamePrefix {prefix!r} starts with system:, which kube-apiserver refuses in every "
                "username Dex issues; choose a prefix such as peering:<clusterpeer uid>:")
    audiences = spec.get("audiences", [])
    if audiences is not None and (not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences)):
        return "spec.audiences must be a list of strings"
    jwks = spec.get("jwks")
    if jwks not in (None, "", {}):
        keys, why = parse_jwks(jwks)
        if keys is None:
            return f"spec.jwks: {why}"
    return None


def _prefix(obj: Mapping) -> str:
    p = _spec(obj).get("usernamePrefix")
    return p if isinstance(p, str) else ""


def _age_key(obj: Mapping, seen_order: Mapping[str, int]) -> tuple:
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    # creationTimestamp has second resolution; the order in which the watch first saw objects breaks ties.
    return (meta.get("creationTimestamp") or "", seen_order.get(name, 1 << 62), name)


def prefix_conflicts(providers: Iterable[Mapping], seen_order: Mapping[str, int] = {}) -> dict[str, str]:
    """Map each provider whose usernamePrefix overlaps an older provider's to that older provider's name."""
    live = [p for p in providers if _prefix(p) and not p.get("metadata", {}).get("deletionTimestamp")]
    live.sort(key=lambda p: _age_key(p, seen_order))
    out: dict[str, str] = {}
    for i, newer in enumerate(live):
        a = _prefix(newer)
        for older in live[:i]:
            b = _prefix(older)
            if a.startswith(b) or b.startswith(a):
                out[newer["metadata"]["name"]] = older["metadata"]["name"]
                break
    return out


def forced_failure(obj: Mapping) -> str | None:
    value = (obj.get("metadata", {}).get("annotations") or {}).get(FAIL_ANNOTATION)
    return value if value in FAILABLE else None


def delay_seconds(obj: Mapping) -> float:
    raw = (obj.get("metadata", {}).get("annotations") or {}).get(DELAY_ANNOTATION)
    try:
        return min(max(float(raw), 0.0), MAX_DELAY_SECONDS) if raw is not None else 0.0
    except ValueError:
        return 0.0


def ready_condition(outcome: Outcome, generation: int, previous: Mapping | None, now: str) -> dict:
    """The Ready condition; lastTransitionTime moves only when the status does."""
    status = "True" if outcome.ready else "False"
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {
        "type": "Ready", "status": status, "reason": outcome.reason, "message": outcome.message,
        "observedGeneration": generation, "lastTransitionTime": since or now,
    }


def status_patch(obj: Mapping, outcome: Outcome, now: str) -> dict | None:
    """The new status for `obj`, or None when the stored one already says the same (nothing to write)."""
    status = obj.get("status") or {}
    generation = obj.get("metadata", {}).get("generation", 0)
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    previous = next((c for c in conditions if c.get("type") == "Ready"), None)
    ready = ready_condition(outcome, generation, previous, now)
    if previous is not None and all(previous.get(k) == ready[k] for k in ready if k != "lastTransitionTime") \
            and status.get("observedGeneration") == generation:
        return None
    others = [dict(c) for c in conditions if c.get("type") != "Ready"]
    return {**status, "conditions": others + [ready], "observedGeneration": generation}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class UserAuthn:
    """Watches TokenExchangeProviders on an in-process ApiServer and configures a Dex stand-in from them.

    `ssl_context` and `resolve` are used for discovery, so that lab issuers are reached by their real names.
    """

    def __init__(self, api: Any, dex: Dex, *, ssl_context: ssl.SSLContext | None = None,
                 resolve: Mapping[str, str] | None = None) -> None:
        self.api = api
        self.dex = dex
        self._ssl = ssl_context
        self._resolve = dict(resolve or {})
        self._seen: dict[str, int] = {}
        self._dirty: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._main: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self.synced = asyncio.Event()

    async def start(self) -> None:
        self._main = asyncio.create_task(self._run(), name="userauthn-watch")

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            from gateway.resolve import OverrideResolver

            connector = aiohttp.TCPConnector(resolver=OverrideResolver(self._resolve), ssl=self._ssl or True)
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    async def stop(self) -> None:
        tasks = [t for t in [self._main, *self._workers.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers.clear()
        self._main = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- watching ---

    def _kick(self, name: str) -> None:
        if name not in self._seen:
            self._seen[name] = len(self._seen)
        if name not in self._workers:
            self._dirty[name] = asyncio.Event()
            self._workers[name] = asyncio.create_task(self._worker(name), name=f"userauthn-{name}")
        self._dirty[name].set()

    def _kick_all(self) -> None:
        for name in list(self._workers):
            self._kick(name)

    def _forget(self, name: str) -> None:
        self.dex.remove_connector(name)
        task = self._workers.pop(name, None)
        self._dirty.pop(name, None)
        if task is not None:
            task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                try:
                    items = self.api.list(GROUP, PLURAL)
                except ApiError as e:
                    if e.code != 404:
                        raise
                    for name in list(self._workers):
                        self._forget(name)
                    await self._wait_for_crd()
                    continue
                names = {o["metadata"]["name"] for o in items}
                for gone in set(self._workers) - names:
                    self._forget(gone)
                for obj in sorted(items, key=lambda o: _age_key(o, self._seen)):
                    self._kick(obj["metadata"]["name"])
                rv = max((int(o["metadata"].get("resourceVersion", 0)) for o in items), default=None)
                self.synced.set()
                async for event, obj in self.api.watch(GROUP, PLURAL, resource_version=str(rv) if rv else None):
                    name = obj.get("metadata", {}).get("name")
                    if event == "ERROR" or not name:
                        break
                    if event == "DELETED":
                        self._forget(name)
                    else:
                        self._kick(name)
                    # One provider's prefix decides the others' conflicts; a re-check that finds
                    # nothing changed writes nothing.
                    self._kick_all()
                # The stream ended (its CRD was deleted, or the server closed it): list again.
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broken watch is relisted, as an informer does
                log.info("user-authn: watch of %s ended (%s); relisting", PLURAL, e)
            await asyncio.sleep(0.2)

    async def _wait_for_crd(self) -> None:
        """Return once the TokenExchangeProvider CRD is installed (the API server serves it at once)."""
        log.info("user-authn: the TokenExchangeProvider API is not served (CRD %s is not installed); waiting for "
                 "the CRD", CRD_NAME)
        async for event, obj in self.api.watch("apiextensions.k8s.io", "customresourcedefinitions"):
            if event != "DELETED" and obj.get("metadata", {}).get("name") == CRD_NAME:
                log.info("user-authn: CRD %s installed; serving TokenExchangeProviders", CRD_NAME)
                return

    async def _worker(self, name: str) -> None:
        event = self._dirty[name]
        while True:
            await event.wait()
            event.clear()
            obj = self._get(name)
            if obj is None:
                continue
            delay = delay_seconds(obj)
            if delay:
                # Changes arriving during the delay are applied together afterwards.
                await asyncio.sleep(delay)
                event.clear()
                obj = self._get(name)
                if obj is None:
                    continue
            try:
                outcome = await self.reconcile(obj)
                if outcome.reason == "DiscoveryFailed" and not forced_failure(obj):
                    asyncio.get_running_loop().call_later(DISCOVERY_RETRY_SECONDS, event.set)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("user-authn: provider %s: %s; retrying", name, e)
                asyncio.get_running_loop().call_later(1.0, event.set)

    def _get(self, name: str) -> dict | None:
        """The provider, or None when it or its whole API is gone (the watch then forgets it)."""
        try:
            return self.api.get(GROUP, PLURAL, name)
        except ApiError as e:
            if e.code != 404:
                raise
            return None

    # --- one provider ---

    async def decide(self, obj: Mapping) -> tuple[Outcome, dict | None]:
        """The outcome for `obj` and, when it is ready, the JWK Set Dex should use."""
        name = obj["metadata"]["name"]
        spec = _spec(obj)
        problem = spec_problem(obj)
        if problem:
            return Outcome(False, "InvalidSpec", problem), None
        older = prefix_conflicts(self.api.list(GROUP, PLURAL), self._seen).get(name)
        if older:
            return Outcome(False, "PrefixConflict",
                           f"usernamePrefix {spec['usernamePrefix']!r} overlaps that of TokenExchangeProvider "
                           f"{older!r}: choose a prefix that neither starts with nor is the start of another"), None
        forced = forced_failure(obj)
        if forced:
            return Outcome(False, forced, f"failing on purpose: annotation {FAIL_ANNOTATION}={forced} (lab only)"), None
        if spec.get("jwks") in (None, "", {}):
            keys, why = await self.discover(spec["issuer"])
            if keys is None:
                return Outcome(False, "DiscoveryFailed", why), None
        else:
            keys, _ = parse_jwks(spec["jwks"])
        return Outcome(True, "ProviderReady", f"Dex exchanges tokens of {spec['issuer']} through connector {name!r}"), keys

    async def reconcile(self, obj: Mapping) -> Outcome:
        name = obj["metadata"]["name"]
        outcome, keys = await self.decide(obj)
        if outcome.ready:
            try:
                spec = _spec(obj)
                self.dex.set_connector(name, spec["issuer"], keys, spec["usernamePrefix"])
            except Exception as e:
                outcome = Outcome(False, "ApplyError", f"Dex rejected connector {name!r}: {e}")
        if not outcome.ready:
            # A provider that is not ready must not be usable.
            self.dex.remove_connector(name)
        new_status = status_patch(obj, outcome, _now())
        if new_status is not None:
            body = {**obj, "status": new_status}
            try:
                self.api.update(body, subresource="status")
            except Exception as e:
                # A conflict means a newer version exists; its watch event brings us back.
                if getattr(e, "code", None) != 409:
                    raise
            log.info("user-authn: provider %s: %s %s", name, outcome.reason, outcome.message)
        return outcome

    async def discover(self, issuer: str) -> tuple[dict | None, str]:
        """The issuer's JWK Set through OIDC discovery, or (None, what went wrong)."""
        http = self._http()
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            async with http.get(url) as r:
                if r.status != 200:
                    return None, f"GET {url}: HTTP {r.status}"
                doc = await r.json(content_type=None)
            if not isinstance(doc, dict) or doc.get("issuer") != issuer:
                return None, f"GET {url}: the document's issuer is not {issuer!r}"
            jwks_uri = doc.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri.startswith("https://"):
                return None, f"GET {url}: no https jwks_uri in the document"
            async with http.get(jwks_uri) as r:
                if r.status != 200:
                    return None, f"GET {jwks_uri}: HTTP {r.status}"
                raw = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return None, f"discovery at {url} failed: {type(e).__name__}: {e}"
        keys, why = parse_jwks(raw)
        if keys is None:
            return None, f"GET {jwks_uri}: {why}"
        return keys, ""
