"""The API session and the informers against the emulated API server and a real kube-apiserver: typed errors,
preconditions, write counting, a watch that resumes after the server ends it, and a relist after 410 Gone.

Every test runs on both backends (`[emulator]`, `[real]`). The emulator is new for each test; the real
kube-apiserver is one per module (started in 4-5 s), emptied between tests. Where the emulator is told to keep a
short history (5 changes) and send bookmarks every 50 ms, the real one loses its watch history by a restart of
kube-apiserver (its watch cache then starts at etcd's current revision) and sends a bookmark 2 s before a
watch's timeoutSeconds, as it does to every client."""

from __future__ import annotations

import pytest

from control import kube as k
from control.informers import Informers
from control.watch import Informer
from lab.testing import RealApiserverAlone
from tests.control.conftest import NAMESPACE, eventually, on_backend


def client_cert(server, user: str, groups=()) -> tuple[bytes, bytes]:
    """A client certificate of `user` in `groups` that the server trusts, and its key."""
    if isinstance(server, RealApiserverAlone):
        ck = server.plane.pki.client_ca.issue_client(user, list(groups))
        return ck.cert_pem, ck.key_pem
    from lab.apiserver.testing import issue_client_cert
    return issue_client_cert(server, user, groups)


def serving_ca(server) -> bytes:
    return server.plane.ca_pem if isinstance(server, RealApiserverAlone) else server.test_ca.cert_pem.bytes()


async def lose_history(server) -> None:
    """Make the changes so far older than what the server's watches can start from: a restart of a real
    kube-apiserver; on the emulator the short history (history=5) has done it already."""
    if isinstance(server, RealApiserverAlone):
        await server.plane.restart_apiserver()


@pytest.fixture
async def api(backend, real_apiserver, tmp_path):
    """(server, admin kubeconfig path): a fresh emulator, or the module's real kube-apiserver emptied."""
    async with on_backend(real_apiserver, tmp_path) as started:
        yield started


@pytest.fixture
async def short_history(backend, real_apiserver, tmp_path):
    """(server, kubeconfig) whose watch history is short: an emulator keeping 5 changes and sending bookmarks
    every 50 ms, or the real one (see `lose_history`); `watch_timeout` for informers there, so that kube-apiserver
    sends a bookmark before the watch ends (it sends them 2 s before timeoutSeconds, or every minute)."""
    async with on_backend(real_apiserver, tmp_path, history=5, bookmark_interval=0.05) as (server, kubeconfig):
        yield server, kubeconfig, 5 if real_apiserver is not None else 300


def cm(name, **data):
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "data": data}


async def test_crud_with_typed_errors_preconditions_and_write_counting(kube):
    assert kube.writes == 0
    created = await kube.create(k.CONFIGMAPS, cm("a", x="1"))
    assert created["kind"] == "ConfigMap" and created["data"] == {"x": "1"}
    with pytest.raises(k.AlreadyExists):
        await kube.create(k.CONFIGMAPS, cm("a"))
    with pytest.raises(k.NotFound):
        await kube.get(k.CONFIGMAPS, "missing", NAMESPACE)
    assert await kube.get_or_none(k.CONFIGMAPS, "missing", NAMESPACE) is None

    stale = dict(created)
    updated = await kube.update(k.CONFIGMAPS, {**created, "data": {"x": "2"}})
    with pytest.raises(k.Conflict) as err:
        await kube.update(k.CONFIGMAPS, {**stale, "data": {"x": "3"}})
    assert not isinstance(err.value, k.AlreadyExists) and err.value.code == 409

    patched = await kube.patch(k.CONFIGMAPS, "a", {"data": {"y": "z"}}, NAMESPACE)
    assert patched["data"] == {"x": "2", "y": "z"}
    with pytest.raises(k.Conflict):
        await kube.patch(k.CONFIGMAPS, "a", {"data": {"y": "w"}}, NAMESPACE,
                         resource_version=updated["metadata"]["resourceVersion"])
    with pytest.raises(k.Invalid):
        await kube.create(k.CLUSTERPEERS, {"metadata": {"name": "bad"}, "spec": {"type": "Sideways"}})

    listed = await kube.list(k.CONFIGMAPS, NAMESPACE, page_size=1)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    await kube.delete(k.CONFIGMAPS, "a", NAMESPACE)
    with pytest.raises(k.NotFound):
        await kube.delete(k.CONFIGMAPS, "a", NAMESPACE)

    assert kube.write_counts[("POST", "configmaps")] == 2
    assert kube.write_counts[("PUT", "configmaps")] == 2
    assert kube.write_counts[("PATCH", "configmaps")] == 2
    assert kube.write_counts[("DELETE", "configmaps")] == 2
    assert kube.write_counts[("POST", "clusterpeers")] == 1
    assert kube.writes == 9


