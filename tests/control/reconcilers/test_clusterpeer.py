"""The reconcilers of a `Runtime` in this process against one lab cluster (no peer): invitations, spec errors,
capability validation, joins that cannot happen, and no writes in a steady state. The runtime's clock is a fake
one: time moves when a test says so, and a steady state is shown by passes that write nothing, not by waiting."""

from __future__ import annotations

import datetime
import hashlib
import sys
import pathlib

import pytest
import pytest_asyncio

from control import connstring
from control.config import ControlSettings, KubeSettings, Settings
from control.kube import KubeSession
from control.process import Runtime
from gateway.resolve import OverrideResolver
from lab.testing import apiserver_backends, lab_clusters
from tests.control.conftest import FakeClock

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "e2e"))
from peering_lab import (API_VERSION, GROUP, clusterpeer, condition, connection_string, create_invite,  # noqa: E402
                         create_join, ready, until, until_equal)

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Sink:
    """Stands for the gateway: the runtime publishes registries and certificates into it."""

    def __init__(self) -> None:
        self.registry = None

    def publish(self, registry) -> None:
        self.registry = registry

    def reload_certificates(self, **certs) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def world(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["x"], peering_command=None,
                            apiserver=request.param) as lab:
        x = lab["x"]
        resolve = x.process_resolve()
        settings = Settings(public_domain_template="%s.x.lab",
                            kube=KubeSettings(kubeconfig=str(x.path("peering-kubeconfig")), namespace="d8-peering"),
                            control=ControlSettings(peer_sync_interval=1.0, selfcheck_interval=1.0),
                            resolve=resolve)
        resolver = OverrideResolver(resolve)
        kube = await KubeSession.connect(settings.kube.kubeconfig, resolver=resolver)
        runtime = Runtime(settings, kube, Sink(), clock=FakeClock())
        await runtime.start()
        try:
            await until(lambda: runtime.controller.leading, what="the Lease")
            yield x, runtime
        finally:
            await runtime.stop()
            await kube.close()
            await resolver.close()


def _writes(runtime) -> dict:
    return {k: v for k, v in runtime.kube.write_counts.items() if k[1] != "leases"}


async def _pass(runtime, reconciler: str, key: str) -> None:
    """Queue `key` and wait until a pass of it has run to its end."""
    runner = next(r for r in runtime.controller.runners if r.reconciler.name == reconciler)
    before = runner.reconciles
    runtime.ctx.enqueue(reconciler, key)
    await until(lambda: runner.reconciles > before and key not in runner.queue.processing,
                what=f"a {reconciler} pass of {key}")


async def _quiet(runtime, reconciler: str, key: str) -> dict:
    """Passes until one writes nothing (the caches caught up with the earlier writes); the writes so far."""
    for _ in range(20):
        before = _writes(runtime)
        await _pass(runtime, reconciler, key)
        if _writes(runtime) == before:
            return before
    raise AssertionError(f"{reconciler} {key} writes on every pass: {_writes(runtime)}")


async def test_invite_gets_a_connection_string_and_then_nothing_is_written(world):
    x, runtime = world
    create_invite(x, "inv", tokenTTL="1h")
    text = await connection_string(x, "inv")
    now = datetime.datetime.now(datetime.timezone.utc)
    inv = connstring.decode(text, now=now)
    status = clusterpeer(x, "inv")["status"]
    assert status["invite"]["tokenID"] == inv.token_id
    assert status["invite"]["tokenHash"] == hashlib.sha256(inv.token_secret.encode()).hexdigest()
    assert status["invite"]["used"] is False
    expires = datetime.datetime.fromisoformat(status["invite"]["expiresAt"].replace("Z", "+00:00"))
    assert abs((expires - now) - datetime.timedelta(hours=1)) < datetime.timedelta(seconds=10)
    assert inv.join_url == "https://peering.x.lab" and inv.entrance_host == "peering-gateway.x.lab"
    assert ready(clusterpeer(x, "inv")) == ("Pending", "False", "InvitePending")
    assert status["observedGeneration"] == clusterpeer(x, "inv")["metadata"]["generation"]
    # The self-check found no entrance (no gateway in this lab): it says so rather than guessing, once probes
    # over a self-check interval of the clock confirmed it.
    for _ in range(5):
        if condition(clusterpeer(x, "inv"), "ClientCertEnforced").get("reason") == "EntranceUnreachable":
            break
        runtime.ctx.clock.advance(1.0)
        await _pass(runtime, "clusterpeer", "inv")
    assert condition(clusterpeer(x, "inv"), "ClientCertEnforced").get("reason") == "EntranceUnreachable"
    # The secret never reaches a condition.
    assert inv.token_secret not in str(status["conditions"])
    before = await _quiet(runtime, "clusterpeer", "inv")
    await _pass(runtime, "clusterpeer", "inv")
    runtime.ctx.clock.advance(2.5)  # more than two self-check intervals and requeues
    await _pass(runtime, "clusterpeer", "inv")
    await _pass(runtime, "grants", "inv")
    assert _writes(runtime) == before


