"""Benchmark of the lab's emulated kube-apiserver, so that it is never what limits a benchmark of the gateway.

    python -m bench.apiserver_bench [--quick] [--runs 5] [--seconds 10] [--watches 1000,5000,10000]
                                    [--uvloop] [--profile out-prefix] [--out bench/out/apiserver.json]

The emulator runs in its own process (internal subcommand `serve`), on 127.0.0.1 with an OS-chosen port, with
the module's CRDs, a ConfigMap `default/small`, a ClusterPeer `small` and a ServiceAccount `default/reader` that
RBAC allows to get exactly those two (a Role and a ClusterRole, each with its binding).

- Small GETs/s: wrk (keep-alive TLS, `-t1 -c64` as the gateway benchmark's keep-alive figure) with the
  ServiceAccount's bearer token, for the ConfigMap and the ClusterPeer; median of `--runs` runs of `--seconds`.
  wrk cannot present a client certificate, so GETs with the admin certificate are not measured: a Python client
  presenting one would be slower than the server and measure itself (certificate authentication is cached per
  DER, as token authentication is per token, so the server's path differs only in the cache key).
- Watches held: this process opens N watches on the ConfigMap over TLS with the admin client certificate
  (one connection each, as kube clients do), then patches the ConfigMap and measures the time until every
  watcher read the MODIFIED event; the emulator's RSS growth per watch is read from /proc.
- `--uvloop`: everything again with the emulator on uvloop (the lab runs it on the stdlib loop);
  `--part gets|watches` measures one part only.
- `--profile PREFIX`: one more run per resource with py-spy recording the emulator; PREFIX-<resource>.txt gets
  the collapsed stacks and the report gets the functions where the samples were.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import pathlib
import platform
import re
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"
WRK = "/usr/bin/wrk"
CONNECTIONS = 64   # the gateway benchmark's keep-alive load: wrk -t1 -c64
CONFIGMAP_PATH = "/api/v1/namespaces/default/configmaps/small"
CLUSTERPEER_PATH = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers/small"
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


# ----- the emulator's process -----------------------------------------------------------------------------------
def serve(state_path: str, use_uvloop: bool) -> None:
    if use_uvloop:
        import uvloop
        uvloop.run(_serve(pathlib.Path(state_path)))
    else:
        asyncio.run(_serve(pathlib.Path(state_path)))   # the stdlib loop, as the lab runs the emulator


async def _serve(state_path: pathlib.Path) -> None:
    from lab.apiserver.testing import start_test_apiserver

    raise_nofile()
    d = state_path.parent
    server, kubeconfig, cert_pem, key_pem, ca_pem = await start_test_apiserver(d / "server", crd_paths=[CHART_CRDS],
                                                                               name="bench")
    try:
        server.create({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "small", "namespace": "default"}, "data": {"key": "value"}})
        server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                       "metadata": {"name": "small"}, "spec": {"type": "Invite"}})
        sa = server.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "reader", "namespace": "default"}})
        subject = [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]
        server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "reader", "namespace": "default"},
                       "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
        server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "reader", "namespace": "default"}, "subjects": subject,
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}})
        server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": "bench-reader"},
                       "rules": [{"apiGroups": ["peering.deckhouse.io"], "resources": ["clusterpeers"],
                                  "verbs": ["get"]}]})
        server.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                       "metadata": {"name": "bench-reader"}, "subjects": subject,
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                   "name": "bench-reader"}})
        token, _ = server.sa_issuer.issue("default", "reader", sa["metadata"]["uid"], [], 6 * 3600)
        files = {}
        for name, data in (("ca.crt", ca_pem), ("admin.crt", cert_pem), ("admin.key", key_pem),
                           ("token", token.encode())):
            path = d / name
            path.touch(mode=0o600)
            path.write_bytes(data)
            files[name] = str(path)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": server.port, "url": server.url, "files": files}))
        tmp.rename(state_path)   # the parent polls for the file: it appears whole
        await stopped.wait()
    finally:
        await server.stop()


def raise_nofile() -> int:
    """Raise the soft limit on open files to the hard one (each watch holds a socket on both sides)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Emulator:
    """The emulator in a child process, stopped by its PID (SIGTERM, then SIGKILL) on close."""

    def __init__(self, d: pathlib.Path, use_uvloop: bool = False, timeout: float = 60.0) -> None:
        state = d / "state.json"
        cmd = [sys.executable, "-m", "bench.apiserver_bench", "serve", "--state", str(state)]
        self.proc = subprocess.Popen(cmd + (["--uvloop"] if use_uvloop else []),
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not state.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the emulator exited with {self.proc.returncode} before it served: "
                                   f"{self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the emulator did not start within {timeout} s")
            time.sleep(0.05)
        self.state = json.loads(state.read_text())
        self.url = self.state["url"]
        self.files = self.state["files"]
        self.token = pathlib.Path(self.files["token"]).read_text()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()

    def __enter__(self) -> "Emulator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----- small GETs with wrk ----------------------------------------------------------------------------------------
