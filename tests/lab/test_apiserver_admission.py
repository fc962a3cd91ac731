"""Validating admission webhooks of the emulated kube-apiserver, through kubectl: a write that a
ValidatingWebhookConfiguration's rules match is sent as an AdmissionReview v1 to its webhook over real TLS before it
is stored; a denial is kubectl's error in kube-apiserver's words and stores nothing, warnings are kubectl's
warnings, an update and a delete carry the stored object, a webhook that cannot be called fails the write under
failurePolicy Fail and is skipped under Ignore, and a write the rules do not match is not sent."""

from __future__ import annotations

import base64

import pytest
from aiohttp import web

from lab import certs

CA = certs.CA("admission-test")


class Webhook:
    """A webhook on 127.0.0.1 that records each review and answers with `answer(request)`."""

    def __init__(self) -> None:
        self.reviews: list[dict] = []
        self.answer = lambda request: {"allowed": True}
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _review(self, http: web.Request) -> web.Response:
        review = await http.json()
        self.reviews.append(review["request"])
        response = {"uid": review["request"]["uid"], **self.answer(review["request"])}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/validate", self._review)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0,
                           ssl_context=certs.server_ssl_context(CA.issue_server([], ["127.0.0.1"])))
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()


@pytest.fixture
async def webhook():
    hook = Webhook()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


def configuration(url: str, policy: str = "Fail", resources=("configmaps",)) -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "example"},
            "webhooks": [{"name": "configmaps.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": policy, "timeoutSeconds": 2,
                          "clientConfig": {"url": url, "caBundle": base64.b64encode(CA.cert_pem).decode()},
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": list(resources),
                                     "operations": ["CREATE", "UPDATE", "DELETE"], "scope": "Namespaced"}]}]}


async def test_a_denial_is_kubectls_error_and_stores_nothing(lab, webhook):
    lab.server.create(configuration(f"https://127.0.0.1:{webhook.port}/validate"))
    webhook.answer = lambda r: {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "no"}}
    code, _, err = await lab.kubectl("-n", "default", "create", "configmap", "x", "--from-literal=a=b")
    assert code == 1
    assert 'admission webhook "configmaps.example.com" denied the request: no' in err
    assert lab.server.get("", "configmaps", "x", "default") is None
    [request] = webhook.reviews
    assert (request["operation"], request["name"], request["namespace"]) == ("CREATE", "x", "default")
    assert request["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert request["object"]["data"] == {"a": "b"} and request["oldObject"] is None
    assert request["userInfo"]["username"] == "lab-admin" and request["dryRun"] is False


async def test_warnings_reach_kubectl_and_updates_and_deletes_carry_the_stored_object(lab, webhook):
    lab.server.create(configuration(f"https://127.0.0.1:{webhook.port}/validate"))
    webhook.answer = lambda r: {"allowed": True, "warnings": [f"seen {r['operation']}"]}
    code, out, err = await lab.kubectl("-n", "default", "create", "configmap", "x", "--from-literal=a=b")
    assert code == 0 and "Warning: seen CREATE" in err
    code, _, err = await lab.kubectl("-n", "default", "patch", "configmap", "x", "--type=merge",
                                     "-p", '{"data":{"a":"c"}}')
    assert code == 0 and "Warning: seen UPDATE" in err
    update = webhook.reviews[-1]
    assert (update["oldObject"]["data"], update["object"]["data"]) == ({"a": "b"}, {"a": "c"})
    webhook.answer = lambda r: {"allowed": False, "status": {"message": "keep it"}}
    code, _, err = await lab.kubectl("-n", "default", "delete", "configmap", "x")
    # No reason from the webhook: none in the Status either, as kube-apiserver keeps it.
    assert code == 1 and 'Error from server: admission webhook "configmaps.example.com" denied the request: ' \
                         'keep it' in err
    delete = webhook.reviews[-1]
    assert delete["operation"] == "DELETE" and delete["object"] is None and delete["oldObject"]["data"] == {"a": "c"}
    assert lab.server.get("", "configmaps", "x", "default") is not None


@pytest.mark.parametrize(("policy", "stored"), [("Fail", False), ("Ignore", True)])
async def test_a_webhook_that_cannot_be_called(lab, policy, stored):
    lab.server.create(configuration("https://127.0.0.1:1/validate", policy))
    code, _, err = await lab.kubectl("-n", "default", "create", "configmap", "x", "--from-literal=a=b")
    assert (code == 0) is stored
    if not stored:
        assert 'Internal error occurred: failed calling webhook "configmaps.example.com": failed to call webhook: ' \
               'Post "https://127.0.0.1:1/validate?timeout=2s"' in err
    assert (lab.server.get("", "configmaps", "x", "default") is not None) is stored


async def test_a_write_the_rules_do_not_match_is_not_sent(lab, webhook):
    lab.server.create(configuration(f"https://127.0.0.1:{webhook.port}/validate", resources=("secrets",)))
    code, _, err = await lab.kubectl("-n", "default", "create", "configmap", "x", "--from-literal=a=b")
    assert code == 0, err
    assert webhook.reviews == []
