"""The real kube-apiserver, configured as Deckhouse configures it where it matters to the module.

One control plane (etcd, kube-apiserver, kube-controller-manager) serves the whole module; each test leaves it as
it found it, or uses names no other test uses.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import re
import time

import aiohttp
import pytest
import yaml
from real_support import kubectl

from lab import certs
from lab.real import ApplyError, config

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"
NAME_EXTRA = "user-authn.deckhouse.io/name"


async def whoami(plane, token: str) -> tuple[int, dict]:
    """SelfSubjectReview with a bearer token and no client certificate."""
    ctx = certs.client_ssl_context(plane.ca_pem)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{plane.url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                          headers={"Authorization": f"Bearer {token}"}, ssl=ctx) as r:
            return r.status, await r.json(content_type=None)


async def poll(check, timeout: float, what: str, interval: float = 0.2):
    """Await `check()` until it returns something true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(interval)


@pytest.fixture(scope="module")
def jwt_ready(plane, issuer):
    """kube-apiserver fetches the issuer's discovery and keys in the background: wait until a good token works."""
    async def wait():
        async def ok():
            status, _ = await whoami(plane, issuer.token())
            return status == 201
        await poll(ok, 30, "a good token from the loopback issuer being accepted")
    asyncio.run(wait())
    return issuer


def test_kubectl_version_reports_the_real_server(plane, binaries, tmp_path):
    out = kubectl(plane.admin_kubeconfig, tmp_path, "version", "-o", "json")
    assert out.returncode == 0, out.stderr
    server = json.loads(out.stdout)["serverVersion"]
    assert server["gitVersion"] == binaries.kube_version == "v1.37.2"
    assert (server["major"], server["minor"]) == ("1", "37")
    # The client is the venv's kubectl of the same minor version.
    assert json.loads(out.stdout)["clientVersion"]["minor"] == "37"


async def test_wait_ready_polls_readyz(plane):
    await plane.wait_ready(timeout=10)
    assert set(plane.pids()) == {"proxy", "etcd", "kube-apiserver", "kube-controller-manager"}


def test_startup_is_fast_enough_to_start_several(plane):
    # Measured from the first process to the controllers' /healthz; a suite starts several of these.
    assert plane.startup_seconds["total"] < 45, plane.startup_seconds


def test_client_certificate_admin_creates_a_namespace(plane, tmp_path):
    out = kubectl(plane.admin_kubeconfig, tmp_path, "create", "namespace", "made-by-admin")
    assert out.returncode == 0, out.stderr
    out = kubectl(plane.admin_kubeconfig, tmp_path, "get", "namespace", "made-by-admin", "-o", "json")
    assert json.loads(out.stdout)["status"]["phase"] == "Active"
    out = kubectl(plane.admin_kubeconfig, tmp_path, "auth", "whoami", "-o", "json")
    user = json.loads(out.stdout)["status"]["userInfo"]
    assert user["username"] == "admin" and "system:masters" in user["groups"]


async def test_a_client_certificate_without_bindings_is_refused_by_rbac(plane):
    nobody = plane.pki.client_ca.issue_client("nobody", ["some-team"])
    async with plane.session(nobody) as s:
        async with s.get("/api/v1/namespaces") as r:
            body = await r.json()
            assert r.status == 403 and body["reason"] == "Forbidden", body
            assert 'User "nobody" cannot list resource "namespaces"' in body["message"]


async def test_anonymous_reads_readyz_and_nothing_else(plane):
    ctx = certs.client_ssl_context(plane.ca_pem)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{plane.url}/readyz", ssl=ctx) as r:
            assert r.status == 200
        async with s.get(f"{plane.url}/api/v1/namespaces", ssl=ctx) as r:
            body = await r.json()
            assert r.status == 403 and 'User "system:anonymous"' in body["message"], body


async def test_a_good_dex_token_is_the_email_user_with_the_name_extra(plane, jwt_ready):
    status, body = await whoami(plane, jwt_ready.token())
    assert status == 201, body
    user = body["status"]["userInfo"]
    assert user["username"] == "peering:uuid-b:system:serviceaccount:d8-example:controller"
    assert set(user["groups"]) == {"peering:uuid-b", "system:authenticated"}
    assert user["extra"] == {NAME_EXTRA: ["controller of b"]}
    # kube-apiserver fetched both documents itself, through the lab's proxy, by the issuer's name.
    assert "/.well-known/openid-configuration" in jwt_ready.fetched and "/keys" in jwt_ready.fetched


