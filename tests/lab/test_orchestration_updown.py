"""`python -m lab up` / `down` as processes: lab.json, kubeconfigs usable by kubectl, clean stop."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import socket
import ssl
import subprocess
import sys

import pytest
import yaml
from cryptography import x509

from lab.cluster import ROOT
from lab.testing import KUBECTL, lab_down, lab_fixture, lab_process_fixture, lab_up

pytestmark = pytest.mark.slow

HOSTS = ("api.{c}.lab", "dex.{c}.lab", "peering.{c}.lab", "peering-gateway.{c}.lab", "peering-gateway.d8-peering.svc")


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _tls_names(port: int, ca_pem: str, host: str) -> list[str]:
    """Handshake as a client would, by name, and return the DNS names the server's certificate holds."""
    ctx = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
        cert = x509.load_der_x509_certificate(s.getpeercert(binary_form=True))
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


def test_up_kubectl_down(tmp_path):
    lab = lab_up(tmp_path, ["a", "b"], peering=False)
    pid = int((tmp_path / "lab.pid").read_text())
    try:
        assert _alive(pid)
        info = json.loads((tmp_path / "lab.json").read_text())
        assert info["ready"] is True
        assert set(info["clusters"]) == {"a", "b"}
        assert info["clusters"]["a"]["uuid"] != info["clusters"]["b"]["uuid"]
        for c in ("a", "b"):
            entry = info["clusters"][c]
            assert entry["publicDomainTemplate"] == f"%s.{c}.lab"
            assert set(entry["resolve"]) == {h.format(c=c) for h in HOSTS}
            assert all(t.startswith("127.0.0.1:") for t in entry["resolve"].values())
            assert entry["peering"]["state"] == "disabled"
            # The CA bundle in lab.json is what a client trusts for the cluster's public names.
            for host in ("api", "dex", "peering"):
                port = int(entry["resolve"][f"{host}.{c}.lab"].split(":")[1])
                assert _tls_names(port, entry["caBundles"]["public"], f"{host}.{c}.lab") == [f"{host}.{c}.lab"]

            # kubectl uses the written kubeconfig as is.
            out = lab.kubectl(c, "get", "namespaces", "-o", "name").stdout.split()
            assert {"namespace/kube-system", "namespace/default", "namespace/d8-peering"} <= set(out)
            uuid = lab.kubectl(c, "-n", "kube-system", "get", "configmap", "d8-cluster-uuid",
                               "-o", "jsonpath={.data.cluster-uuid}").stdout
            assert uuid == entry["uuid"]
            assert lab.kubectl(c, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == "admin"
            # The module's RBAC came from the chart.
            assert "d8:peering" in lab.kubectl(c, "get", "clusterroles", "-o", "name").stdout
            # The Dex client the gateway reads: user-authn's Secret for the DexClient `peering`, the ID derived.
            secret = json.loads(lab.kubectl(c, "-n", "d8-peering", "get", "secret", "dex-client-peering",
                                            "-o", "json").stdout)
            assert set(secret["data"]) == {"clientSecret"} and base64.b64decode(secret["data"]["clientSecret"])
            assert entry["dexClientID"] == "dex-client-peering@d8-peering"
            assert entry["serviceAccountIssuer"] == "https://kubernetes.default.svc.cluster.local"
            assert entry["withoutCRDs"] == []

            # The peering process's kubeconfig authenticates as its ServiceAccount.
            peering_kc = entry["files"]["peeringKubeconfig"]
            assert oct(os.stat(peering_kc).st_mode & 0o777) == "0o600"
            assert yaml.safe_load(pathlib.Path(peering_kc).read_text())["clusters"][0]["cluster"]["tls-server-name"] \
                == f"api.{c}.lab"
            who = subprocess.run([KUBECTL, "--kubeconfig", peering_kc, "auth", "whoami", "-o",
                                  "jsonpath={.status.userInfo.username}"], capture_output=True, text=True, timeout=30)
            assert who.stdout == "system:serviceaccount:d8-peering:peering", who.stderr

        # A second lab in the same directory is refused while this one runs.
        again = subprocess.run([sys.executable, "-m", "lab", "up", "--clusters", "a", "--dir", str(tmp_path)],
                               capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        assert again.returncode == 1 and "already runs" in again.stderr
    finally:
        down = lab_down(tmp_path)
    assert "stopped" in down.stdout
    assert not _alive(pid)
    assert not (tmp_path / "lab.pid").exists()
    assert json.loads((tmp_path / "lab.json").read_text())["ready"] is False
    # Its listeners are gone.
    port = int(info["clusters"]["a"]["resolve"]["api.a.lab"].split(":")[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # down is idempotent.
    assert "no lab runs" in lab_down(tmp_path).stdout


def test_up_refuses_a_cluster_name_that_is_not_a_dns_label(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "lab", "up", "--clusters", "a,B_1", "--dir", str(tmp_path)],
                         capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert bad.returncode == 2
    assert "'B_1'" in bad.stderr and "DNS label" in bad.stderr
    assert not (tmp_path / "lab.pid").exists()


def test_up_reports_a_start_that_fails_with_the_log(tmp_path):
    """The background process dies (here: its directory cannot hold a cluster); `up` says so with the log."""
    (tmp_path / "a").write_text("a file where the cluster's directory should be")
    bad = subprocess.run([sys.executable, "-m", "lab", "up", "--clusters", "a", "--dir", str(tmp_path),
                          "--no-peering"], capture_output=True, text=True, cwd=str(ROOT), timeout=90)
    assert bad.returncode == 1
    assert "failed to start" in bad.stderr and "lab.log" in bad.stderr
    assert not (tmp_path / "lab.pid").exists()


def test_up_without_a_crd_then_applying_it(tmp_path):
    lab = lab_up(tmp_path, ["a", "b"], peering=False,
                 without_crds=["tokenexchangeproviders.deckhouse.io", "a:projects.deckhouse.io"])
    try:
        assert lab.cluster("a")["withoutCRDs"] == ["tokenexchangeproviders.deckhouse.io", "projects.deckhouse.io"]
        assert lab.cluster("b")["withoutCRDs"] == ["tokenexchangeproviders.deckhouse.io"]
        missing = lab.kubectl("a", "get", "projects", check=False)
        assert missing.returncode != 0 and 'doesn\'t have a resource type "projects"' in missing.stderr
        assert lab.kubectl("b", "get", "projects", "-o", "name").returncode == 0
        for c in ("a", "b"):
            assert lab.kubectl(c, "get", "tokenexchangeproviders", check=False).returncode != 0
        # Installing the CRD while the lab runs: the API is there at once.
        crd = str(ROOT / "lab" / "apiserver" / "crds" / "project.yaml")
        lab.kubectl("a", "apply", "--server-side", "-f", crd)
        manifest = tmp_path / "project.json"
        manifest.write_text(json.dumps({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project",
                                        "metadata": {"name": "shop"}}))
        lab.kubectl("a", "apply", "-f", str(manifest))
        assert lab.kubectl("a", "get", "projects", "-o", "name").stdout.strip() == "project.deckhouse.io/shop"
    finally:
        lab_down(tmp_path)


def test_up_refuses_an_unknown_crd_to_leave_out(tmp_path):
    for value in ("projects.deckhouse.com", "c:projects.deckhouse.io"):
        bad = subprocess.run([sys.executable, "-m", "lab", "up", "--clusters", "a", "--dir", str(tmp_path),
                              "--without-crd", value], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        assert bad.returncode == 2, bad.stderr
        assert ("unknown CRD projects.deckhouse.com" in bad.stderr if value.startswith("projects")
                else "there is no cluster 'c'" in bad.stderr)
        assert not (tmp_path / "lab.pid").exists()


shared_lab = lab_process_fixture(["solo"], peering=False)
inprocess_lab = lab_fixture(["solo"], peering_command=None)


def test_process_fixture_gives_a_running_lab(shared_lab):
    assert shared_lab.kubectl("solo", "get", "namespace", "d8-peering", "-o", "name").stdout.strip() == \
        "namespace/d8-peering"
    assert set(shared_lab.resolve("solo")) == {h.format(c="solo") for h in HOSTS}


async def test_inprocess_fixture_gives_the_same_cluster_shape(inprocess_lab):
    solo = inprocess_lab["solo"]
    assert solo.api.get("", "configmaps", "d8-cluster-uuid", "kube-system")["data"]["cluster-uuid"] == solo.uuid
    assert set(solo.resolve_map()) == {h.format(c="solo") for h in HOSTS}


def test_user_authn_follows_kubectl_and_its_lab_annotations(shared_lab):
    """Another process drives user-authn through kubectl alone: apply, fail on purpose, recover."""
    import time

    from jwcrypto import jwk

    key = jwk.JWK.generate(kty="EC", crv="P-256", kid="k").export_public(as_dict=True)
    provider = {"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
                "metadata": {"name": "peering-x", "annotations": {"lab.deckhouse.io/fail": "ApplyError"}},
                "spec": {"issuer": "https://api.x.lab", "jwks": json.dumps({"keys": [key]}),
                         "usernamePrefix": "peering:x:", "audiences": ["kubernetes"]}}

    def apply(obj):
        done = subprocess.run([KUBECTL, "--kubeconfig", shared_lab.kubeconfig("solo"), "apply", "-f", "-"],
                              input=json.dumps(obj), capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr

    def reason_becomes(expected):
        deadline = time.monotonic() + 10
        while True:
            got = shared_lab.kubectl("solo", "get", "tokenexchangeprovider", "peering-x", "-o",
                                     'jsonpath={.status.conditions[?(@.type=="Ready")].reason}').stdout
            if got == expected or time.monotonic() > deadline:
                return got
            time.sleep(0.1)  # bounded poll of another process

    apply(provider)
    assert reason_becomes("ApplyError") == "ApplyError"
    del provider["metadata"]["annotations"]["lab.deckhouse.io/fail"]
    provider["metadata"]["annotations"]["lab.deckhouse.io/delay-seconds"] = "0"
    apply(provider)
    assert reason_becomes("ProviderReady") == "ProviderReady"


def test_up_that_times_out_leaves_nothing_running(tmp_path):
    slow = subprocess.run([sys.executable, "-m", "lab", "up", "--clusters", "a", "--dir", str(tmp_path),
                           "--no-peering", "--timeout", "0.01"], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120)
    assert slow.returncode == 1 and "not ready within" in slow.stderr
    assert not (tmp_path / "lab.pid").exists()
    assert _processes_serving(tmp_path) == []


def _processes_serving(d: pathlib.Path) -> list[int]:
    """Live `python -m lab serve` processes for directory `d`."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and str(d).encode() in args and _alive(int(proc.name)):
            found.append(int(proc.name))
    return found
