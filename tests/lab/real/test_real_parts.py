"""The real backend's parts that need no binaries: the configuration it renders, the proxy, the build's checks."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys

import aiohttp
import pytest
import trustme
import yaml
from aiohttp import web

from lab.real import build as builder
from lab.real import config, proxy
from lab.real.process import GO_GC_PERCENT, go_env
from lab.cluster import Replica
from lab.real.documents import load_documents, strip_schema_keys
from lab.workload import exit_code, pod_state, pod_status
from tests.ports import closed_port

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"


# --- the authentication configuration ---

def test_the_authentication_configuration_is_deckhouses():
    ca = trustme.CA().cert_pem.bytes()
    doc = config.authentication_configuration(config.JWTIssuer("https://dex.a.lab", ca))
    assert doc["apiVersion"] == "apiserver.config.k8s.io/v1beta1"
    assert doc["kind"] == "AuthenticationConfiguration"
    (jwt,) = doc["jwt"]
    assert jwt["issuer"] == {"url": "https://dex.a.lab", "certificateAuthority": ca.decode(),
                             "audiences": ["kubernetes"]}
    assert jwt["claimMappings"]["username"] == {"claim": "email", "prefix": ""}
    assert jwt["claimMappings"]["groups"] == {"claim": "groups", "prefix": ""}
    extras = {e["key"]: e["valueExpression"] for e in jwt["claimMappings"]["extra"]}
    assert extras["user-authn.deckhouse.io/name"] == "claims.name"
    assert set(extras) == {"user-authn.deckhouse.io/name", "user-authn.deckhouse.io/preferred_username",
                           "user-authn.deckhouse.io/dex-provider"}
    rules = [r["expression"] for r in jwt["userValidationRules"]]
    assert rules == ["!user.username.startsWith('system:')", "user.groups.all(group, !group.startsWith('system:'))"]
    # It survives the trip through YAML unchanged (the file kube-apiserver reads).
    assert yaml.safe_load(yaml.safe_dump(doc)) == doc


def test_a_discovery_url_is_passed_when_given():
    ca = trustme.CA().cert_pem.bytes()
    doc = config.authentication_configuration(
        config.JWTIssuer("https://dex.a.lab/", ca, discovery_url="https://127.0.0.1:4443/.well-known/openid-configuration"))
    assert doc["jwt"][0]["issuer"]["discoveryURL"] == "https://127.0.0.1:4443/.well-known/openid-configuration"
    assert doc["jwt"][0]["issuer"]["url"] == "https://dex.a.lab/"  # exactly as given: Deckhouse's has the slash
    assert config.authentication_configuration(None)["jwt"] == []


@pytest.mark.parametrize("kwargs, message", [
    ({"url": "http://dex.a.lab"}, "only accepts an https:// issuer URL"),
    ({"discovery_url": "http://127.0.0.1/x"}, "discovery URL 'http://127.0.0.1/x'"),
    ({"ca_pem": b"not a certificate"}, "its CA must be PEM certificates"),
    ({"audiences": ()}, "give at least one audience"),
])
def test_a_bad_issuer_is_refused_by_name(kwargs, message):
    args = {"url": "https://dex.a.lab", "ca_pem": trustme.CA().cert_pem.bytes(), **kwargs}
    with pytest.raises(ValueError, match=message):
        config.JWTIssuer(**args)


def test_the_command_lines_bind_loopback_and_say_what_deckhouse_says(tmp_path):
    files = config.Files(tmp_path)
    api = config.apiserver_args(files, 6443, 2379)
    assert "--bind-address=127.0.0.1" in api and "--secure-port=6443" in api
    assert "--authorization-mode=Node,RBAC" in api
    assert "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement" in api
    assert "--service-account-issuer=https://kubernetes.default.svc.cluster.local" in api
    assert "--api-audiences=https://kubernetes.default.svc.cluster.local" in api
    assert not any(a.startswith(("--oidc-", "--insecure-port", "--anonymous-auth")) for a in api)
    kcm = config.controller_manager_args(files, 10257, "a")
    assert "--controllers=garbage-collector-controller,namespace-controller,clusterrole-aggregation-controller" in kcm and "--bind-address=127.0.0.1" in kcm
    etcd = config.etcd_args("a", files, 2379, 2380)
    urls = [a.split("=", 1)[1] for a in etcd if a.startswith(("--listen-", "--advertise-", "--initial-advertise"))]
    assert urls and all("//127.0.0.1:" in u for u in urls)
    assert "--client-cert-auth=true" in etcd


# --- the CRDs as a stock kube-apiserver takes them ---

def test_go_components_get_the_labs_collector_setting_and_no_proxy_of_the_caller():
    env = go_env({"PATH": "/bin", "HTTPS_PROXY": "http://elsewhere:3128", "no_proxy": "x", "All_Proxy": "y"})
    assert env == {"PATH": "/bin", "GOGC": GO_GC_PERCENT}
    assert go_env({"GOGC": "100"})["GOGC"] == "100", "the caller's own GOGC wins"


def test_stripping_finds_every_sensitive_marker_of_the_chart():
    crds = [d for d in load_documents([CHART_CRDS]) if d.get("kind") == "CustomResourceDefinition"]
    markers = json.dumps(crds).count('"x-kubernetes-sensitive-data":')
    found = [p for crd in crds for p in strip_schema_keys(crd, ("x-kubernetes-sensitive-data",))]
    assert len(found) == markers > 0
    assert "x-kubernetes-sensitive-data" not in json.dumps(crds)
    assert strip_schema_keys(crds[0], ()) == []


# --- the proxy ---

def test_the_proxy_map_takes_only_loopback_targets():
    assert proxy.parse_map(["dex.a.lab=127.0.0.1:4000", "X.b.lab:8443=127.0.0.2:1"]) == {
        "dex.a.lab:443": ("127.0.0.1", 4000), "x.b.lab:8443": ("127.0.0.2", 1)}
    for bad in ("dex.a.lab", "dex.a.lab=10.0.0.1:443", "dex.a.lab=127.0.0.1", "=127.0.0.1:1"):
        with pytest.raises(ValueError, match="host\\[:port\\]=127.0.0.1:PORT"):
            proxy.parse_map([bad])


@pytest.fixture
async def tls_backend():
    ca = trustme.CA()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("dex.a.lab").configure_cert(ctx)
    app = web.Application()

    async def hello(request):
        return web.json_response({"host": request.host, "path": request.path})
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    try:
        yield runner.addresses[0][1], ca
    finally:
        await runner.cleanup()


@pytest.fixture
async def connect_proxy(tls_backend):
    port, _ = tls_backend
    p = proxy.ConnectProxy(proxy.parse_map([f"dex.a.lab=127.0.0.1:{port}"]))
    server = await asyncio.start_server(p.handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_the_proxy_tunnels_tls_to_a_mapped_name(tls_backend, connect_proxy):
    _, ca = tls_backend
    ctx = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    async with aiohttp.ClientSession() as s:
        async with s.get("https://dex.a.lab/.well-known/openid-configuration", proxy=connect_proxy, ssl=ctx) as r:
            assert r.status == 200
            assert await r.json() == {"host": "dex.a.lab", "path": "/.well-known/openid-configuration"}


async def test_the_proxy_refuses_names_it_does_not_know(connect_proxy):
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientHttpProxyError) as e:
            async with s.get("https://example.org/", proxy=connect_proxy):
                pass
        assert e.value.status == 403
        # Not a CONNECT: refused with what is served.
        async with s.get(f"{connect_proxy}/anything") as r:
            assert r.status == 405 and "only CONNECT" in await r.text()


async def test_a_routes_file_is_read_again_before_the_next_connect_once_it_changed(tls_backend, tmp_path):
    port, ca = tls_backend
    routes = tmp_path / "routes"
    proxy.write_routes(routes, {"dex.a.lab": "127.0.0.1:1"})
    p = proxy.ConnectProxy({}, routes)
    server = await asyncio.start_server(p.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    ctx = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    # A connection per request: each one a CONNECT.
    async with server, aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        # Port 1 answers nothing: 502 naming the target.
        with pytest.raises(aiohttp.ClientHttpProxyError) as e:
            async with s.get("https://dex.a.lab/", proxy=url, ssl=ctx):
                pass
        assert e.value.status == 502
        # The file rewritten (a plane kept for the next cluster's Dex): the next CONNECT goes to the new target.
        proxy.write_routes(routes, {"dex.a.lab": f"127.0.0.1:{port}"})
        async with s.get("https://dex.a.lab/keys", proxy=url, ssl=ctx) as r:
            assert r.status == 200 and (await r.json())["path"] == "/keys"
        # A file that no longer parses refuses the CONNECT with the reason, and keeps nothing of what it says.
        routes.write_text("dex.a.lab=10.0.0.1:443\n")
        with pytest.raises(aiohttp.ClientHttpProxyError) as e:
            async with s.get("https://dex.a.lab/", proxy=url, ssl=ctx):
                pass
        assert e.value.status == 502
    with pytest.raises(ValueError, match="loopback only"):
        proxy.write_routes(routes, {"dex.a.lab": "10.0.0.1:443"})


def test_the_proxy_command_writes_its_port_and_stops_on_sigterm(tmp_path):
    import time

    port_file = tmp_path / "port"
    with subprocess.Popen([sys.executable, "-m", "lab.real.proxy", "--port-file", str(port_file),
                           "--map", "dex.a.lab=127.0.0.1:1"], cwd=ROOT, stderr=subprocess.PIPE, text=True) as proc:
        try:
            deadline = time.monotonic() + 20
            while not port_file.exists():
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the proxy wrote no port file within 20 s"
                time.sleep(0.05)
            assert int(port_file.read_text()) > 0
        finally:
            proc.terminate()
            assert proc.wait(10) == 0
    bad = subprocess.run([sys.executable, "-m", "lab.real.proxy", "--port-file", str(port_file),
                          "--map", "dex.a.lab=10.1.1.1:1"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "targets are loopback only" in bad.stderr


# --- the build's checks ---

def test_the_pinned_versions_come_from_the_go_mod_files():
    assert builder.KUBE.version() == "v1.37.2"
    assert builder.ETCD.version().startswith("v3.6.")
    kube_mod = (builder.KUBE.module_dir / "go.mod").read_text()
    # Every staging module that k8s.io/kubernetes replaces with ./staging and requires is replaced by v0.37.2.
    replaced = {line.split()[0] for line in kube_mod.splitlines() if "=> k8s.io/" in line}
    assert {"k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiserver", "k8s.io/client-go",
            "k8s.io/apiextensions-apiserver", "k8s.io/kube-aggregator"} <= replaced
    assert all(f"{m} => {m} v0.37.2" in kube_mod for m in replaced)
    for comp in builder.COMPONENTS:
        assert (comp.module_dir / "go.sum").stat().st_size > 0


def test_the_cache_is_keyed_by_version_outside_the_work_tree(tmp_path, monkeypatch):
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    bins = builder.binaries()
    assert bins.kube_apiserver == tmp_path / "cache" / "kube" / "v1.37.2" / "kube-apiserver"
    assert bins.etcd.parent == tmp_path / "cache" / "etcd" / builder.ETCD.version()
    monkeypatch.delenv(builder.CACHE_ENV)
    assert not builder.cache_root().is_relative_to(ROOT)


def test_missing_binaries_name_the_command_that_builds_them(tmp_path):
    with pytest.raises(builder.BuildError, match=r"not built \(etcd v3\.6\.\d+, kube v1\.37\.2 missing.*"
                                                 r"run `python -m lab\.real build`"):
        builder.require_built(tmp_path)


def test_a_stamp_is_current_only_for_the_same_sources_and_binaries(tmp_path):
    target = builder.component_dir(builder.ETCD, tmp_path)
    target.mkdir(parents=True)
    (target / "etcd").write_text("#!/bin/sh\n")
    (target / "etcd").chmod(0o755)
    stamp = builder._stamp(builder.ETCD, "go1.26.8")
    (target / "stamp.json").write_text(json.dumps(stamp))
    assert builder._is_current(builder.ETCD, target)
    (target / "stamp.json").write_text(json.dumps(dict(stamp, sources="0" * 64)))
    assert not builder._is_current(builder.ETCD, target)
    (target / "stamp.json").write_text(json.dumps(stamp))
    (target / "etcd").unlink()
    assert not builder._is_current(builder.ETCD, target)


def test_the_kube_build_sets_the_release_version(monkeypatch, tmp_path):
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path))
    flags = builder._go_build_flags(builder.KUBE)
    assert flags[0] == "-trimpath"
    assert flags[1].startswith("-ldflags=-s -w ")
    assert "-X=k8s.io/component-base/version.gitVersion=v1.37.2" in flags[1]
    assert "-X=k8s.io/component-base/version.gitMinor=37" in flags[1]


def test_no_go_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(builder, "GO_CANDIDATES", ())
    with pytest.raises(builder.BuildError, match=r"no `go` on PATH.*needs Go 1\.26 or newer"):
        builder.build(root=pathlib.Path("/nonexistent-cache"))


@pytest.mark.skipif(shutil.which("go") is None and not os.access("/usr/local/go/bin/go", os.X_OK),
                    reason="needs a go command to see what it says when the module proxy is unreachable")
def test_an_unreachable_module_proxy_is_quoted(tmp_path, monkeypatch):
    dead = closed_port()  # a port nobody listens on: connection refused at once
    monkeypatch.setenv("GOPROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("GOSUMDB", "off")
    monkeypatch.setattr(builder, "HEARTBEAT_SECONDS", 0.5)
    said = []
    with pytest.raises(builder.BuildError) as e:
        builder.build(root=tmp_path / "cache", say=said.append)
    msg = str(e.value)
    assert "downloading the modules of etcd failed" in msg
    assert "the go command said:" in msg and "connection refused" in msg
    assert "The Go module proxy could not be reached" in msg
    assert said[0].startswith("etcd v3.6.")
    # One component's failure does not keep the others from being tried: each is named.
    assert "downloading the modules of kube failed" in msg and "downloading the modules of dex failed" in msg
    assert "dex v2.41.1 (github.com/dexidp/dex v0.0.0-20240807174518-43956db7fd75): NOT BUILT" in said


@pytest.mark.parametrize("require, code, banner", [
    ("", 0, "SKIPPING THE REAL KUBE-APISERVER BACKEND OR UPSTREAM DEX, whichever is not built"),
    ("1", 1, "THE REAL COMPONENTS (etcd, kube, dex, promtool) CANNOT BE BUILT, and PEERING_REQUIRE_REAL_APISERVER "
             "is set"),
])
def test_an_optional_build_skips_loudly_unless_required(monkeypatch, tmp_path, capsys, require, code, banner):
    from lab.real.__main__ import main

    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(builder.REQUIRE_ENV, require)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(builder, "GO_CANDIDATES", ())
    assert main(["build", "--optional"]) == code
    err = capsys.readouterr().err
    assert banner in err and "no `go` on PATH" in err
    # Without --optional it is always a failure, said in one line.
    assert main(["build"]) == 1
    assert capsys.readouterr().err.startswith("python -m lab.real build: no `go` on PATH")


def test_paths_says_what_is_missing(monkeypatch, tmp_path, capsys):
    from lab.real.__main__ import main

    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path))
    assert main(["paths"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {}
    assert "run `python -m lab.real build`" in err
    assert err.count("\n") == 3 and "REAL KUBE-APISERVER BACKEND NOT TESTED: " in err
    assert ("UPSTREAM DEX NOT TESTED (the differential test of the lab's Dex): upstream Dex is not built "
            "(dex v2.41.1") in err
    assert "PROMQL NOT PARSED (the chart's alerts and dashboard queries, by promtool): promtool is not built" in err
    # Dex built, the control plane not: the paths of what is there, and one line for each of what is not.
    _fake_build(builder.DEX, tmp_path)
    assert main(["paths"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"dex": str(tmp_path / "dex" / "v2.41.1" / "dex"), "dex_version": "v2.41.1"}
    assert "UPSTREAM DEX" not in err and "REAL KUBE-APISERVER BACKEND NOT TESTED" in err and "PROMQL" in err


def _fake_build(component, root):
    target = builder.component_dir(component, root)
    target.mkdir(parents=True)
    for binary, _ in component.commands:
        (target / binary).write_text("#!/bin/sh\n")
        (target / binary).chmod(0o755)
    (target / "stamp.json").write_text(json.dumps(builder._stamp(component, "go1.26.8")))


def test_upstream_dex_is_pinned_by_the_commit_of_its_release():
    assert builder.DEX.version() == "v0.0.0-20240807174518-43956db7fd75"
    assert builder.DEX.release() == "v2.41.1"
    mod = (builder.DEX.module_dir / "go.mod").read_text()
    # Dex's own go.mod points its API module at ./api/v2; ours takes the first published one its server compiles with.
    assert "github.com/dexidp/dex/api/v2 v2.2.0" in mod and "=>" not in mod
    assert builder.component_dir(builder.DEX, pathlib.Path("/c")) == pathlib.Path("/c/dex/v2.41.1")
    flags = builder._go_build_flags(builder.DEX)
    assert flags == ["-trimpath", "-ldflags=-s -w -X=main.version=v2.41.1"]
    assert builder.DEX.cgo and not builder.KUBE.cgo and not builder.ETCD.cgo
    # The kube backend does not need Dex, nor Dex the kube backend.
    assert builder.DEX not in builder.CONTROL_PLANE


def test_an_unknown_dex_pin_says_what_to_add(monkeypatch):
    monkeypatch.setattr(builder, "DEX_RELEASES", {})
    with pytest.raises(builder.BuildError, match=r"DEX_RELEASES in build\.py does not name.*add the release tag"):
        builder.DEX.release()


def test_missing_dex_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(builder.BuildError, match=r"upstream Dex is not built \(dex v2\.41\.1 missing.*"
                                                 r"run `python -m lab\.real build`"):
        builder.require_dex(tmp_path)
    _fake_build(builder.DEX, tmp_path)
    assert builder.require_dex(tmp_path) == tmp_path / "dex" / "v2.41.1" / "dex"


def test_dex_needs_a_c_compiler_and_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(builder.BuildError, match=r"dex v2\.41\.1 .* is built with cgo .* no C compiler \(gcc or cc\)"
                                                 r" on PATH: install one \(Debian: apt-get install gcc\)"):
        builder._component_env(builder.DEX, {})
    env = {"CGO_ENABLED": "0"}
    assert builder._component_env(builder.ETCD, env) is env


def test_build_takes_the_components_by_name(capsys):
    from lab.real.__main__ import main

    assert builder.by_name([]) == builder.COMPONENTS
    assert builder.by_name(["dex", "etcd"]) == (builder.ETCD, builder.DEX)
    with pytest.raises(SystemExit) as e:
        main(["build", "apiserver"])
    assert e.value.code == 2
    assert "no component 'apiserver': choose from etcd, kube, dex, promtool" in capsys.readouterr().err


def test_a_failed_go_build_quotes_go_and_not_its_package_list(tmp_path):
    script = ("echo k8s.io/api/core/v1; echo '# example.com/x'; echo 'x.go:3:7: undefined: y'; "
              "echo golang.org/x/net; exit 1")
    with pytest.raises(builder.BuildError) as e:
        builder._run_go(["sh", "-c", script], tmp_path, dict(os.environ), "building x", lambda m: None,
                        count_lines=True)
    said = str(e.value).partition("the go command said:")[2]
    assert said.split() == ["#", "example.com/x", "x.go:3:7:", "undefined:", "y"]


def test_a_control_plane_refuses_bad_names_and_maps_before_starting(tmp_path):
    from lab.real import RealControlPlane

    with pytest.raises(ValueError, match="cluster name 'A_b'"):
        RealControlPlane("A_b", tmp_path)
    with pytest.raises(ValueError, match=r"resolve\['dex.a.lab'\] = '10.0.0.1:443': give .* 127.0.0.1:PORT"):
        RealControlPlane("a", tmp_path, resolve={"dex.a.lab": "10.0.0.1:443"})


def test_the_dex_runner_sets_where_dex_listens_itself(tmp_path):
    from lab.real.upstream_dex import UpstreamDex

    with pytest.raises(ValueError, match="config sets storage, web: UpstreamDex sets those itself"):
        UpstreamDex(tmp_path, "https://dex.t.lab/", serving=None, ca_pem=b"", config={"storage": {}, "web": {}})
    dex = UpstreamDex(tmp_path, "https://dex.t.lab/dex/", serving=None, ca_pem=b"", config={})
    dex.port = 5556
    assert dex._ready_url() == "https://127.0.0.1:5556/dex/.well-known/openid-configuration"
    rendered = dex._render()
    assert rendered["storage"] == {"type": "memory"} and rendered["web"]["https"] == "127.0.0.1:5556"
    assert "http" not in rendered["web"]


# --- the Pods the lab writes for its replicas (lab/workload.py) ---

class _Exited:
    returncode = -9


@pytest.mark.parametrize("state, process, stopped_by, pod", [
    ("not started", None, None, "absent"),
    ("starting", None, None, None),
    ("running", _Exited(), None, "terminated"),
    ("exited (-9)", None, None, "terminated"),
    ("stopped (exit -9)", None, 9, "terminated"),
    ("stopped (exit 0)", None, 15, "absent"),
    ("stopping", None, 15, None),
])
def test_a_replicas_pod_follows_how_it_runs_and_how_it_ended(state, process, stopped_by, pod, tmp_path):
    replica = Replica(0, "lab-a", tmp_path / "ports.json", tmp_path / "peering.log", process=process, state=state,
                      stopped_by=stopped_by)
    assert pod_state(replica) == pod


def test_a_played_pod_is_ready_while_it_runs_and_ended_by_the_signal_after():
    assert [exit_code(c) for c in (None, 0, 1, -9, -15)] == [0, 0, 1, 137, 143]
    pod = {"spec": {"containers": [{"name": "peering", "image": "i"}, {"name": "proxy", "image": "j"}]}}
    running = pod_status(pod, running=True, restarts=2, exit_code=0)
    assert {c["type"]: c["status"] for c in running["conditions"]}["Ready"] == "True"
    assert [(c["name"], c["ready"], c["restartCount"], list(c["state"])) for c in running["containerStatuses"]] == \
        [("peering", True, 2, ["running"]), ("proxy", True, 2, ["running"])]
    ended = pod_status(pod, running=False, restarts=2, exit_code=137)
    assert ended["phase"] == "Running" and {c["type"]: c["status"] for c in ended["conditions"]}["Ready"] == "False"
    assert ended["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert ended["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
