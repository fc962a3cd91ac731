"""Benchmark of the peering gateway against nginx as an equivalent mTLS-terminating proxy, on this machine.

    python -m bench.gateway_bench [--quick] [--out bench/out/gateway.json]
    python -m bench.gateway_bench --ab OTHER_CHECKOUT [--rounds 4] [--ab-memory]   # this gateway against another

Both targets get the same driver and the same upstream:

    wrk --(plain HTTP, keep-alive)--> driver nginx --(mTLS with the peer's client cert)--> TARGET
        --(TLS, pooled)--> upstream nginx (static API answers; watch requests go on to a Python event source)

TARGET is the gateway (token verified and exchanged once, then cache hits) or nginx (ssl_verify_client on,
proxy_pass with a fixed Authorization header), with the same number of workers. wrk cannot present a client
certificate, hence the driver nginx. Full handshakes go through a driver location that neither keeps nor resumes
TLS sessions. Memory is the PSS of the target's processes, measured with idle mTLS connections and with watches
that receive an event per second, held open by a Python client process.

Internal subcommands (run by the benchmark itself): serve-gateway, stubs, hold.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import pathlib
import platform
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

NGINX = "/usr/sbin/nginx"
WRK = "/usr/bin/wrk"
ENTRANCE = "peering-gateway.bench.lab"
API = "api.bench.lab"
DEX = "dex.bench.lab"
ISSUER = "https://issuer.peer.bench.lab"
CLUSTER = "11111111-1111-1111-1111-111111111111"
PEER_UUID = "22222222-2222-2222-2222-222222222222"
CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305"
PODLIST = ('{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":'
           '{"name":"pod-0","namespace":"default"}}]}')


# ----- helpers ----------------------------------------------------------------------------------------------------
def free_port() -> int:
    # nginx cannot report an OS-chosen port, so it gets one the OS just chose and released.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")
            time.sleep(0.05)


def pss_kib(pid: int) -> int:
    """PSS of a process and all its descendants, in KiB (shared pages counted once)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in pathlib.Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants so far."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    out, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = pathlib.Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for c in children:
            out.append(int(c))
            frontier.append(int(c))
    return out


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----- certificates and token -------------------------------------------------------------------------------------
def make_pki(d: pathlib.Path) -> dict:
    import trustme
    from jwcrypto import jwk, jwt
    # ECDSA P-256 everywhere, as the peering CA issues.
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    api_ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    files = {}

    def save(name: str, data: bytes) -> str:
        path = d / name
        path.write_bytes(data)
        path.chmod(0o600)
        files[name] = str(path)
        return str(path)

    entrance = ca.issue_cert(ENTRANCE)
    client = ca.issue_cert(f"{PEER_UUID}.peer")
    api = api_ca.issue_cert(API, DEX)
    save("ca.crt", ca.cert_pem.bytes())
    save("entrance.crt", entrance.cert_chain_pems[0].bytes())
    save("entrance.key", entrance.private_key_pem.bytes())
    save("client.crt", client.cert_chain_pems[0].bytes())
    save("client.key", client.private_key_pem.bytes())
    save("api-ca.crt", api_ca.cert_pem.bytes())
    save("api.crt", api.cert_chain_pems[0].bytes())
    save("api.key", api.private_key_pem.bytes())
    key = jwk.JWK.generate(kty="EC", crv="P-256", kid="bench-1")
    save("jwks.json", json.dumps({"keys": [key.export_public(as_dict=True)]}).encode())
    now = int(time.time())
    token = jwt.JWT(header={"alg": "ES256", "kid": "bench-1"}, claims={
        "iss": ISSUER, "sub": "system:serviceaccount:mod:controller", "aud": [f"peering.deckhouse.io/{CLUSTER}/read"],
        "iat": now, "nbf": now - 5, "exp": now + 6 * 3600})
    token.make_signed_token(key)
    save("token", token.serialize().encode())
    files["token"] = token.serialize()
    return files