async def test_status_subresource_and_pagination(kube):
    peer = await kube.create(k.CLUSTERPEERS, {"metadata": {"name": "b"}, "spec": {"type": "Invite"}})
    done = await kube.update_status(k.CLUSTERPEERS, {**peer, "status": {"phase": "Pending"}})
    assert done["status"]["phase"] == "Pending"
    for i in range(5):
        await kube.create(k.CONFIGMAPS, cm(f"p{i}"))
    listed = await kube.list(k.CONFIGMAPS, NAMESPACE, page_size=2)
    assert sorted(o["metadata"]["name"] for o in listed["items"]) == [f"p{i}" for i in range(5)]
    assert listed["metadata"]["resourceVersion"]


async def test_credentials_for_the_gateway_name_the_same_server(kube, api):
    creds = kube.credentials()
    assert creds.server == api[0].url
    assert creds.ca_pem and b"BEGIN CERTIFICATE" in creds.ca_pem
    assert creds.token() is None  # this session authenticates with a client certificate


class Events:
    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def __call__(self, event_type, obj):
        self.seen.append((event_type, obj["metadata"]["name"]))


async def test_informer_resumes_when_the_server_ends_the_watch(kube, api):
    server, _ = api
    server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("before")})
    informer = Informer(kube, k.CONFIGMAPS, namespace=NAMESPACE, watch_timeout=1)
    events = Events()
    informer.subscribe(events)
    informer.start()
    try:
        await eventually(informer.synced.is_set, what="first list")
        assert events.seen == [("ADDED", "before")]
        # The server ends each watch after 1s; the informer must watch again without listing.
        await eventually(lambda: informer.watches >= 3, what="two watch resumptions")
        server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("after")})
        await eventually(lambda: ("ADDED", "after") in events.seen, what="event after resuming")
        server.delete("", "configmaps", "before", NAMESPACE)
        await eventually(lambda: ("DELETED", "before") in events.seen, what="delete event")
        assert informer.lists == 1
        assert set(informer.store) == {f"{NAMESPACE}/after"}
    finally:
        await informer.stop()


async def test_informer_relists_after_410_and_reports_only_differences(short_history):
    server, kubeconfig, _ = short_history
    async with await k.KubeSession.connect(str(kubeconfig)) as session:
        for name in ("keep", "change", "drop"):
            server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm(name)})
        informer = Informer(session, k.CONFIGMAPS, namespace=NAMESPACE)
        events = Events()
        informer.subscribe(events)
        informer.start()
        await eventually(informer.synced.is_set, what="first list")
        await informer.stop()
        events.seen.clear()
        # While it is away, more changes than the server's history keeps: its resourceVersion is too old.
        for i in range(10):
            server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm(f"new{i}")})
            server.delete("", "configmaps", f"new{i}", NAMESPACE)
        changed = server.get("", "configmaps", "change", NAMESPACE)
        server.update({**changed, "data": {"v": "2"}})
        server.delete("", "configmaps", "drop", NAMESPACE)
        server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("added")})
        await lose_history(server)
        informer.start()
        try:
            await eventually(lambda: informer.lists == 2, what="relist after 410")
            await eventually(lambda: len(events.seen) >= 3, what="the differences")
            assert sorted(events.seen) == [("ADDED", "added"), ("DELETED", "drop"), ("MODIFIED", "change")]
            assert set(informer.store) == {f"{NAMESPACE}/{n}" for n in ("keep", "change", "added")}
            assert informer.store[f"{NAMESPACE}/change"]["data"] == {"v": "2"}
        finally:
            await informer.stop()


