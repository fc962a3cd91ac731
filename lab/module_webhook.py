"""The ModuleConfig webhook of the lab's module manager: Deckhouse's `module-configs.deckhouse-webhook.deckhouse.io`
(deckhouse-controller's moduleConfigValidationHandler), which kube-apiserver asks before it stores a ModuleConfig.

`verdict` is the decision, a plain function of the write and of what the module manager knows (`Known`); in its
order and its words:

- disabling an enabled module whose module.yaml has `disable.confirmation: true` (a create or update to
  `enabled: false`, or the delete of an enabled config) without the annotation `modules.deckhouse.io/allow-disabling`
  (on the new or the old object) is refused: the module's `disable.messages.en` and "Please annotate ModuleConfig
  with `modules.deckhouse.io/allow-disabling=true` if you're sure that you want to disable the module.";
- enabling a module whose `requirements.modules` are not enabled is refused: "1 error occurred: 'user-authn' is not
  deployed"; enabling (on create) a module there is no Module of is refused: "the 'x' module not found";
- `source: Embedded` is refused; a module there is no Module of is let through with the warning "the 'x' module not
  found" and nothing more checked;
- `spec.settings` without `spec.version` is refused, an unknown version with settings too; settings of a config that
  does not disable the module are checked with their defaults against the module's schema (config-values.yaml):
  "spec.settings are not valid (version 1): 1 error occurred: * peering.<setting> in body should ...".

A refusal is 422 Invalid with that message (Deckhouse rewrites its webhook's 400 so that `kubectl edit` reopens);
kube-apiserver puts `admission webhook "module-configs.deckhouse-webhook.deckhouse.io" denied the request: ` before
it. `WebhookServer` serves the verdicts over HTTPS on 127.0.0.1, on a thread of its own: a write the lab makes
through a real kube-apiserver from its event loop must not wait for that same loop to answer the webhook.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from aiohttp import web

from lab import deckhouse_module

WEBHOOK_NAME = "module-configs.deckhouse-webhook.deckhouse.io"
CONFIGURATION_NAME = "deckhouse-webhook"
PATH = "/validate/v1alpha1/module-configs"
ALLOW_DISABLING = "modules.deckhouse.io/allow-disabling"
DISABLE_SUFFIX = ("Please annotate ModuleConfig with `modules.deckhouse.io/allow-disabling=true` if you're sure that "
                  "you want to disable the module.")
GLOBAL = "global"


@dataclass(frozen=True)
class Known:
    """What the module manager knows when it judges a write: each module's module.yaml and settings schema (with
    its known settings versions), the modules enabled now, and the Module objects that exist."""

    definitions: Mapping[str, dict] = field(default_factory=dict)
    schemas: Mapping[str, dict] = field(default_factory=dict)
    enabled: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    versions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


def _annotated(cfg: Mapping | None) -> bool:
    return ALLOW_DISABLING in (((cfg or {}).get("metadata") or {}).get("annotations") or {})


def enabled_value(cfg: Mapping | None) -> bool | None:
    """`spec.enabled` of a ModuleConfig: True, False, or None when it does not say."""
    value = ((cfg or {}).get("spec") or {}).get("enabled")
    return value if isinstance(value, bool) else None


def disable_message(definition: Mapping) -> str | None:
    """The refusal of a disable without the annotation, or None when module.yaml asks no confirmation."""
    options = definition.get("disable") or {}
    if options.get("confirmation") is not True:
        return None
    reason = ((options.get("messages") or {}).get("en") or options.get("message") or "").strip()
    if not reason.endswith("."):
        reason += "."
    return f"{reason} {DISABLE_SUFFIX}"


def unmet_requirements(definition: Mapping, enabled: frozenset[str]) -> list[str]:
    """The modules of `requirements.modules` that are not enabled, as Deckhouse's enabling check names them."""
    needed = ((definition.get("requirements") or {}).get("modules") or {})
    return [f"'{name}' is not deployed" for name in sorted(needed) if name not in enabled]


def deckhouse_errors(problems: list[str]) -> str:
    """Deckhouse's own multierror format: `1 error occurred: a`, `2 errors occurred: a; b`."""
    if len(problems) == 1:
        return f"1 error occurred: {problems[0]}"
    return f"{len(problems)} errors occurred: {'; '.join(sorted(problems))}"


def settings_verdict(name: str, cfg: Mapping, known: Known) -> Verdict:
    """Deckhouse's configtools.Validator: the version, then the settings with their defaults against the schema."""
    spec = cfg.get("spec") or {}
    settings = spec.get("settings")
    version = spec.get("version") or 0
    if not version:
        if settings:
            return Verdict(False, "spec.version is required when spec.settings are specified")
        return Verdict(True)
    versions = known.versions.get(name, (1,))
    latest = max(versions)
    warnings: list[str] = []
    if not settings:
        warnings.append("spec.version has no effect without spec.settings, defaults from the latest version of "
                        "settings schema will be applied")
    if version not in versions:
        older = ", ".join(str(v) for v in sorted(versions) if v != latest)
        message = f"spec.version={version:g} is unsupported. Use latest version {latest}" + (
            f", or one of previous versions: {older}" if older else "")
        if settings:
            return Verdict(False, message)
        return Verdict(True, warnings=tuple(warnings + [message]))
    if version != latest:
        warnings.append(f"spec.version={version:g} is obsolete. Please migrate spec.settings to the latest version "
                        f"{latest}")
    schema = known.schemas.get(name)
    if schema is None or enabled_value(cfg) is False:
        return Verdict(True, warnings=tuple(warnings))
    values = deckhouse_module.with_defaults(schema, settings or {})
    problems = deckhouse_module.openapi_errors(schema, values, values_key(name))
    if problems:
        return Verdict(False, f"spec.settings are not valid (version {version:g}): "
                              f"{deckhouse_module.multierror_text(problems)}")
    return Verdict(True, warnings=tuple(warnings))


