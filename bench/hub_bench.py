"""The hub: one lab cluster peered with many others, each with the same-named projects, every cluster running the
real `peering run` on its own emulated API server.

    python -m bench.hub_bench [--peers 20] [--projects 200] [--capabilities 1] [--churn 30] [--runs 3]
                              [--results FILE]

Measured on the hub: the time from creating the peerings to every ClusterPeer on every cluster Active, Ready, its
capabilities effective and all projects paired; the resident memory (VmRSS, and VmHWM, its peak) of the hub's
peering process once converged and after the churn; and the latency of the hub's `/readyz` (its ops listener,
polled every 100 ms by a process of its own) while projects are added to and removed from the hub for --churn seconds (one every 200 ms,
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from bench.control_bench import machine, peer_with_hub, seed_scale, summary  # noqa: E402
from bench.ha_bench import wrap, write_section  # noqa: E402
from lab.cluster import default_peering_command  # noqa: E402
from lab.testing import lab_clusters  # noqa: E402

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


def poll_readyz(port: int, seconds: float) -> None:
    """`--poll-readyz PORT SECONDS`: GET /readyz every 100 ms for `seconds`, then print the latencies (ms) and the
    failures as JSON. It runs as its own process, so that the latency measured is the hub's, not that of the
    benchmark's event loop (which hosts every cluster's emulated API server)."""
    import http.client

    latencies: list[float] = []
    bad: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/readyz")
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status != 200:
                bad.append(str(resp.status))
        except OSError as e:
            bad.append(type(e).__name__)
        latencies.append((time.perf_counter() - t) * 1000)
        time.sleep(0.1)
    print(json.dumps({"latencies": latencies, "failed": bad}))


async def _poller(port: int, seconds: float) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.hub_bench", "--poll-readyz", str(port), str(seconds),
        stdout=asyncio.subprocess.PIPE, cwd=str(ROOT))


async def _polled(proc: asyncio.subprocess.Process) -> dict:
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the /readyz poller exited with {proc.returncode}")
    data = json.loads(out)
    lat = data["latencies"]
    return {"polls": len(lat), "failed_polls": data["failed"],
            "readyz_ms": {"median": round(statistics.median(lat), 1), "p99": round(percentile(lat, 99), 1),
                          "max": round(max(lat), 1)}}


async def quiet_poll(hub, seconds: float) -> dict:
    """/readyz of the converged hub with nothing changing, for comparison."""
    return await _polled(await _poller(hub.ports["ops"], seconds))


async def churn_and_poll(hub, seconds: float) -> dict:
    """Projects added and removed on the hub while its /readyz is polled (from another process)."""
    poller = await _poller(hub.ports["ops"], seconds)
    changes = 0
    deadline = time.monotonic() + seconds
    i = 0
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
    return {"seconds": seconds, "changes": changes, **await _polled(poller)}


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
        converge = await peer_with_hub(lab, peers, caps, projects, 3600)
        converged_memory = memory(hub.process.pid)
        quiet = await quiet_poll(hub, 10)
        churned = await churn_and_poll(hub, churn)
        after = memory(hub.process.pid)
    return {"peers": peers, "projects": projects, "capabilities": capabilities, "clusters_started_s": round(started, 1),
            "converge_s": round(converge, 1), "hub_memory_mib": {"idle": idle, "converged": converged_memory,
                                                                 "after_churn": after}, "quiet": quiet, "churn": churned}


def summarise(runs: list[dict]) -> dict:
    """Medians (with min and max) over the runs of what render shows; each run kept."""
    def pick(path: str) -> dict:
        values = []
        for r in runs:
            v = r
            for k in path.split("."):
                v = v[k]
            values.append(v)
        return summary(values)

    first = runs[0]
    return {**{k: first[k] for k in ("peers", "projects", "capabilities")},
            "clusters_started_s": pick("clusters_started_s"), "converge_s": pick("converge_s"),
            "rss_idle": pick("hub_memory_mib.idle.VmRSS"), "rss_converged": pick("hub_memory_mib.converged.VmRSS"),
            "rss_after_churn": pick("hub_memory_mib.after_churn.VmRSS"),
            "hwm": pick("hub_memory_mib.after_churn.VmHWM"),
            "churn_changes": pick("churn.changes"), "churn_seconds": first["churn"]["seconds"],
            "churn_median": pick("churn.readyz_ms.median"), "churn_p99": pick("churn.readyz_ms.p99"),
            "churn_max": pick("churn.readyz_ms.max"),
            "churn_failed": sum(len(r["churn"]["failed_polls"]) for r in runs),
            "churn_polls": sum(r["churn"]["polls"] for r in runs),
            "quiet_median": pick("quiet.readyz_ms.median"), "quiet_p99": pick("quiet.readyz_ms.p99"),
            "quiet_max": pick("quiet.readyz_ms.max"),
            "quiet_failed": sum(len(r["quiet"]["failed_polls"]) for r in runs),
            "quiet_polls": sum(r["quiet"]["polls"] for r in runs), "runs": runs}


def render(s: dict, command: str) -> str:
    def row(what: str, m: dict, unit: str) -> str:
        return f"| {what} | {m['median']} {unit} | {m['min']} {unit} | {m['max']} {unit} | {m['runs']} |"

    lines = [SECTION, "", f"Command: `{command}`  ", f"Machine: {machine()}  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"One hub peered with {s['peers']} lab clusters (each its own emulated API server, Dex, user-authn and "
             f"peering process, all on this machine), {s['projects']} same-named projects on every cluster "
             f"({s['peers'] * s['projects']} paired projects on the hub), {s['capabilities']} capability opened on "
             f"every peering; every run on fresh clusters ({s['peers'] + 1} started in "
             f"{s['clusters_started_s']['median']} s, median). `/readyz` is polled every 100 ms by a process of its "
             f"own; under churn a project is added to or removed from the hub every 200 ms "
             f"({s['churn_changes']['median']:g} changes in {s['churn_seconds']:g} s).", "",
             "| measurement | median | min | max | runs |", "|---|---|---|---|---|",
             row("Peerings created → every ClusterPeer of every cluster Active, Ready, capabilities effective, all "
                 "projects paired", s["converge_s"], "s"),
             row("Hub's peering process VmRSS, started and idle", s["rss_idle"], "MiB"),
             row("… converged", s["rss_converged"], "MiB"),
             row("… after the churn", s["rss_after_churn"], "MiB"),
             row("… its peak (VmHWM)", s["hwm"], "MiB"),
             row(f"Hub's `/readyz` under churn, median latency ({s['churn_polls']} polls, {s['churn_failed']} "
                 "failed)", s["churn_median"], "ms"),
             row("… p99", s["churn_p99"], "ms"), row("… max", s["churn_max"], "ms"),
             row(f"Hub's `/readyz` with nothing changing (10 s), median ({s['quiet_polls']} polls, "
                 f"{s['quiet_failed']} failed)", s["quiet_median"], "ms"),
             row("… p99", s["quiet_p99"], "ms"), row("… max", s["quiet_max"], "ms")]
    return "\n".join(wrap(line) for line in lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hub_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", type=int, default=20)
    p.add_argument("--projects", type=int, default=200)
    p.add_argument("--capabilities", type=int, default=1)
    p.add_argument("--churn", type=float, default=30.0, help="seconds of project churn while /readyz is polled")
    p.add_argument("--runs", type=int, default=3, help="runs, each on fresh clusters; medians reported")
    p.add_argument("--results", default=None, help="write the Hub section of this Markdown file")
    p.add_argument("--poll-readyz", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.poll_readyz:
        poll_readyz(int(args.poll_readyz[0]), float(args.poll_readyz[1]))
        return
    if min(args.peers, args.projects, args.capabilities, args.runs) < 1 or args.churn <= 0:
        p.error("--peers, --projects, --capabilities and --runs must be at least 1 and --churn positive")

    async def go() -> dict:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp:
                runs.append(await run(args.peers, args.projects, args.capabilities, args.churn, pathlib.Path(tmp)))
            print(json.dumps(runs[-1]), flush=True)
        return summarise(runs)

    results = asyncio.run(go())
    print(json.dumps(results, indent=2))
    if args.results:
        command = "python -m bench.hub_bench " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(pathlib.Path(args.results), render(results, command.strip()), SECTION)


if __name__ == "__main__":
    main()
