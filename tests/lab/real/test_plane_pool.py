"""lab/real/pool.py: a control plane given back is emptied and handed to the next cluster of its name, which finds
nothing of the earlier one and whose Dex tokens the plane's kube-apiserver accepts; a plane whose baseline a test
changed is stopped instead; a plane goes only to a cluster of its name started without the same CRDs."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from lab.cluster import Lab
from lab.real.pool import PlanePool

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]


async def whoami(cluster, token: str) -> tuple[int, dict]:
    """kube-apiserver's SelfSubjectReview of `token`: who the plane says its bearer is."""
    plane = cluster.control_plane
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{plane.url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                          headers={"Authorization": f"Bearer {token}"}, ssl=plane.ssl_context(),
                          server_hostname=plane.tls_server_name) as r:
            return r.status, await r.json(content_type=None)


def dex_token(cluster, email: str) -> str:
    now = int(time.time())
    return cluster.dex.sign({"iss": cluster.dex_issuer, "sub": "user-1", "aud": "kubernetes", "email": email,
                             "email_verified": True, "name": email, "iat": now, "exp": now + 300})


async def test_a_plane_given_back_is_emptied_and_taken_by_the_next_cluster_of_its_name(binaries, tmp_path):
    pool = PlanePool(idle_seconds=120)
    try:
        first = Lab(tmp_path / "first", ["a"], peering_command=None, apiserver="real", planes=pool)
        await first.start()
        try:
            a = first["a"]
            plane, pids = a.control_plane, a.control_plane.pids()
            a.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "left-behind"}})
            status, review = await whoami(a, dex_token(a, "first@example.com"))
            assert status == 201 and review["status"]["userInfo"]["username"] == "first@example.com"
        finally:
            await first.stop()
        assert pool.counts["started"] == 1 and pool.counts["kept"] == 1
        # Kept for a cluster of its name started with the same CRDs only.
        assert pool.take("b") is None and pool.take("a", ["projects.deckhouse.io"]) is None

        second = Lab(tmp_path / "second", ["a"], peering_command=None, apiserver="real", planes=pool)
        await second.start()
        try:
            a = second["a"]
            assert a.control_plane is plane and a.control_plane.pids() == pids
            assert pool.counts["taken"] == 1
            assert a.api.get("", "namespaces", "left-behind") is None
            # The seed is the new cluster's: its UUID, not the first one's.
            uuid = a.api.get("", "configmaps", "d8-cluster-uuid", "kube-system")["data"]["cluster-uuid"]
            assert uuid == a.uuid
            # The new Dex, on another port, signs what kube-apiserver accepts.
            status, review = await whoami(a, dex_token(a, "second@example.com"))
            assert status == 201 and review["status"]["userInfo"]["username"] == "second@example.com"
            assert (tmp_path / "second" / "a" / "control-plane").resolve() == plane.files.dir
            # What the control plane started with, changed: it cannot be brought back by deleting.
            ns = a.api.get("", "namespaces", "kube-public")
            ns["metadata"].setdefault("labels", {})["changed-by"] = "test"
            a.api.update(ns)
        finally:
            await second.stop()
        assert pool.counts["kept"] == 1 and pool.counts["not kept: the test changed what it started with"] == 1
        assert plane.pids() == {}
        assert pool.take("a") is None
    finally:
        await asyncio.to_thread(pool.close)