# ----- nginx configurations ---------------------------------------------------------------------------------------
def nginx_conf(d: pathlib.Path, name: str, workers: int, body: str) -> pathlib.Path:
    prefix = d / name
    prefix.mkdir(exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
user root;
daemon off;
worker_processes {workers};
worker_rlimit_nofile 20000;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 12000; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 330s;
{body}
}}
""")
    return conf


def start_nginx(conf: pathlib.Path, cpus: str | None) -> subprocess.Popen:
    cmd = [NGINX, "-c", str(conf), "-p", str(conf.parent)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def upstream_body(f: dict, port: int, stubs_port: int) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{port} ssl reuseport backlog=4096;
        ssl_certificate {f['api.crt']};
        ssl_certificate_key {f['api.key']};
        location / {{
            if ($arg_watch) {{ rewrite ^ /__watch$uri last; }}
            default_type application/json;
            return 200 '{PODLIST}';
        }}
        location /__watch/ {{
            internal;
            proxy_pass http://127.0.0.1:{stubs_port}/;
            proxy_buffering off;
            proxy_http_version 1.1;
            proxy_read_timeout 3600s;
        }}
    }}"""


def target_nginx_body(f: dict, port: int, upstream_port: int) -> str:
    return f"""
    upstream api {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port} ssl reuseport backlog=4096;
        ssl_certificate {f['entrance.crt']};
        ssl_certificate_key {f['entrance.key']};
        ssl_client_certificate {f['ca.crt']};
        ssl_verify_client on;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_ciphers {CIPHERS};
        ssl_prefer_server_ciphers on;
        ssl_session_cache off;
        ssl_session_tickets off;
        ssl_conf_command NumTickets 0;
        large_client_header_buffers 4 32k;
        client_max_body_size 3m;
        location / {{
            proxy_pass https://api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {API};
            proxy_set_header Authorization "Bearer exchanged-token";
            proxy_set_header X-Forwarded-For "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 330s;
            proxy_ssl_trusted_certificate {f['api-ca.crt']};
            proxy_ssl_verify on;
            proxy_ssl_name {API};
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
        }}
    }}"""


def driver_body(f: dict, port: int, target_port: int, upstream_port: int) -> str:
    common = f"""
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {f['token']}";
            proxy_buffering off;
            proxy_ssl_trusted_certificate {f['ca.crt']};
            proxy_ssl_verify on;
            proxy_ssl_server_name on;
            proxy_ssl_certificate {f['client.crt']};
            proxy_ssl_certificate_key {f['client.key']};"""
    return f"""
    upstream target_keepalive {{ server 127.0.0.1:{target_port}; keepalive 512; }}
    upstream target_fresh {{ server 127.0.0.1:{target_port}; }}
    upstream direct {{ server 127.0.0.1:{upstream_port}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        location /fresh/ {{
            proxy_pass https://target_fresh/;
            proxy_ssl_name {ENTRANCE};
            proxy_ssl_session_reuse off;{common}
        }}
        location /direct/ {{
            proxy_pass https://direct/;
            proxy_ssl_name {API};
            proxy_ssl_trusted_certificate {f['api-ca.crt']};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_ssl_session_reuse on;
        }}
        location / {{
            proxy_pass https://target_keepalive;
            proxy_ssl_name {ENTRANCE};
            proxy_ssl_session_reuse on;{common}
        }}
    }}"""


# ----- wrk ----------------------------------------------------------------------------------------------------------
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(url: str, *, connections: int, seconds: float, delay_ms: int = 0, d: pathlib.Path,
        pid: int | None = None) -> dict:
    script = d / f"wrk-{delay_ms}.lua"
    script.write_text(f"function delay() return {delay_ms} end\n" if delay_ms else "")
    cmd = [WRK, "-t", "1", "-c", str(connections), "-d", f"{seconds}s", "--latency", "--timeout", "10s"]
    if delay_ms:
        cmd += ["-s", str(script)]
    cpu0 = cpu_seconds(pid) if pid else 0.0
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=seconds + 60).stdout
    cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    result = parse_wrk(out)
    result["target_cpu_us_per_request"] = round(cpu * 1e6 / max(result.pop("total"), 1), 1) if pid else None
    return result