async def test_the_optional_extras_come_along_when_present(plane, jwt_ready):
    status, body = await whoami(plane, jwt_ready.token(preferred_username="ctl",
                                                       federated_claims={"connector_id": "peering-b"}))
    assert status == 201, body
    assert body["status"]["userInfo"]["extra"] == {
        NAME_EXTRA: ["controller of b"], "user-authn.deckhouse.io/preferred_username": ["ctl"],
        "user-authn.deckhouse.io/dex-provider": ["peering-b"]}


class ApiserverLog:
    """kube-apiserver's log from now on: each refusal says why there, while the client only gets 401."""

    def __init__(self, plane) -> None:
        self.path = plane.files.log("kube-apiserver")
        self.offset = self.path.stat().st_size

    async def says(self, fragment: str) -> None:
        async def found():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return fragment in f.read().decode(errors="replace")
        await poll(found, 10, f"kube-apiserver logging {fragment!r}", interval=0.05)


@pytest.mark.parametrize("claims, drop, reason", [
    ({"aud": "dex-client-peering@d8-peering"}, (),  # what Dex sets without the cross-client scope
     'expected audience \\"kubernetes\\" got [\\"dex-client-peering@d8-peering\\"]'),
    ({"aud": ["peering", "other"]}, (), 'expected audience \\"kubernetes\\" got [\\"peering\\" \\"other\\"]'),
    ({"email": "system:admin"}, (), "username cannot used reserved system: prefix"),
    ({"groups": ["peering:uuid-b", "system:masters"]}, (), "groups cannot used reserved system: prefix"),
    ({}, ("name",), "expression 'claims.name' resulted in error: no such key: name"),
    ({"email_verified": False}, (), "oidc: email not verified"),
    ({}, ("email",), 'parse username claims \\"email\\": claim not present'),
    ({"exp": int(time.time()) - 120, "iat": int(time.time()) - 900}, (), "oidc: token is expired"),
    # No authenticator claims another issuer's tokens: nothing more to say than that.
    ({"iss": "https://dex.b.lab"}, (), 'err="invalid bearer token"'),
], ids=["client-audience", "no-kubernetes-audience", "system-username", "system-group", "no-name",
        "email-not-verified", "no-email", "expired", "other-issuer"])
async def test_tokens_deckhouse_refuses_are_refused(plane, jwt_ready, claims, drop, reason):
    log = ApiserverLog(plane)
    status, body = await whoami(plane, jwt_ready.token(drop=drop, **claims))
    assert status == 401 and body["reason"] == "Unauthorized", body
    await log.says(reason)


async def test_a_token_signed_by_another_key_is_refused(plane, jwt_ready):
    from jwcrypto import jwk, jwt

    other = jwk.JWK.generate(kty="RSA", size=2048, kid=jwt_ready.key.kid, alg="RS256")
    forged = jwt.JWT(header={"alg": "RS256", "kid": other.kid},
                     claims=json.loads(jwt.JWT(jwt=jwt_ready.token(), key=jwt_ready.key).claims))
    forged.make_signed_token(other)
    log = ApiserverLog(plane)
    status, _ = await whoami(plane, forged.serialize())
    assert status == 401
    await log.says("failed to verify signature")


async def test_token_request_issues_tokens_of_the_shared_issuer(plane):
    await plane.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tokens"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot", "namespace": "tokens"}},
    ])
    token = await plane.service_account_token("tokens", "robot", seconds=600)
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["iss"] == config.SERVICE_ACCOUNT_ISSUER
    assert claims["aud"] == [config.SERVICE_ACCOUNT_ISSUER]  # --api-audiences
    assert claims["sub"] == "system:serviceaccount:tokens:robot"
    assert 590 <= claims["exp"] - claims["iat"] <= 600

    status, body = await whoami(plane, token)
    assert status == 201, body
    assert body["status"]["userInfo"]["username"] == "system:serviceaccount:tokens:robot"

    # A token for another audience is not one for this API server, but TokenReview says whose it is.
    other = await plane.service_account_token("tokens", "robot", seconds=600, audiences=["peering.example"])
    assert (await whoami(plane, other))[0] == 401
    async with plane.session() as s:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": other, "audiences": ["peering.example"]}}
        async with s.post("/apis/authentication.k8s.io/v1/tokenreviews", json=review) as r:
            status = (await r.json())["status"]
            assert status["authenticated"] is True and status["audiences"] == ["peering.example"]
            assert status["user"]["username"] == "system:serviceaccount:tokens:robot"


