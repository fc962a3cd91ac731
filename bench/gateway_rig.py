"""The rig of the gateway benchmark (bench/gateway_bench.py): processes and their accounting, the PKI, the nginx
configurations of the driver, the target and the upstream, and wrk with its output parsed."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
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


def make_token_from_dir(d: pathlib.Path) -> str:
    return (d / "token").read_text() if (d / "token").exists() else ""