async def test_informer_retries_with_backoff_while_the_server_refuses(kube, api):
    # A resource the server does not know: 404 on every list, retried with backoff, never synced, no crash.
    informer = Informer(kube, k.Resource("example.com", "v1", "widgets", False, "Widget"))
    informer.backoff.base = 0.01
    informer.start()
    try:
        await eventually(lambda: informer.backoff.attempts >= 3, what="retries")
        assert not informer.synced.is_set() and "NotFound" in (informer.last_error or "")
    finally:
        await informer.stop()


async def test_informers_share_one_watch_per_selection(kube):
    informers = Informers(kube)
    a = informers.get(k.SECRETS, namespace=NAMESPACE, label_selector="x=y")
    assert informers.get(k.SECRETS, namespace=NAMESPACE, label_selector="x=y") is a
    assert informers.get(k.SECRETS, namespace=NAMESPACE) is not a
    informers.start()
    late = informers.get(k.CONFIGMAPS, namespace=NAMESPACE)
    try:
        await informers.wait_synced()
        assert informers.synced and late.synced.is_set()
    finally:
        await informers.stop()


async def test_forbidden_and_unauthorized_are_typed(api, tmp_path):
    from lab.apiserver.testing import write_kubeconfig

    server, _ = api
    cert, key = client_cert(server, "alice", ["team"])
    path = write_kubeconfig(tmp_path / "alice", server.url, serving_ca(server), cert, key)
    async with await k.KubeSession.connect(str(path)) as alice:
        with pytest.raises(k.Forbidden) as err:
            await alice.list(k.SECRETS, NAMESPACE)
        assert err.value.code == 403 and "alice" in err.value.message
    path = write_kubeconfig(tmp_path / "anon", server.url, serving_ca(server), token="not-a-token")
    async with await k.KubeSession.connect(str(path)) as anon:
        assert anon.bearer_token() == "not-a-token"
        with pytest.raises(k.Unauthorized):
            await anon.get(k.SECRETS, "x", NAMESPACE)


async def test_bookmarks_keep_a_quiet_watch_resumable(short_history):
    # History holds 5 changes; 20 changes elsewhere pass while this selection stays quiet. Bookmarks move the
    # informer's resourceVersion along, so resuming after that needs no relist.
    server, kubeconfig, watch_timeout = short_history
    async with await k.KubeSession.connect(str(kubeconfig)) as session:
        informer = Informer(session, k.CONFIGMAPS, namespace=NAMESPACE, watch_timeout=watch_timeout)
        informer.start()
        try:
            await eventually(informer.synced.is_set, what="first list")
            # Seeing an event proves the watch is established before the burst (else it could start from
            # a point the burst has already pushed out of the history, and rightly relist).
            server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("first")})
            await eventually(lambda: informer.get("first", NAMESPACE) is not None, what="the watch running")
            listed_at = int(informer.resource_version)
            for i in range(20):
                server.create({"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": f"elsewhere{i}", "namespace": "default"}})
            latest = int(server.get("", "configmaps", "elsewhere19", "default")["metadata"]["resourceVersion"])
            await eventually(lambda: int(informer.resource_version) >= latest, what="a bookmark")
            assert int(informer.resource_version) > listed_at
        finally:
            await informer.stop()
        # Restarted, it resumes from the bookmark: the server still has that point in its history.
        server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("later")})
        informer.start()
        try:
            await eventually(lambda: informer.get("later", NAMESPACE) is not None, what="the new object")
            assert informer.lists == 1
        finally:
            await informer.stop()