async def test_a_client_certificate_wins_over_a_bearer_token(plane):
    await plane.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tokens"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot", "namespace": "tokens"}},
    ])
    token = await plane.service_account_token("tokens", "robot", seconds=600)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}

    async def user(session):
        async with session.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", json=review) as r:
            return (await r.json())["status"]["userInfo"]["username"]
    async with plane.session(token=token) as s:
        assert await user(s) == "system:serviceaccount:tokens:robot"
    # The same token beside the admin's certificate is not looked at: the request is the admin's.
    connector = aiohttp.TCPConnector(ssl=plane.ssl_context(plane.pki.admin))
    async with aiohttp.ClientSession(base_url=plane.url, connector=connector,
                                     headers={"Authorization": f"Bearer {token}"}) as s:
        assert await user(s) == "admin"
    with pytest.raises(ValueError, match="a client certificate or a token, not both"):
        async with plane.session(plane.pki.admin, token=token):
            pass


async def test_a_token_request_for_a_missing_service_account_is_a_clear_error(plane):
    with pytest.raises(ApplyError, match=r"TokenRequest for tokens/ghost refused \(404\)"):
        await plane.service_account_token("tokens", "ghost")


async def test_the_garbage_collector_deletes_an_owned_object_after_its_owner(plane):
    (owner,) = await plane.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "gc-owner", "namespace": "default"}}])
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-owner", "uid": owner["metadata"]["uid"]}
    await plane.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "gc-owned", "namespace": "default", "ownerReferences": [ref]}}])
    async with plane.session() as s:
        async with s.delete("/api/v1/namespaces/default/configmaps/gc-owner") as r:
            assert r.status == 200

        async def owned_gone():
            async with s.get("/api/v1/namespaces/default/configmaps/gc-owned") as r:
                return r.status == 404
        await poll(owned_gone, 30, "the garbage collector deleting default/gc-owned")


async def test_foreground_deletion_waits_for_the_dependents(plane):
    (owner,) = await plane.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "fg-owner", "namespace": "default"}}])
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "fg-owner", "uid": owner["metadata"]["uid"],
           "blockOwnerDeletion": True}
    await plane.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "fg-owned", "namespace": "default", "ownerReferences": [ref]}}])
    async with plane.session() as s:
        async with s.delete("/api/v1/namespaces/default/configmaps/fg-owner",
                            json={"propagationPolicy": "Foreground"}) as r:
            body = await r.json()
            assert r.status == 200 and "foregroundDeletion" in body["metadata"]["finalizers"], body

        async def both_gone():
            codes = []
            for name in ("fg-owned", "fg-owner"):
                async with s.get(f"/api/v1/namespaces/default/configmaps/{name}") as r:
                    codes.append(r.status)
            return codes == [404, 404]
        await poll(both_gone, 30, "foreground deletion of default/fg-owner and its dependent")


async def test_a_deleted_namespace_is_emptied_and_finalized(plane):
    await plane.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "content", "namespace": "doomed"}},
    ])
    async with plane.session() as s:
        async with s.delete("/api/v1/namespaces/doomed") as r:
            body = await r.json()
            assert r.status == 200 and body["status"]["phase"] == "Terminating", body
        async with s.post("/api/v1/namespaces/doomed/configmaps",
                          json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}) as r:
            body = await r.json()
            assert r.status == 403 and "is being terminated" in body["message"], body

        async def gone():
            async with s.get("/api/v1/namespaces/doomed") as r:
                return r.status == 404
        await poll(gone, 60, "the namespace controller finalizing namespace doomed")