def parse_wrk(out: str) -> dict:
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    lat = {}
    for pct, value, unit in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        lat[f"p{pct}"] = float(value) * _UNITS[unit]
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors:.*", out)
    return {"rps": rps, "latency_ms": lat, "non2xx": int(errors.group(1)) if errors else 0, "total": total,
            "socket_errors": socket_errors.group(0) if socket_errors else ""}


def median_runs(fn, runs: int) -> dict:
    results = [fn() for _ in range(runs)]
    results.sort(key=lambda r: r["rps"])
    mid = results[len(results) // 2]
    return {**mid, "runs_rps": [round(r["rps"], 1) for r in results]}


def latency_summary(results: list[dict]) -> dict:
    """Median of each latency percentile over runs (and the rates the runs reached)."""
    out: dict = {"rps": sorted(r["rps"] for r in results)[len(results) // 2], "latency_ms": {}}
    for pct in results[0]["latency_ms"]:
        values = sorted(r["latency_ms"].get(pct, 0.0) for r in results)
        out["latency_ms"][pct] = values[len(values) // 2]
    out["p99_runs"] = [r["latency_ms"].get("p99") for r in results]
    out["runs_rps"] = [round(r["rps"], 1) for r in results]
    return out


def wait_quiet(limit: float = 1.0, timeout: float = 180.0) -> list[float]:
    """Wait (bounded) for the 1-minute load average to drop below `limit`; returns the load averages seen."""
    deadline = time.monotonic() + timeout
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(2)
    return [round(x, 2) for x in os.getloadavg()]


# ----- the pieces under test ----------------------------------------------------------------------------------------
class Setup:
    def __init__(self, d: pathlib.Path, quick: bool, cpus: str | None) -> None:
        self.d = d
        self.quick = quick
        self.cpus = cpus
        self.f = make_pki(d)
        self.procs: list[subprocess.Popen] = []
        self.stubs_port = free_port()
        self.dex_port = free_port()
        self.upstream_port = free_port()
        self.stubs = self._spawn([sys.executable, "-m", "bench.gateway_bench", "stubs", "--dir", str(d),
                                  "--port", str(self.stubs_port), "--dex-port", str(self.dex_port)])
        wait_port(self.stubs_port)
        wait_port(self.dex_port)
        self.upstream = start_nginx(nginx_conf(d, "upstream", 1, upstream_body(self.f, self.upstream_port,
                                                                                 self.stubs_port)), None)
        self.procs.append(self.upstream)
        wait_port(self.upstream_port)

    def _spawn(self, cmd: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, **kw)
        self.procs.append(proc)
        return proc

    def target(self, kind: str, workers: int, cwd: str | None = None) -> tuple[subprocess.Popen, int]:
        """nginx, or the gateway of this checkout (of the checkout at `cwd` when given)."""
        port = free_port()
        if kind == "nginx":
            proc = start_nginx(nginx_conf(self.d, f"target-{workers}", workers,
                                          target_nginx_body(self.f, port, self.upstream_port)), self.cpus)
        else:
            cfg = {"port": port, "workers": workers, "dir": str(self.d), "upstream_port": self.upstream_port,
                   "dex_port": self.dex_port}
            cmd = [sys.executable, "-m", "bench.gateway_bench", "serve-gateway", json.dumps(cfg)]
            if self.cpus:
                cmd = ["taskset", "-c", self.cpus, *cmd]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("ready"):
                raise RuntimeError("the gateway did not start: " + line)
        self.procs.append(proc)
        wait_port(port)
        return proc, port

    def driver(self, target_port: int) -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = start_nginx(nginx_conf(self.d, f"driver-{target_port}", 1,
                                      driver_body(self.f, port, target_port, self.upstream_port)), None)
        self.procs.append(proc)
        wait_port(port)
        return proc, port

    def hold(self, port: int, n: int, watch: bool) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "bench.gateway_bench", "hold", "--dir", str(self.d), "--port", str(port),
               "--n", str(n)] + (["--watch"] if watch else [])
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop(proc, signal.SIGTERM)


def measure_target(s: Setup, kind: str, workers: int, *, memory: bool) -> dict:
    seconds = 3 if s.quick else 8
    runs = 1 if s.quick else 3
    target, tport = s.target(kind, workers)
    driver, dport = s.driver(tport)
    out: dict = {"kind": kind, "workers": workers}
    try:
        base = f"http://127.0.0.1:{dport}"
        wrk(base + "/api/v1/namespaces/default/pods", connections=64, seconds=2, d=s.d)  # warm pools and caches
        out["keepalive"] = median_runs(lambda: wrk(base + "/api/v1/namespaces/default/pods", connections=64,
                                                   seconds=seconds, d=s.d, pid=target.pid), runs)
        if workers == 1:
            half = out["keepalive"]["rps"] / 2
            conns = 16
            delay = max(1, round(conns * 1000 / half))
            # Added latency: runs through the target and straight to the upstream alternate at the same rate, so
            # that whatever else the machine does falls on both; p99 is the median of the runs' p99s.
            out["load_before_latency"] = [round(x, 2) for x in os.getloadavg()]
            through, direct = [], []
            for _ in range(5 if not s.quick else 1):
                through.append(wrk(base + "/api/v1/namespaces/default/pods", connections=conns, seconds=seconds,
                                   delay_ms=delay, d=s.d))
                direct.append(wrk(base + "/direct/api/v1/namespaces/default/pods", connections=conns,
                                  seconds=seconds, delay_ms=delay, d=s.d))
            out["half_load"] = latency_summary(through)
            out["half_load_direct"] = latency_summary(direct)
            out["handshakes"] = median_runs(lambda: wrk(base + "/fresh/api/v1/namespaces/default/pods",
                                                        connections=32, seconds=seconds, d=s.d, pid=target.pid), runs)
    finally:
        stop(driver)
        stop(target, signal.SIGTERM)
    if memory:
        out["memory"] = {label: measure_memory(s, kind, n, watch) for label, n, watch in (
            ("idle_mtls", 500 if s.quick else 5000, False), ("watches", 100 if s.quick else 1000, True))}
    return out


def measure_memory(s: Setup, kind: str, n: int, watch: bool, cwd: str | None = None) -> dict:
    """PSS growth of a fresh target (one worker; of the checkout at `cwd` when given) while `n` mTLS connections
    (or watches) are held open."""
    target, tport = s.target(kind, 1, cwd=cwd)
    driver, dport = s.driver(tport)
    try:
        # Warm: pools, caches and lazily built state exist before the baseline is taken.
        wrk(f"http://127.0.0.1:{dport}/api/v1/namespaces/default/pods", connections=8, seconds=1, d=s.d)
        before = pss_kib(target.pid)
        holder = s.hold(tport, n, watch)
        assert holder.stdout is not None and holder.stdin is not None
        ready = holder.stdout.readline().split()
        time.sleep(3)
        after = pss_kib(target.pid)
        holder.stdin.close()
        report = holder.stdout.read().split()
        holder.wait(60)
    finally:
        stop(driver)
        stop(target, signal.SIGTERM)
    opened = int(ready[1]) if len(ready) > 1 else 0
    fields = dict(zip(report[::2], report[1::2]))
    # "connections" are the ones the target still held when its memory was read (refused ones are left out).
    return {"connections": opened, "requested": n, "pss_before_kib": before, "pss_after_kib": after,
            "kib_per_connection": round((after - before) / max(opened, 1), 2),
            "events_received": int(fields.get("events", 0)), "closed_by_target": int(fields.get("closed", 0))}


def run(args: argparse.Namespace) -> dict:
    for tool in (NGINX, WRK):
        if not os.path.exists(tool):
            raise SystemExit(f"{tool} is needed for this benchmark: apt-get install nginx wrk")
    load_at_start = wait_quiet(timeout=10 if args.quick else 180)
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        s = Setup(pathlib.Path(tmp), args.quick, args.cpus)
        try:
            results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "python": platform.python_version(),
                                   "nginx": subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip(),
                                   "cpu_model": _cpu_model(), "loadavg_at_start": load_at_start},
                       "command": " ".join([os.path.basename(sys.executable), "-m", "bench.gateway_bench",
                                            *sys.argv[1:]]),
                       "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "targets": []}
            for kind in ("gateway", "nginx"):
                for workers in (1, 2):
                    print(f"measuring {kind} with {workers} worker(s)", file=sys.stderr, flush=True)
                    results["targets"].append(measure_target(s, kind, workers, memory=workers == 1))
        finally:
            s.close()
    results["summary"] = summarize(results)
    return results


PODS = "/api/v1/namespaces/default/pods"


def ab(args: argparse.Namespace) -> dict:
    """The keep-alive and handshake figures of one worker of the gateway of another checkout (`--ab`, e.g. a `git
    worktree` of an earlier commit), of this one and of nginx, in rounds that alternate the three, so that
    whatever else loads the machine falls on all alike. Each figure is one 8 s run; the summary gives the median
    over the rounds and, per round, the ratio to the nginx of that round."""
    other = pathlib.Path(args.ab).resolve()
    if not (other / "gateway" / "server.py").exists() or not (other / "bench" / "gateway_bench.py").exists():
        raise SystemExit(f"--ab {other}: not a checkout of this repository (no gateway/server.py or "
                         "bench/gateway_bench.py there); make one with git worktree add")
    for tool in (NGINX, WRK):
        if not os.path.exists(tool):
            raise SystemExit(f"{tool} is needed for this benchmark: apt-get install nginx wrk")
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gateway-ab-") as tmp:
        s = Setup(pathlib.Path(tmp), False, args.cpus)
        try:
            for _ in range(args.rounds):
                for label, kind, cwd in (("other", "gateway", str(other)), ("this", "gateway", None),
                                         ("nginx", "nginx", None)):
                    print(f"round {len(rounds) // 3 + 1}: {label}", file=sys.stderr, flush=True)
                    target, tport = s.target(kind, 1, cwd=cwd)
                    driver, dport = s.driver(tport)
                    try:
                        base = f"http://127.0.0.1:{dport}"
                        wrk(base + PODS, connections=64, seconds=2, d=s.d)  # warm pools and caches
                        load = [round(x, 2) for x in os.getloadavg()]
                        keepalive = wrk(base + PODS, connections=64, seconds=8, d=s.d, pid=target.pid)
                        handshakes = wrk(base + "/fresh" + PODS, connections=32, seconds=8, d=s.d, pid=target.pid)
                    finally:
                        stop(driver)
                        stop(target, signal.SIGTERM)
                    memory = {}
                    if kind == "gateway" and args.ab_memory:
                        # A fresh target for each: what holding connections costs, apart from what serving did.
                        memory = {part: measure_memory(s, kind, n, watch, cwd=cwd)["kib_per_connection"]
                                  for part, n, watch in (("idle_mtls", 2000, False), ("watches", 500, True))}
                    rounds.append({"target": label, "load": load, "keepalive": keepalive, "handshakes": handshakes,
                                   "memory_kib_per_connection": memory})
        finally:
            s.close()
    summary: dict = {}
    for label in ("other", "this", "nginx"):
        mine = [r for r in rounds if r["target"] == label]
        for part in ("keepalive", "handshakes"):
            for key in ("rps", "target_cpu_us_per_request"):
                values = sorted(r[part][key] for r in mine)
                summary[f"{label}_{part}_{key}_median"] = values[len(values) // 2]
    for label in ("other", "this"):
        for part in ("idle_mtls", "watches"):
            values = sorted(r["memory_kib_per_connection"][part] for r in rounds
                            if r["target"] == label and r["memory_kib_per_connection"])
            if values:
                summary[f"{label}_{part}_kib_per_connection_median"] = values[len(values) // 2]
        for part in ("keepalive", "handshakes"):
            ratios = sorted(g[part]["rps"] / n[part]["rps"] for g, n in zip(
                [r for r in rounds if r["target"] == label], [r for r in rounds if r["target"] == "nginx"]))
            summary[f"{label}_{part}_ratio_to_nginx_median"] = round(ratios[len(ratios) // 2], 3)
            summary[f"{label}_{part}_ratio_to_nginx_runs"] = [round(x, 3) for x in ratios]
    return {"command": " ".join([os.path.basename(sys.executable), "-m", "bench.gateway_bench", *sys.argv[1:]]),
            "started_loadavg": rounds[0]["load"] if rounds else None, "rounds": rounds, "summary": summary,
            "machine": {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "python": platform.python_version()}}


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _per_cpu(gateway: dict, nginx: dict) -> float | None:
    g, n = gateway.get("target_cpu_us_per_request"), nginx.get("target_cpu_us_per_request")
    return round(n / g, 3) if g and n else None


def summarize(results: dict) -> dict:
    t = {(r["kind"], r["workers"]): r for r in results["targets"]}
    g1, n1, g2, n2 = t[("gateway", 1)], t[("nginx", 1)], t[("gateway", 2)], t[("nginx", 2)]
    added = g1["half_load"]["latency_ms"].get("p99", 0) - g1["half_load_direct"]["latency_ms"].get("p99", 0)
    return {
        "keepalive_rps_ratio_1_worker": round(g1["keepalive"]["rps"] / n1["keepalive"]["rps"], 3),
        "keepalive_cpu_us_per_request_gateway_nginx": [g1["keepalive"]["target_cpu_us_per_request"],
                                                       n1["keepalive"]["target_cpu_us_per_request"]],
        "handshake_cpu_us_per_connection_gateway_nginx": [g1["handshakes"]["target_cpu_us_per_request"],
                                                          n1["handshakes"]["target_cpu_us_per_request"]],
        # Requests per CPU second relative to nginx: what one worker of each can serve when CPU is the limit, less
        # blurred than rps by wrk, the driver and the upstream sharing the machine's cores.
        "keepalive_per_cpu_ratio_1_worker": _per_cpu(g1["keepalive"], n1["keepalive"]),
        "handshake_per_cpu_ratio": _per_cpu(g1["handshakes"], n1["handshakes"]),
        "keepalive_rps_ratio_2_workers": round(g2["keepalive"]["rps"] / n2["keepalive"]["rps"], 3),
        "gateway_p99_added_ms_half_load": round(added, 3),
        "nginx_p99_added_ms_half_load": round(n1["half_load"]["latency_ms"].get("p99", 0)
                                              - n1["half_load_direct"]["latency_ms"].get("p99", 0), 3),
        "handshake_ratio": round(g1["handshakes"]["rps"] / n1["handshakes"]["rps"], 3),
        "gateway_scaling_1_to_2": round(g2["keepalive"]["rps"] / g1["keepalive"]["rps"], 3),
        "nginx_scaling_1_to_2": round(n2["keepalive"]["rps"] / n1["keepalive"]["rps"], 3),
        "gateway_kib_per_idle_mtls": g1["memory"]["idle_mtls"]["kib_per_connection"],
        "nginx_kib_per_idle_mtls": n1["memory"]["idle_mtls"]["kib_per_connection"],
        "gateway_kib_per_watch": g1["memory"]["watches"]["kib_per_connection"],
        # A watch holds two TLS connections (the client's and the one to the API server): per connection is half.
        "gateway_kib_per_watch_connection": round(g1["memory"]["watches"]["kib_per_connection"] / 2, 2),
        "nginx_kib_per_watch_connection": round(n1["memory"]["watches"]["kib_per_connection"] / 2, 2),
        "nginx_kib_per_watch": n1["memory"]["watches"]["kib_per_connection"],
    }


# ----- subcommand: the gateway under test ---------------------------------------------------------------------------
def serve_gateway(cfg_json: str) -> None:
    import uvloop
    profile = os.environ.get("GATEWAY_BENCH_PROFILE")
    if profile:
        # Profiles the single-process gateway for hot-path work: GATEWAY_BENCH_PROFILE=out.pstats
        import cProfile
        cProfile.runctx("uvloop.run(_serve_gateway(json.loads(cfg_json)))", globals(), locals(), profile)
        return
    if os.environ.get("GATEWAY_BENCH_LOOP") == "asyncio":
        asyncio.run(_serve_gateway(json.loads(cfg_json)))
        return
    uvloop.run(_serve_gateway(json.loads(cfg_json)))


async def _serve_gateway(cfg: dict) -> None:
    from gateway.config import GatewayConfig, Limits
    from contract.errors import Refusal
    from gateway.registry import Registry
    from gateway.server import Gateway

    d = pathlib.Path(cfg["dir"])
    read = lambda name: (d / name).read_bytes()  # noqa: E731

    class Handlers:
        async def peer_call(self, call):
            return {}

        async def join(self, call):
            raise Refusal(403, "Refused", "the benchmark does not join")

    config = GatewayConfig(public_domain_template="%s.bench.lab", api_server=f"https://{API}",
                           api_ca_pem=read("api-ca.crt"), dex_url=f"https://{DEX}", dex_ca_pem=read("api-ca.crt"),
                           dex_client_id="gateway", dex_client_secret=lambda: "secret",
                           resolve={API: f"127.0.0.1:{cfg['upstream_port']}", DEX: f"127.0.0.1:{cfg['dex_port']}"},
                           workers=cfg["workers"], entrance_port=cfg["port"], access_log=False,
                           # One peer holds every benchmark connection: its per-peer limit (2,000 by default)
                           # would refuse most of the 5,000 idle ones after their handshakes.
                           limits=Limits(max_connections=20000, max_connections_per_peer=20000))
    gw = Gateway(config, Handlers())
    await gw.start()
    gw.reload_certificates(entrance_cert_pem=read("entrance.crt"), entrance_key_pem=read("entrance.key"),
                           ca_pem=read("ca.crt"), egress_cert_pem=read("entrance.crt"),
                           egress_key_pem=read("entrance.key"))
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    gw.publish(Registry.from_objects(
        cluster_uuid=CLUSTER,
        clusterpeers=[{"metadata": {"name": "peer"}, "status": {"effectiveCapabilities": ["read"], "peer": {
            "clusterUUID": PEER_UUID, "issuer": {"url": ISSUER, "jwks": read("jwks.json").decode()}}}}],
        peer_secrets=[{"metadata": {"name": "peer-peer"}, "data": {"issued.crt": b64(read("client.crt"))}}],
        capabilities=[{"metadata": {"name": "read"}, "spec": {"version": "v1", "consumers": [
            {"namespace": "mod", "name": "controller"}]}, "status": {"conditions": [
                {"type": "Accepted", "status": "True"}]}}], generation=1))
    while gw.readiness()[0] is False:
        await asyncio.sleep(0.05)
    print("ready", gw.entrance_port, flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await gw.stop()


# ----- subcommand: Dex and the watch event source -------------------------------------------------------------------
def stubs(args: argparse.Namespace) -> None:
    import uvloop
    uvloop.run(_stubs(args))


async def _stubs(args: argparse.Namespace) -> None:
    from aiohttp import web
    d = pathlib.Path(args.dir)

    async def token(request: web.Request) -> web.Response:
        await request.post()
        return web.json_response({"access_token": "exchanged-token", "token_type": "bearer", "expires_in": 3600})

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        i = 0
        while True:
            i += 1
            await resp.write(b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"pod-0",'
                             b'"resourceVersion":"%d"}}}\n' % i)
            await asyncio.sleep(1)

    dex_app = web.Application()
    dex_app.router.add_post("/token", token)
    watch_app = web.Application()
    watch_app.router.add_get("/{tail:.*}", watch)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "api.crt", d / "api.key")
    runners = []
    for app, port, sslctx in ((dex_app, args.dex_port, ctx), (watch_app, args.port, None)):
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=sslctx, backlog=4096).start()
        runners.append(runner)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    for runner in runners:
        await runner.cleanup()


# ----- subcommand: hold many mTLS connections or watches open -----------------------------------------------------
def hold(args: argparse.Namespace) -> None:
    import uvloop
    uvloop.run(_hold(args))


async def _hold(args: argparse.Namespace) -> None:
    d = pathlib.Path(args.dir)
    # Each connection is made as a peer's egress makes it (gateway.tls.client_context): the client certificate
    # alone, as the driving nginx sends it too. A context that also sends the CA certificate along makes the
    # target decode and keep that certificate for the connection's life (5.5 KiB more with OpenSSL 3.0).
    from gateway.tls import client_context
    ctx = client_context((d / "ca.crt").read_bytes(), (d / "client.crt").read_bytes(), (d / "client.key").read_bytes())
    token = make_token_from_dir(d)
    events = 0
    writers = []
    ready = asyncio.Event()
    sem = asyncio.Semaphore(64)

    closed = 0

    async def one() -> None:
        nonlocal events, closed
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", args.port, ssl=ctx,
                                                           server_hostname=ENTRANCE)
            if args.watch:
                writer.write(f"GET /api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\nHost: {ENTRANCE}\r\n"
                             f"Authorization: Bearer {token}\r\n\r\n".encode())
                await reader.readuntil(b"\r\n\r\n")
        writers.append(writer)
        if len(writers) == args.n:
            ready.set()
        # A TLS 1.3 client finishes its handshake before the server has checked the client certificate, so a
        # connection the target refuses afterwards looks open here until its close arrives: count those.
        try:
            if args.watch:
                while await reader.readline():
                    events += 1
            else:
                await reader.read(1)
        except (ConnectionError, ssl.SSLError):
            pass
        closed += 1

    tasks = [asyncio.ensure_future(one()) for _ in range(args.n)]
    try:
        await asyncio.wait_for(ready.wait(), 180)
    except asyncio.TimeoutError:
        pass
    # Long enough for the target to have answered or refused every handshake it got.
    await asyncio.sleep(2)
    print("ready", len(writers) - closed, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print("events", events, "closed", closed, flush=True)
    for t in tasks:
        t.cancel()
    for w in writers:
        w.transport.abort()


def make_token_from_dir(d: pathlib.Path) -> str:
    return (d / "token").read_text() if (d / "token").exists() else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    parser.add_argument("--quick", action="store_true", help="short runs and fewer connections (a smoke run)")
    parser.add_argument("--cpus", default=None, help="taskset CPU list for the target, e.g. 1 (default: none)")
    parser.add_argument("--out", default="bench/out/gateway.json", help="where to write the JSON results")
    parser.add_argument("--ab", default=None, help="another checkout whose gateway is measured against this one")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of --ab (each measures all three targets)")
    parser.add_argument("--ab-memory", action="store_true",
                        help="--ab also measures memory per idle mTLS connection (2,000 held) and per watch (500)")
    g = sub.add_parser("serve-gateway")
    g.add_argument("config")
    st = sub.add_parser("stubs")
    st.add_argument("--dir")
    st.add_argument("--port", type=int)
    st.add_argument("--dex-port", type=int)
    h = sub.add_parser("hold")
    h.add_argument("--dir")
    h.add_argument("--port", type=int)
    h.add_argument("--n", type=int)
    h.add_argument("--watch", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "serve-gateway":
        serve_gateway(args.config)
    elif args.cmd == "stubs":
        stubs(args)
    elif args.cmd == "hold":
        hold(args)
    else:
        results = ab(args) if args.ab else run(args)
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
