"""Validating admission webhooks, as kube-apiserver calls them: the ValidatingWebhookConfigurations stored here
(admissionregistration.k8s.io/v1) name, per webhook, the writes it sees (`rules`: operations, groups, versions,
resources with their subresources, scope) and where to send them (`clientConfig.url` over HTTPS, trusting
`clientConfig.caBundle`). A write over HTTP that a webhook's rules match is sent to it as an AdmissionReview v1,
after the object was decoded, defaulted and validated, before it is stored:

- `allowed: false` refuses the write with the webhook's `status` (its code, 400 when it gives none or one below
  400; its reason; its message after `admission webhook "<name>" denied the request: `);
- `warnings` become `Warning` headers of the answer;
- no answer (refused connection, TLS, timeout after `timeoutSeconds`, 10 by default, or an answer that is not an
  AdmissionReview) is 500 `Internal error occurred: failed calling webhook "<name>": failed to call webhook: ...`
  under `failurePolicy: Fail` (the default), and lets the write through under `Ignore`.

`namespaceSelector`, `objectSelector` and `matchConditions` are not evaluated: every matching write is sent, which
only asks a webhook more than kube-apiserver would. Writes made in-process (`ApiServer.create`...) are the lab's own
and are not sent, as they are not HTTP writes (hooks.py says the same of the write hooks).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import uuid
from dataclasses import dataclass

import aiohttp

from lab.apiserver import errors
from lab.apiserver.resources import ResourceInfo

GROUP = "admissionregistration.k8s.io"
PLURAL = "validatingwebhookconfigurations"
KEY = (GROUP, PLURAL)
DEFAULT_TIMEOUT = 10
# What kube-apiserver names each verb in a review.
OPERATIONS = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


@dataclass(frozen=True)
class Webhook:
    """One webhook of a ValidatingWebhookConfiguration."""

    name: str
    url: str
    ca_pem: bytes | None
    rules: tuple[dict, ...]
    failure_policy: str
    timeout: float

    def matches(self, operation: str, res: ResourceInfo, subresource: str | None) -> bool:
        resource = res.plural + (f"/{subresource}" if subresource else "")
        scope = "Namespaced" if res.namespaced else "Cluster"
        for rule in self.rules:
            ops = rule.get("operations") or []
            if "*" not in ops and operation not in ops:
                continue
            if not _listed(rule.get("apiGroups"), res.group) or not _listed(rule.get("apiVersions"), res.version):
                continue
            if rule.get("scope", "*") not in ("*", scope):
                continue
            for wanted in rule.get("resources") or []:
                main, _, sub = wanted.partition("/")
                if main in ("*", res.plural) and (sub == (subresource or "") or (sub == "*" and subresource)):
                    return True
                if wanted == resource:
                    return True
        return False


def _listed(values, value: str) -> bool:
    values = values or []
    return "*" in values or value in values


def webhooks_of(configurations: list[dict]) -> list[Webhook]:
    """The webhooks of the stored configurations, in the order kube-apiserver calls them (by configuration name)."""
    out = []
    for cfg in sorted(configurations, key=lambda c: c["metadata"]["name"]):
        for hook in cfg.get("webhooks") or []:
            client = hook.get("clientConfig") or {}
            ca = client.get("caBundle")
            out.append(Webhook(
                name=hook.get("name", ""), url=client.get("url", ""),
                ca_pem=base64.b64decode(ca) if ca else None, rules=tuple(hook.get("rules") or ()),
                failure_policy=hook.get("failurePolicy") or "Fail",
                timeout=float(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT)))
    return out


def review_request(operation: str, res: ResourceInfo, subresource: str | None, user, name: str,
                   namespace: str | None, obj: dict | None, old: dict | None, dry_run: bool) -> dict:
    """The AdmissionReview v1 kube-apiserver sends for one write."""
    gvk = {"group": res.group, "version": res.version, "kind": res.kind}
    gvr = {"group": res.group, "version": res.version, "resource": res.plural}
    request = {
        "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": name, "operation": operation,
        "userInfo": {"username": user.username, **({"uid": user.uid} if getattr(user, "uid", "") else {}),
                     "groups": list(user.groups)},
        "object": obj, "oldObject": old, "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": OPTIONS_KIND[operation]},
    }
    if subresource:
        request["subResource"] = subresource
    if namespace:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


class CallFailed(errors.ApiError):
    """No usable answer came from a webhook: what `failurePolicy` decides about."""


def _failed_call(hook: Webhook, why: str) -> CallFailed:
    return CallFailed(500, "InternalError", f'Internal error occurred: failed calling webhook "{hook.name}": '
                                            f'failed to call webhook: Post "{hook.url}?timeout={int(hook.timeout)}s": '
                                            f'{why}')


def verdict(hook: Webhook, review: dict, uid: str) -> list[str]:
    """The warnings of an allowing answer; raises the refusal of a denying one, or the call's failure when the
    answer is not a review of this request."""
    response = review.get("response") if isinstance(review, dict) else None
    if not isinstance(response, dict) or response.get("uid") != uid:
        raise _failed_call(hook, "the response is not an AdmissionReview answering this request")
    warnings = [w for w in response.get("warnings") or [] if isinstance(w, str)]
    if response.get("allowed") is True:
        return warnings
    status = response.get("status") if isinstance(response.get("status"), dict) else {}
    code = status.get("code") if isinstance(status.get("code"), int) and status["code"] >= 400 else 400
    denied = f'admission webhook "{hook.name}" denied the request'
    message = status.get("message") or status.get("reason")
    # kube-apiserver keeps the webhook's reason as it is, none included.
    raise errors.ApiError(code, status.get("reason") or None,
                          f"{denied}: {message}" if message else f"{denied} without explanation",
                          status.get("details") if isinstance(status.get("details"), dict) else None)


async def call(hook: Webhook, review: dict) -> dict:
    """POST the review to the webhook; the answer as JSON, or the call's failure."""
    if not hook.url.startswith("https://"):
        raise _failed_call(hook, "the webhook's URL is not https")
    context = ssl.create_default_context(cadata=hook.ca_pem.decode()) if hook.ca_pem else ssl.create_default_context()
    url = f"{hook.url}?timeout={int(hook.timeout)}s"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=hook.timeout)) as session:
            async with session.post(url, json=review, ssl=context) as resp:
                if resp.status != 200:
                    raise _failed_call(hook, f"the server answered HTTP {resp.status}")
                return await resp.json(content_type=None)
    except CallFailed:
        raise
    except asyncio.TimeoutError:
        raise _failed_call(hook, "context deadline exceeded") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise _failed_call(hook, str(exc) or type(exc).__name__) from None


async def admit(hooks: list[Webhook], review: dict) -> list[str]:
    """Send `review` to each webhook in turn; their warnings, or the first refusal (or failure) raised."""
    warnings: list[str] = []
    uid = review["request"]["uid"]
    for hook in hooks:
        try:
            answer = await call(hook, review)
            warnings += verdict(hook, answer, uid)
        except CallFailed:
            if hook.failure_policy == "Ignore":
                continue
            raise
    return warnings