async def test_expired_unused_string_is_replaced(world):
    x, _ = world
    create_invite(x, "renewed", tokenTTL="10m")
    await connection_string(x, "renewed")
    obj = clusterpeer(x, "renewed")
    old_id = obj["status"]["invite"]["tokenID"]
    obj["status"]["invite"]["expiresAt"] = "2020-01-01T00:00:00Z"
    x.api.update(obj, subresource="status")
    await until(lambda: clusterpeer(x, "renewed")["status"]["invite"]["tokenID"] != old_id, what="a new string")
    inv = clusterpeer(x, "renewed")["status"]["invite"]
    assert inv["used"] is False and inv["expiresAt"] > "2021"


async def test_capability_validation_writes_accepted_with_reason(world):
    x, _ = world
    x.api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": "too-much"},
                  "spec": {"version": "v1", "consumers": [{"kind": "ServiceAccount", "namespace": "a", "name": "b"}],
                           "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}})
    await until(lambda: condition(x.api.get(GROUP, "peeringcapabilities", "too-much"), "Accepted"), what="Accepted")
    accepted = condition(x.api.get(GROUP, "peeringcapabilities", "too-much"), "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "Wildcard")
    assert accepted["observedGeneration"] == 1


async def test_join_with_garbage_is_malformed_and_unreachable_inviter_is_pending(world):
    x, _ = world
    create_join(x, "garbage", "d8peer1.not-a-string")
    await until_equal(lambda: ready(clusterpeer(x, "garbage")), ("Error", "False", "Malformed"))
    # A well-formed string of a cluster whose join endpoint does not answer: retried, never an Error.
    create_invite(x, "source")
    text = await connection_string(x, "source")
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    import dataclasses

    import uuid

    # Another cluster's string: one naming this cluster's own UUID is refused before any call (ClusterUUIDInUse).
    elsewhere = connstring.encode(dataclasses.replace(inv, join_url="https://127.0.0.1:1", cluster_uuid=str(uuid.uuid4())))
    create_join(x, "nowhere", elsewhere)
    await until_equal(lambda: ready(clusterpeer(x, "nowhere")), ("Pending", "False", "JoinEndpointUnreachable"))
    # The key was kept before the call, so a retry presents the same key.
    secret = x.api.get("", "secrets", "peer-nowhere", "d8-peering")
    assert set(secret["data"]) == {"client.key"}
    assert secret["metadata"]["ownerReferences"][0]["name"] == "nowhere"


async def test_a_private_join_ca_travels_in_the_string(world):
    """With CustomCertificate from a private CA, the joiner cannot trust the join endpoint by the system roots:
    the CA of the join Secret's ca.crt goes into the string (and only the CA, never a key)."""
    x, runtime = world
    from control import pki
    from control.kube import SECRETS

    private = pki.create_ca("private", now=datetime.datetime.now(datetime.timezone.utc))
    served = pki.issue_server_cert(private, ["peering.x.lab"], now=datetime.datetime.now(datetime.timezone.utc))
    import base64

    x.api.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                  "metadata": {"name": "peering-join-tls", "namespace": "d8-peering"},
                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in (
                      ("tls.crt", served.cert_pem), ("tls.key", served.key_pem), ("ca.crt", private.cert_pem))}})
    cache = runtime.informers.get(SECRETS, namespace="d8-peering", field_selector="metadata.name=peering-join-tls")
    await until(lambda: cache.get("peering-join-tls", "d8-peering"), what="the join Secret in the cache")
    create_invite(x, "private-ca")
    inv = connstring.decode(await connection_string(x, "private-ca"),
                            now=datetime.datetime.now(datetime.timezone.utc))
    assert inv.join_ca_pem is not None
    assert pki.fingerprint(inv.join_ca_pem) == pki.fingerprint(private.cert_pem)