async def test_a_bearer_token_session_authenticates_as_its_serviceaccount(api, tmp_path):
    from lab.apiserver.testing import write_kubeconfig

    server, _ = api
    sa = server.create({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "peering", "namespace": NAMESPACE}})
    # No audiences asked: the token gets the API server's own (--api-audiences), as `kubectl create token`.
    token, _ = server.sa_issuer.issue(NAMESPACE, "peering", sa["metadata"]["uid"], [], 3600)
    path = write_kubeconfig(tmp_path / "sa", server.url, serving_ca(server), token=token)
    async with await k.KubeSession.connect(str(path)) as session:
        assert session.credentials().token() == token
        review = await session.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{NAMESPACE}:peering"
        assert session.writes == 0, "a review stores nothing and is not counted as a write"


async def test_object_poller_follows_one_object_with_get_only(api, tmp_path):
    from lab.apiserver.testing import write_kubeconfig

    server, _ = api
    # A user who may only get this one ConfigMap, as the chart grants the process for the cluster UUID.
    server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "uuid-reader", "namespace": NAMESPACE},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["polled"],
                              "verbs": ["get"]}]})
    server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "uuid-reader", "namespace": NAMESPACE},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "uuid-reader"},
                   "subjects": [{"kind": "User", "name": "reader"}]})
    cert, key = client_cert(server, "reader")
    path = write_kubeconfig(tmp_path / "reader", server.url, serving_ca(server), cert, key)
    async with await k.KubeSession.connect(str(path)) as session:
        informers = Informers(session)
        poller = informers.get_object(k.CONFIGMAPS, "polled", namespace=NAMESPACE, interval=0.05)
        assert informers.get_object(k.CONFIGMAPS, "polled", namespace=NAMESPACE) is poller
        poller.backoff.base = poller.backoff.cap = 0.05
        events = Events()
        poller.subscribe(events)
        informers.start()
        try:
            await informers.wait_synced()
            assert poller.items() == [] and poller.last_error is None
            server.create({"apiVersion": "v1", "kind": "ConfigMap", **cm("polled", v="1")})
            await eventually(lambda: events.seen == [("ADDED", "polled")], what="ADDED")
            obj = server.get("", "configmaps", "polled", NAMESPACE)
            server.update({**obj, "data": {"v": "2"}})
            await eventually(lambda: events.seen[-1] == ("MODIFIED", "polled"), what="MODIFIED")
            assert poller.get("polled", NAMESPACE)["data"] == {"v": "2"}
            server.delete("", "configmaps", "polled", NAMESPACE)
            await eventually(lambda: events.seen[-1] == ("DELETED", "polled"), what="DELETED")
            assert len(events.seen) == 3, "an unchanged object is not reported again"
        finally:
            await informers.stop()


async def test_the_session_reaches_a_lab_host_name_through_the_resolver(api, tmp_path):
    from gateway.resolve import OverrideResolver
    from lab.apiserver.testing import write_kubeconfig

    server, _ = api
    cert, key = client_cert(server, "lab-admin", ["system:masters"])
    # The serving certificate names api.lab.lab, which no DNS knows: only the resolver map leads there.
    path = write_kubeconfig(tmp_path / "named", f"https://api.lab.lab:{server.port}", serving_ca(server), cert, key)
    resolver = OverrideResolver({"api.lab.lab": f"127.0.0.1:{server.port}"})
    try:
        async with await k.KubeSession.connect(str(path), resolver=resolver) as session:
            ns = await session.get(k.NAMESPACES, NAMESPACE)
            assert ns["metadata"]["name"] == NAMESPACE
            assert session.credentials().server == f"https://api.lab.lab:{server.port}"
    finally:
        await resolver.close()


async def test_a_broken_kubeconfig_says_which_file_and_flag(tmp_path):
    path = tmp_path / "broken"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(ValueError, match="check --kubeconfig") as err:
        await k.KubeSession.connect(str(path))
    assert str(path) in str(err.value)