def values_key(name: str) -> str:
    """The module's values key: its name in camelCase (user-authn -> userAuthn), as addon-operator names it."""
    head, *rest = name.split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def verdict(operation: str, cfg: Mapping, old: Mapping | None, known: Known) -> Verdict:
    """Whether kube-apiserver may store this write of a ModuleConfig (`cfg`: the object written, or for a DELETE
    the object deleted; `old`: the stored one of an UPDATE)."""
    name = (cfg.get("metadata") or {}).get("name", "")
    definition = known.definitions.get(name) or {}
    confirm = disable_message(definition) if name in known.definitions else None
    new_enabled = enabled_value(cfg) is True
    if operation == "DELETE":
        if confirm and not _annotated(cfg) and new_enabled:
            return Verdict(False, confirm)
        return Verdict(True)
    if operation == "CREATE":
        if confirm and not _annotated(cfg) and enabled_value(cfg) is False and name in known.enabled:
            return Verdict(False, confirm)
        if new_enabled:
            unmet = unmet_requirements(definition, known.enabled)
            if unmet:
                return Verdict(False, deckhouse_errors(unmet))
            if name != GLOBAL and name not in known.modules:
                return Verdict(False, f"the '{name}' module not found")
    elif operation == "UPDATE":
        was_enabled = enabled_value(old) is True
        if not was_enabled and new_enabled:
            unmet = unmet_requirements(definition, known.enabled)
            if unmet:
                return Verdict(False, deckhouse_errors(unmet))
        disabling = not new_enabled and (was_enabled or name in known.enabled)
        if confirm and disabling and not _annotated(cfg) and not _annotated(old):
            return Verdict(False, confirm)
    else:
        return Verdict(False, f"operation '{operation}' is not applicable")
    if (cfg.get("spec") or {}).get("source") == "Embedded":
        return Verdict(False, "'Embedded' is a forbidden source")
    if name != GLOBAL and name not in known.modules:
        return Verdict(True, warnings=(f"the '{name}' module not found",))
    return settings_verdict(name, cfg, known)


def review_response(review: Mapping, known: Known) -> dict:
    """The AdmissionReview answering `review`."""
    request = review.get("request") or {}
    cfg = request.get("object") or request.get("oldObject") or {}
    result = verdict(request.get("operation", ""), cfg, request.get("oldObject"), known)
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": result.allowed}
    if not result.allowed:
        response["status"] = {"status": "Failure", "reason": "Invalid", "code": 422, "message": result.message}
    if result.warnings:
        response["warnings"] = list(result.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookServer:
    """The webhook over HTTPS on 127.0.0.1 (a port from the OS), on a thread and event loop of its own. `known` is
    replaced whole by the module manager whenever what it knows changes."""

    def __init__(self, ssl_context) -> None:
        self.known = Known()
        self.port = 0
        self._ssl = ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{PATH}"

    async def _review(self, request: web.Request) -> web.Response:
        try:
            review = await request.json()
        except ValueError:
            response = web.json_response({"message": "the body is not an AdmissionReview"}, status=400)
        else:
            response = web.json_response(review_response(review if isinstance(review, dict) else {}, self.known))
        # One review a connection: no connection is left idle for the shutdown to cut, on this thread's loop.
        response.force_close()
        return response

    async def _serve(self, started: asyncio.Future) -> None:
        app = web.Application()
        app.router.add_post(PATH, self._review)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]
        started.get_loop().call_soon_threadsafe(started.set_result, None)

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_forever()
        # What the shutdown left to do (the closed connections' callbacks) runs before the loop closes.
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def start(self) -> None:
        started = asyncio.get_running_loop().create_future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._thread_main, args=(self._loop,), name="module-webhook",
                                        daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(started), self._loop)
        await asyncio.wait_for(started, 30)

    async def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._runner is not None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop))
            self._runner = None
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(self._thread.join, 10)

    def configuration(self, ca_pem: bytes) -> dict:
        """The ValidatingWebhookConfiguration that sends every ModuleConfig write here."""
        import base64

        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": CONFIGURATION_NAME, "labels": {"heritage": "deckhouse"}},
                "webhooks": [{"name": WEBHOOK_NAME, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                              "failurePolicy": "Fail", "timeoutSeconds": 10,
                              "clientConfig": {"url": self.url, "caBundle": base64.b64encode(ca_pem).decode()},
                              "rules": [{"apiGroups": ["deckhouse.io"], "apiVersions": ["*"],
                                         "operations": ["CREATE", "UPDATE", "DELETE"],
                                         "resources": ["moduleconfigs"], "scope": "Cluster"}]}]}
