"""Lab clusters shaped as default Deckhouse clusters: one ServiceAccount issuer URL for all (each with its own
keys), optional APIs left out per cluster, and projects left as multitenancy-manager leaves them."""

from __future__ import annotations

import aiohttp
import pytest

from lab import certs
from lab.cluster import SERVICE_ACCOUNT_ISSUER, Lab
from lab.multitenancy import PROJECT_LABEL
from lab.testing import lab_clusters

PROJECTS = "projects.deckhouse.io"


async def _get(cluster, path: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ctx = certs.client_ssl_context(cluster.pki.public_ca.cert_pem)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{cluster.api.port}{path}", headers=headers, ssl=ctx,
                            server_hostname=f"api.{cluster.name}.lab") as r:
            return r.status, await r.json(content_type=None)


async def test_every_cluster_has_the_same_issuer_url_and_its_own_keys(tmp_path):
    async with lab_clusters(tmp_path, ["a", "b"], peering_command=None) as lab:
        a, b = lab["a"], lab["b"]
        docs = [await _get(c, "/.well-known/openid-configuration", c._peering_token) for c in (a, b)]
        assert [d["issuer"] for _, d in docs] == [SERVICE_ACCOUNT_ISSUER] * 2
        assert SERVICE_ACCOUNT_ISSUER == "https://kubernetes.default.svc.cluster.local"
        keys = [(await _get(c, "/openid/v1/jwks", c._peering_token))[1]["keys"] for c in (a, b)]
        assert keys[0] != keys[1]
        # A's peering token names the same issuer as b's tokens, yet only a accepts it.
        token = a._peering_token
        review = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
        async with aiohttp.ClientSession() as http:
            for cluster, want in ((a, 201), (b, 401)):
                async with http.post(f"https://127.0.0.1:{cluster.api.port}{review}",
                                     json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                                     headers={"Authorization": f"Bearer {token}"},
                                     ssl=certs.client_ssl_context(cluster.pki.public_ca.cert_pem),
                                     server_hostname=f"api.{cluster.name}.lab") as r:
                    assert r.status == want, (cluster.name, await r.text())
        assert a.info()["serviceAccountIssuer"] == b.info()["serviceAccountIssuer"] == SERVICE_ACCOUNT_ISSUER


async def test_crds_left_out_per_cluster_and_installed_later(tmp_path):
    async with lab_clusters(tmp_path, ["a", "b"], peering_command=None, without_crds={"a": [PROJECTS]}) as lab:
        a, b = lab["a"], lab["b"]
        assert a.without_crds == [PROJECTS] and b.without_crds == []
        assert not a.api.crd_installed(PROJECTS) and b.api.crd_installed(PROJECTS)
        with pytest.raises(Exception) as err:
            a.create_project("shop")
        assert getattr(err.value, "code", None) == 404
        b.create_project("shop")
        a.install_crd(PROJECTS)
        assert a.without_crds == [] and a.info()["withoutCRDs"] == []
        assert a.create_project("shop")["status"]["namespaces"] == [{"name": "shop", "kind": "Main"}]


def test_without_crds_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown CRD project.deckhouse.io: name a CRD the lab installs"):
        Lab(tmp_path, ["a"], without_crds=["project.deckhouse.io"])
    with pytest.raises(ValueError, match="names cluster c, which is not one of"):
        Lab(tmp_path, ["a"], without_crds={"c": [PROJECTS]})
    with pytest.raises(ValueError, match="moduleconfigs.deckhouse.io is Deckhouse's own, which its module manager "
                                         "needs"):
        Lab(tmp_path, ["a"], without_crds=["moduleconfigs.deckhouse.io"])


async def test_projects_and_their_namespaces_as_multitenancy_manager_leaves_them(tmp_path):
    async with lab_clusters(tmp_path, ["m"], peering_command=None) as lab:
        m = lab["m"]
        project = m.create_project("shop")
        assert project["apiVersion"] == "deckhouse.io/v1alpha3"
        assert m.add_project_namespace("shop", "eu") == "shop-eu"
        assert m.add_project_namespace("shop", "eu") == "shop-eu"       # once only
        stored = m.api.get("deckhouse.io", "projects", "shop")
        assert stored["status"]["namespaces"] == [{"name": "shop", "kind": "Main"},
                                                  {"name": "shop-eu", "kind": "Additional"}]
        for ns in ("shop", "shop-eu"):
            assert m.api.get("", "namespaces", ns)["metadata"]["labels"][PROJECT_LABEL] == "shop"
        with pytest.raises(ValueError, match="namespace shop-eu belongs to project 'shop'"):
            m.create_project("shop-eu")
        assert m.api.get("deckhouse.io", "projects", "shop-eu") is None
        with pytest.raises(ValueError, match="there is no Project 'ghost'"):
            m.add_project_namespace("ghost", "x")
        with pytest.raises(ValueError, match="longer than 61"):
            m.create_project("p" * 62)
