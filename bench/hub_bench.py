"""The hub: one lab cluster peered with many others, each with the same-named projects, every cluster running the
real `peering run` on its own emulated API server.

    python -m bench.hub_bench [--peers 20] [--projects 200] [--capabilities 1] [--churn 30] [--results FILE]

Measured on the hub: the time from creating the peerings to every ClusterPeer on every cluster Active, Ready, its
capabilities effective and all projects paired; the resident memory (VmRSS, and VmHWM, its peak) of the hub's
peering process once converged and after the churn; and the latency of the hub's `/readyz` (its ops listener,
polled every 100 ms) while projects are added to and removed from the hub for --churn seconds (one every 200 ms,
alternating), with how many of the polls failed or answered other than 200. The peers are honest lab clusters
(their own API server, Dex, user-authn and peering process); with fewer peers than the hub should hold, give more
projects each so that the total stays, and say so.

The results go to stdout as JSON and, with --results, into the "Hub" section of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from bench.control_bench import converged, machine, seed_scale, wait_for  # noqa: E402
from bench.ha_bench import wrap, write_section  # noqa: E402
from lab.cluster import default_peering_command  # noqa: E402
from lab.testing import lab_clusters  # noqa: E402
from peering_lab import API_VERSION, connection_string  # noqa: E402

SECTION = "## Hub"


def memory(pid: int) -> dict:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def churn_and_poll(hub, seconds: float) -> dict:
    """Projects added and removed on the hub while its /readyz is polled."""
    latencies: list[float] = []
    bad: list[str] = []
    stop = asyncio.Event()

    async def poll() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    async with http.get(f"http://127.0.0.1:{hub.ports['ops']}/readyz") as r:
                        await r.read()
                        if r.status != 200:
                            bad.append(str(r.status))
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    bad.append(type(e).__name__)
                latencies.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(0.1)

    poller = asyncio.create_task(poll())
    changes = 0
    deadline = time.monotonic() + seconds
    i = 0
    try:
        while time.monotonic() < deadline:
            name = f"churn-{i}"
            hub.create_project(name)
            changes += 1
            await asyncio.sleep(0.2)
            hub.api.delete("deckhouse.io", "projects", name)
            hub.api.delete("", "namespaces", name)
            changes += 1
            await asyncio.sleep(0.2)
            i += 1
    finally:
        stop.set()
        await poller
    return {"seconds": seconds, "changes": changes, "polls": len(latencies), "failed_polls": bad,
            "readyz_ms": {"median": round(statistics.median(latencies), 1), "p99": round(percentile(latencies, 99), 1),
                          "max": round(max(latencies), 1)}}


async def run(peers: int, projects: int, capabilities: int, churn: float, workdir: pathlib.Path) -> dict:
    names = ["hub"] + [f"s{i}" for i in range(peers)]
    caps = [f"cap-{i}" for i in range(capabilities)]
    t_start = time.monotonic()
    async with lab_clusters(workdir, names, peering_command=default_peering_command, ready_timeout=300) as lab:
        started = time.monotonic() - t_start
        hub = lab["hub"]
        idle = memory(hub.process.pid)
        for n in names:
            seed_scale(lab[n], projects, capabilities)
        start = time.monotonic()
        for i in range(peers):
            hub.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": f"s{i}"},
                            "spec": {"type": "Invite", "capabilities": caps}})
        for i in range(peers):
            text = await connection_string(hub, f"s{i}")
            lab[f"s{i}"].api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "hub"},
                                     "spec": {"type": "Join", "capabilities": caps,
                                              "join": {"connectionString": text}}})
        pairs = [(hub, f"s{i}") for i in range(peers)] + [(lab[f"s{i}"], "hub") for i in range(peers)]
        await wait_for(lambda: all(converged(c, n, projects, capabilities) for c, n in pairs), 3600,
                       "every peering converged", interval=0.5)
        converge = time.monotonic() - start
        converged_memory = memory(hub.process.pid)
        churned = await churn_and_poll(hub, churn)
        after = memory(hub.process.pid)
    return {"peers": peers, "projects": projects, "capabilities": capabilities, "clusters_started_s": round(started, 1),
            "converge_s": round(converge, 1), "hub_memory_mib": {"idle": idle, "converged": converged_memory,
                                                                 "after_churn": after}, "churn": churned}


def render(r: dict, command: str) -> str:
    m = r["hub_memory_mib"]
    c = r["churn"]
    lines = [SECTION, "", f"Command: `{command}`  ", f"Machine: {machine()}  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"One hub peered with {r['peers']} lab clusters (each its own emulated API server, Dex, user-authn and "
             f"peering process, all on this machine), {r['projects']} same-named projects on every cluster "
             f"({r['peers'] * r['projects']} paired projects on the hub), {r['capabilities']} capability opened on "
             f"every peering. One run (the {len(r.get('runs', [r]))} below).", "",
             "| measurement | value |", "|---|---|",
             f"| Peerings created → every ClusterPeer of every cluster Active, Ready, capabilities effective, all "
             f"projects paired | {r['converge_s']} s |",
             f"| Hub's peering process, VmRSS: started and idle / converged / after the churn | {m['idle']['VmRSS']} / "
             f"{m['converged']['VmRSS']} / {m['after_churn']['VmRSS']} MiB (peak {m['after_churn']['VmHWM']} MiB) |",
             f"| Hub's `/readyz` latency under churn ({c['changes']} project adds and removes in {c['seconds']:g} s; "
             f"{c['polls']} polls) | median {c['readyz_ms']['median']} ms, p99 {c['readyz_ms']['p99']} ms, max "
             f"{c['readyz_ms']['max']} ms; {len(c['failed_polls'])} failed |"]
    return "\n".join(wrap(line) for line in lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hub_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", type=int, default=20)
    p.add_argument("--projects", type=int, default=200)
    p.add_argument("--capabilities", type=int, default=1)
    p.add_argument("--churn", type=float, default=30.0, help="seconds of project churn while /readyz is polled")
    p.add_argument("--results", default=None, help="write the Hub section of this Markdown file")
    args = p.parse_args(argv)
    if args.peers < 1 or args.projects < 1 or args.capabilities < 1 or args.churn <= 0:
        p.error("--peers, --projects and --capabilities must be at least 1 and --churn positive")

    async def go() -> dict:
        with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp:
            return await run(args.peers, args.projects, args.capabilities, args.churn, pathlib.Path(tmp))

    results = asyncio.run(go())
    print(json.dumps(results, indent=2))
    if args.results:
        command = "python -m bench.hub_bench " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(pathlib.Path(args.results), render(results, command.strip()), SECTION)


if __name__ == "__main__":
    main()