async def test_owner_references_permission_enforcement_is_on(plane):
    """A user who may create ConfigMaps but not update the owner's finalizers cannot block its deletion."""
    await plane.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "orpe"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": "orpe"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "cm-writer", "namespace": "orpe"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "cm-writer", "namespace": "orpe"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-writer"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "writer"}]},
    ])
    async with plane.session() as s:
        async with s.get("/api/v1/namespaces/orpe/configmaps/owner") as r:
            uid = (await r.json())["metadata"]["uid"]
    writer = plane.pki.client_ca.issue_client("writer")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    async with plane.session(writer) as s:
        async def create(name, blocking):
            obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": name, "ownerReferences": [dict(ref, blockOwnerDeletion=blocking)]}}
            async with s.post("/api/v1/namespaces/orpe/configmaps", json=obj) as r:
                return r.status, await r.json()

        status, body = await create("plain", False)
        assert status == 201, body
        status, body = await create("blocking", True)
        assert status == 403 and body["reason"] == "Forbidden", body
        assert "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers " \
               "on" in body["message"], body


def test_a_stock_kube_apiserver_refuses_the_sensitive_marker(plane, tmp_path):
    # Deckhouse's x-kubernetes-sensitive-data is its own patch of kube-apiserver. A stock one refuses the CRD as it
    # is: kubectl's default strict field validation, and server-side apply (which cannot type the unknown key).
    out = kubectl(plane.admin_kubeconfig, tmp_path, "apply", "-f", str(CHART_CRDS / "clusterpeer.yaml"))
    assert out.returncode != 0
    assert re.search(r'strict decoding error: unknown field "spec\.versions\[\d+\]\.schema\.openAPIV3Schema\.'
                     r'[^"]*\.x-kubernetes-sensitive-data"', out.stderr), out.stderr
    with pytest.raises(ApplyError, match=r"x-kubernetes-sensitive-data: field not declared in schema"):
        asyncio.run(plane.install_crds([CHART_CRDS / "clusterpeer.yaml"], strip_keys=()))


async def test_the_module_crds_go_through_the_real_validation(plane):
    stripped = await plane.install_crds([CHART_CRDS])
    assert stripped and all(p.endswith("/x-kubernetes-sensitive-data") for p in stripped)
    served = {}
    for doc in yaml.safe_load_all((CHART_CRDS / "clusterpeer.yaml").read_text()):
        if doc:
            served = doc
    group, plural = served["spec"]["group"], served["spec"]["names"]["plural"]
    version = next(v["name"] for v in served["spec"]["versions"] if v.get("storage"))
    async with plane.session() as s:
        async with s.get(f"/apis/{group}/{version}/{plural}") as r:
            assert r.status == 200, await r.text()
        # The real schema validation, not ours: a spec that is not an object is refused with the field named.
        bad = {"apiVersion": f"{group}/{version}", "kind": served["spec"]["names"]["kind"],
               "metadata": {"name": "not-an-object"}, "spec": "a string"}
        async with s.post(f"/apis/{group}/{version}/{plural}", json=bad) as r:
            body = await r.json()
            assert r.status == 422 and body["reason"] == "Invalid", body
            assert any(c["field"] == "spec" for c in body["details"]["causes"]), body


async def test_apply_names_an_unknown_kind(plane):
    with pytest.raises(ApplyError, match="not served by a's kube-apiserver.*install its CRD first"):
        await plane.apply([{"apiVersion": "nothing.example/v1", "kind": "Thing", "metadata": {"name": "x"}}])
    with pytest.raises(ApplyError, match="ConfigMap x is namespaced: give metadata.namespace"):
        await plane.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}])


def test_every_process_binds_loopback_only(plane):
    listening = set()
    pids = set(plane.pids().values())
    for pid in pids:
        for inode in _socket_inodes(pid):
            listening.add(inode)
    addrs = _listening_addresses(listening)
    assert addrs, "found none of the control plane's listening sockets"
    assert all(a.startswith("127.0.0.1:") for a in addrs), addrs


def _socket_inodes(pid: int) -> set[str]:
    fd_dir = pathlib.Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _listening_addresses(inodes: set[str]) -> list[str]:
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                host, port = f[1].split(":")
                if len(host) == 8:
                    ip = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "[" + host + "]"
                out.append(f"{ip}:{int(port, 16)}")
    return out