def parse_wrk(out: str) -> dict:
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found:
        raise RuntimeError(f"wrk printed no rate; its output was:\n{out[-2000:]}")
    lat = {f"p{pct}": float(v) * _UNITS[u]
           for pct, v, u in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors:.*", out)
    return {"rps": float(found.group(1)), "total": int(re.search(r"(\d+) requests in", out).group(1)),
            "latency_ms": lat, "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sock.group(0) if sock else ""}


def wrk(url: str, token: str, seconds: float, pid: int) -> dict:
    # The token goes to wrk on its command line: it is a throwaway token of a throwaway emulator, never printed.
    cmd = [WRK, "-t", "1", "-c", str(CONNECTIONS), "-d", f"{seconds:g}s", "--latency", "--timeout", "10s",
           "-H", f"Authorization: Bearer {token}", url]
    cpu0 = cpu_seconds(pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    result = parse_wrk(out)
    result["server_cpu_us_per_request"] = round((cpu_seconds(pid) - cpu0) * 1e6 / max(result["total"], 1), 1)
    if result["non2xx"]:
        raise RuntimeError(f"{result['non2xx']} of {result['total']} requests to {url} were not 2xx: the bench's "
                           "RBAC setup or token is wrong, so the rate would measure errors")
    return result


def median_of(results: list[dict]) -> dict:
    """Median rate, and the median of each latency percentile and of the server's CPU per request, over runs."""
    def med(values):
        values = sorted(values)
        return values[len(values) // 2]
    return {"rps": med(r["rps"] for r in results),
            "latency_ms": {p: med(r["latency_ms"][p] for r in results) for p in results[0]["latency_ms"]},
            "server_cpu_us_per_request": med(r["server_cpu_us_per_request"] for r in results),
            "runs_rps": [round(r["rps"], 1) for r in results]}


def measure_gets(emu: Emulator, runs: int, seconds: float) -> dict:
    out = {}
    for name, path in (("configmap", CONFIGMAP_PATH), ("clusterpeer", CLUSTERPEER_PATH)):
        wrk(emu.url + path, emu.token, 2, emu.pid)   # warm the authentication and RBAC caches
        out[name] = median_of([wrk(emu.url + path, emu.token, seconds, emu.pid) for _ in range(runs)])
    return out


def profile_gets(emu: Emulator, path: str, seconds: float, prefix: str) -> dict:
    """py-spy on the emulator during one run of GETs of `path`: where its samples were (self and inclusive)."""
    pyspy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
    raw = pathlib.Path(prefix + ".txt")
    spy = subprocess.Popen([pyspy, "record", "--pid", str(emu.pid), "--duration", str(int(seconds)), "--rate", "200",
                            "--format", "raw", "--output", str(raw), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wrk(emu.url + path, emu.token, seconds, emu.pid)
        spy.wait(seconds + 60)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait()
        spy.stderr.close()
    return summarize_profile(raw.read_text())


def summarize_profile(collapsed: str, top: int = 15) -> dict:
    """From py-spy's collapsed stacks: the share of samples per leaf function and per function on the stack."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r" \(/.*?([^/]+/[^/]+\.py)", r" (\1", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n

    def share(counter):
        return [(f, round(100.0 * n / total, 1)) for f, n in counter.most_common(top)]
    return {"samples": total, "self_percent": share(own) if total else [],
            "inclusive_percent": share(inclusive) if total else []}


# ----- watches ----------------------------------------------------------------------------------------------------
async def measure_watches(emu: Emulator, levels: list[int], timeout: float) -> list[dict]:
    import aiohttp

    ctx = ssl.create_default_context(cafile=emu.files["ca.crt"])
    ctx.load_cert_chain(emu.files["admin.crt"], emu.files["admin.key"])
    connector = aiohttp.TCPConnector(limit=0, ssl=ctx)
    results = []
    streams: list[asyncio.Task] = []
    seen: dict[int, float] = {}
    pending_rv: list[str] = [""]
    all_seen = asyncio.Event()
    opened = 0
    slots = asyncio.Semaphore(64)   # handshakes in flight; more only queue in the kernel's backlog
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.get(emu.url + CONFIGMAP_PATH) as resp:
            rv = (await resp.json())["metadata"]["resourceVersion"]
        watch_url = (emu.url + "/api/v1/namespaces/default/configmaps?watch=true&fieldSelector=metadata.name%3Dsmall"
                     f"&resourceVersion={rv}")

        async def one(i: int, ready: asyncio.Future) -> None:
            async with slots:
                resp = await session.get(watch_url)
            try:
                if resp.status != 200:
                    raise RuntimeError(f"watch {i} was answered {resp.status}: {(await resp.text())[:300]}")
                ready.set_result(None)
                async for line in resp.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch {i} was ended by the emulator: {event['object'].get('message')}")
                    if event["object"]["metadata"].get("resourceVersion") == pending_rv[0] and i not in seen:
                        seen[i] = time.monotonic()
                        if len(seen) == len(streams):
                            all_seen.set()
            finally:
                resp.release()

        baseline = rss_kib(emu.pid)
        try:
            for n in levels:
                started = time.monotonic()
                readies = []
                while opened < n:
                    ready = asyncio.get_running_loop().create_future()
                    streams.append(asyncio.create_task(one(opened, ready)))
                    readies.append(ready)
                    opened += 1
                done, _ = await asyncio.wait(readies, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
                failed = [t for t in streams if t.done() and t.exception()]
                if failed or len(done) < len(readies):
                    reason = failed[0].exception() if failed else f"only {len(done)} of {len(readies)} opened"
                    results.append({"watches": n, "error": f"could not hold {n} watches within {timeout} s: {reason}"})
                    break
                open_s = time.monotonic() - started
                rss = rss_kib(emu.pid)
                # The change: one patch, timed from the moment it is sent to the last watcher's read.
                seen.clear()
                all_seen.clear()
                t0 = time.monotonic()
                async with session.patch(emu.url + CONFIGMAP_PATH, data=json.dumps({"data": {"n": str(n)}}),
                                         headers={"Content-Type": "application/merge-patch+json"}) as resp:
                    pending_rv[0] = (await resp.json())["metadata"]["resourceVersion"]
                    patched = time.monotonic() - t0
                # Watchers may have read the event before the patch's answer arrived: count them now.
                if len(seen) == len(streams):
                    all_seen.set()
                try:
                    await asyncio.wait_for(all_seen.wait(), timeout)
                except asyncio.TimeoutError:
                    results.append({"watches": n, "error": f"only {len(seen)} of {n} watchers saw the change "
                                                           f"within {timeout} s"})
                    break
                times = sorted(t - t0 for t in seen.values())
                results.append({
                    "watches": n, "open_seconds": round(open_s, 2), "patch_answer_ms": round(patched * 1000, 1),
                    "first_ms": round(times[0] * 1000, 1), "median_ms": round(times[len(times) // 2] * 1000, 1),
                    "all_ms": round(times[-1] * 1000, 1), "server_rss_mib": round(rss / 1024, 1),
                    "server_rss_kib_per_watch": round((rss - baseline) / n, 1)})
        finally:
            for t in streams:
                t.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
    return results


# ----- the run ----------------------------------------------------------------------------------------------------
def machine() -> dict:
    model = "unknown"
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    wrk_version = subprocess.run([WRK, "-v"], capture_output=True, text=True).stdout.splitlines()
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version(), "openssl": ssl.OPENSSL_VERSION,
            "wrk": wrk_version[0] if wrk_version else "", "nofile": raise_nofile()}


def gateway_rate(results_md: pathlib.Path) -> list[float]:
    """The gateway's keep-alive req/s with 1 worker, as the Gateway section of RESULTS.md records it."""
    for line in results_md.read_text().splitlines():
        if line.startswith("| keep-alive req/s, 1 worker"):
            cell = line.split("|")[2]
            return [float(x.replace(",", "")) for x in re.findall(r"[\d,]+(?:\.\d+)?", cell)]
    return []


def run(args: argparse.Namespace) -> dict:
    if not os.path.exists(WRK):
        raise SystemExit("wrk is needed for this benchmark: apt-get install wrk")
    report: dict = {"machine": machine(), "load_before": os.getloadavg(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "command": "python -m bench.apiserver_bench " + " ".join(args.argv),
                    "connections": CONNECTIONS}
    levels = [int(x) for x in args.watches.split(",") if x]
    limit = report["machine"]["nofile"] - 200
    if any(n > limit for n in levels):
        report["watch_levels_dropped"] = [n for n in levels if n > limit]
        levels = [n for n in levels if n <= limit]
    with tempfile.TemporaryDirectory(prefix="apiserver-bench-") as tmp:
        loops = [False, True] if args.uvloop else [False]
        if args.part in ("all", "gets"):
            for use_uvloop in loops:
                with Emulator(_subdir(tmp, f"gets-{use_uvloop}"), use_uvloop=use_uvloop) as emu:
                    suffix = "_uvloop" if use_uvloop else ""
                    report["gets" + suffix] = measure_gets(emu, args.runs, args.seconds)
                    report["load_after_gets" + suffix] = os.getloadavg()
                    if args.profile and not use_uvloop:
                        report["profile"] = {name: profile_gets(emu, path, args.seconds, f"{args.profile}-{name}")
                                             for name, path in (("configmap", CONFIGMAP_PATH),
                                                                ("clusterpeer", CLUSTERPEER_PATH))}
        if args.part in ("all", "watches"):
            for use_uvloop in loops:
                # A fresh emulator for the watches, so the memory baseline is not the GET phase's leftovers.
                with Emulator(_subdir(tmp, f"watches-{use_uvloop}"), use_uvloop=use_uvloop) as emu:
                    report["watches_uvloop" if use_uvloop else "watches"] = asyncio.run(
                        measure_watches(emu, levels, args.watch_timeout))
    report["load_after"] = os.getloadavg()
    gw = gateway_rate(ROOT / "bench" / "RESULTS.md")
    report["gateway_keepalive_rps_per_worker"] = gw
    if gw and "gets" in report:
        slowest = min(report["gets"][k]["rps"] for k in report["gets"])
        report["ratio_to_gateway"] = [round(slowest / g, 2) for g in gw]
    return report


def _subdir(tmp: str, name: str) -> pathlib.Path:
    p = pathlib.Path(tmp) / name
    p.mkdir()
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        p = argparse.ArgumentParser(prog="apiserver_bench serve")
        p.add_argument("serve")
        p.add_argument("--state", required=True)
        p.add_argument("--uvloop", action="store_true")
        served = p.parse_args(argv)
        serve(served.state, served.uvloop)
        return
    p = argparse.ArgumentParser(prog="python -m bench.apiserver_bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 run of 2 s, 200 watches: a smoke run")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--watches", default="1000,5000,10000", help="comma-separated numbers of watches to hold")
    p.add_argument("--watch-timeout", type=float, default=120.0, help="seconds allowed to open or notify a level")
    p.add_argument("--profile", default="", help="py-spy the emulator in one more run; writes PREFIX.txt")
    p.add_argument("--uvloop", action="store_true", help="measure again with the emulator on uvloop")
    p.add_argument("--part", choices=("all", "gets", "watches"), default="all", help="measure only this part")
    p.add_argument("--out", default="", help="write the report as JSON here too")
    args = p.parse_args(argv)
    args.argv = argv
    if args.quick:
        args.runs, args.seconds, args.watches = 1, 2.0, "200"
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
