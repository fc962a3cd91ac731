"""A few-second check of the gateway benchmark's plumbing: wrk output parsing, process accounting, and that the
nginx configurations it generates are valid for the nginx on this machine. The benchmark itself is not a test."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gateway_rig", ROOT / "bench" / "gateway_rig.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WRK_OUTPUT = """Running 5s test @ http://127.0.0.1:1/api
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     7.10ms    2.00ms  40.00ms   90.00%
  Latency Distribution
     50%  710.00us
     75%    9.27ms
     90%   12.28ms
     99%    1.20s
  42461 requests in 5.00s, 10.00MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   8492.16
Transfer/sec:      2.00MB
"""


def test_wrk_output_is_parsed(bench):
    r = bench.parse_wrk(WRK_OUTPUT)
    assert r["rps"] == 8492.16 and r["total"] == 42461 and r["non2xx"] == 3
    assert r["latency_ms"] == {"p50": 0.71, "p75": 9.27, "p90": 12.28, "p99": 1200.0}


def test_latency_is_the_median_of_each_percentile_over_runs(bench):
    runs = [{"rps": rps, "latency_ms": {"p50": p50, "p99": p99}} for rps, p50, p99 in
            ((100.0, 1.0, 9.0), (300.0, 3.0, 2.0), (200.0, 2.0, 50.0))]
    summary = bench.latency_summary(runs)
    assert summary["rps"] == 200.0 and summary["latency_ms"] == {"p50": 2.0, "p99": 9.0}
    assert summary["p99_runs"] == [9.0, 2.0, 50.0]


def test_process_accounting_reads_this_process(bench):
    assert bench.pss_kib(os.getpid()) > 1000
    assert bench.cpu_seconds(os.getpid()) > 0


@pytest.mark.skipif(not os.path.exists("/usr/sbin/nginx"), reason="nginx is not installed")
def test_generated_nginx_configurations_are_valid(bench, tmp_path):
    files = bench.make_pki(tmp_path)
    bodies = {"upstream": bench.upstream_body(files, 1001, 1002),
              "target": bench.target_nginx_body(files, 1003, 1001),
              "driver": bench.driver_body(files, 1004, 1003, 1001)}
    for name, body in bodies.items():
        conf = bench.nginx_conf(tmp_path, name, 1, body)
        check = subprocess.run([bench.NGINX, "-t", "-c", str(conf), "-p", str(conf.parent)], capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0, check.stderr
    assert "ssl_verify_client on" in bodies["target"] and files["token"].count(".") == 2


async def test_the_raw_path_micro_benchmark_relays_every_request():
    from bench.gateway_micro import measure

    # measure() itself refuses to report when a request was not relayed upstream and answered.
    assert 0 < await measure(200, rounds=1) < 10_000


def _heap_per_connection(**kwargs) -> float | None:
    """`stdlib_heap_per_connection` measured in a process of its own: the heap in use is the whole process's, and
    in a test worker other threads (a kept control plane's readers, a lab's) allocate and free beside it (one such
    run measured -1.84 KiB per connection)."""
    code = ("import json; from bench.tls_micro import Certs, stdlib_heap_per_connection; "
            f"print(json.dumps(stdlib_heap_per_connection(Certs(), **{kwargs!r})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_tls_micro_benchmark_completes_client_authenticated_handshakes():
    from bench.tls_micro import Certs, handshake_cpu

    certs = Certs()
    # Each handshake asserts that the server received the client certificate: a figure means a full mTLS one.
    cpu = handshake_cpu(certs, handshakes=3)
    assert cpu["stdlib"] > 0 and cpu["pyopenssl"] > 0
    heap = _heap_per_connection(connections=20)
    assert heap is None or heap > 1
    with_ca = _heap_per_connection(connections=20, client_sends_ca=True)
    assert with_ca is None or with_ca > heap  # the server keeps the extra certificate it received
