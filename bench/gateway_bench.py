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
import datetime
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time

from bench.gateway_rig import (NGINX, WRK, driver_body, free_port, latency_summary, make_pki, median_runs, nginx_conf,
                               pss_kib, start_nginx, stop, target_nginx_body, upstream_body, wait_port, wait_quiet, wrk)
from bench.gateway_roles import hold, serve_gateway, stubs


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
