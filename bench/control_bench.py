"""Benchmark of the control loop on lab clusters, each running the real `peering run` process.

    python -m bench.control_bench [--runs 5] [--peers 10] [--projects 200] [--capabilities 5] [--steady 60]
                                  [--scale-runs 3] [--skip-scale] [--results bench/RESULTS.md]

1. Join: time from creating the Join ClusterPeer to Active and Ready on both sides (median of --runs peerings
   between two clusters).
2. Offer: time for a change of our offer (a namespace added to a project) to reach the peer's status.peer, with
   the default periodic sync of 30 s, so what is measured is the notify path.
3. Scale: one cluster peered with --peers others, --projects same-named projects on every cluster and
   --capabilities capabilities opened on every peering; time from creating the peerings to every ClusterPeer on
   every cluster Active, Ready, all capabilities effective and all projects paired; then API writes per minute in
   steady state over --steady seconds, counted at the lab API servers (Lease renewals left out), and how often
   the hub's Lease changed hands meanwhile (it must not: one replica per cluster). Repeated --scale-runs times on
   fresh clusters; medians reported.

The results go to stdout as JSON and, with --results, into the "Control loop" section of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from lab.cluster import NAMESPACE, default_peering_command  # noqa: E402
from lab.testing import lab_clusters  # noqa: E402
from peering_lab import (API_VERSION, GROUP, WriteCounter, clusterpeer, connection_string, create_invite,  # noqa: E402
                         create_join, ready)

SECTION = "## Control loop"


def peering_command(cluster):
    return default_peering_command(cluster)


async def wait_for(fn, timeout: float, what: str, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout}s")


def is_ready(cluster, name: str) -> bool:
    return ready(clusterpeer(cluster, name)) == ("Active", "True", "PeeringReady")


async def bench_join(runs: int, workdir: pathlib.Path) -> dict:
    times = []
    async with lab_clusters(workdir / "join", ["a", "b"], peering_command=peering_command) as lab:
        a, b = lab["a"], lab["b"]
        for i in range(runs):
            create_invite(a, f"b-{i}")
            text = await connection_string(a, f"b-{i}")
            start = time.monotonic()
            create_join(b, f"a-{i}", text)
            await wait_for(lambda: is_ready(a, f"b-{i}") and is_ready(b, f"a-{i}"), 30, f"peering {i} ready")
            times.append(time.monotonic() - start)
        offer_times = []
        for i in range(runs):
            name = f"offer-{i}"
            if a.api.get("deckhouse.io", "projects", "p") is None:
                for c in (a, b):
                    c.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "p"}})
                    c.api.create({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": "p"}})
                await wait_for(lambda: all(any(p["name"] == "p" for p in
                                               (clusterpeer(b, f"a-{j}")["status"].get("peer") or {}).get("projects")
                                               or []) for j in range(runs)), 60, "project p in every offer")
            start = time.monotonic()
            a.api.create({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": name, "labels": {"projects.deckhouse.io/project": "p"}}})

            def arrived() -> bool:
                peer = clusterpeer(b, "a-0")["status"].get("peer") or {}
                return any(name in p.get("namespaces", []) for p in peer.get("projects") or [])
            await wait_for(arrived, 60, f"namespace {name} in b's status.peer")
            offer_times.append(time.monotonic() - start)
    return {"join_to_ready_both_sides_s": summary(times), "offer_change_to_peer_s": summary(offer_times)}


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": len(values)}


def seed_scale(cluster, projects: int, capabilities: int) -> None:
    api = cluster.api
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "consumers"}})
    for i in range(projects):
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"proj-{i}"}})
        api.create({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": f"proj-{i}"}})
    for i in range(capabilities):
        api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": f"cap-{i}"},
                    "spec": {"version": "v1",
                             "consumers": [{"kind": "ServiceAccount", "namespace": "consumers", "name": f"m{i}"}],
                             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}})


def converged(cluster, name: str, projects: int, capabilities: int) -> bool:
    obj = clusterpeer(cluster, name)
    if ready(obj) != ("Active", "True", "PeeringReady"):
        return False
    status = obj["status"]
    return len(status.get("effectiveCapabilities") or []) == capabilities and \
        status.get("pairedProjectsCount") == projects


async def peer_with_hub(lab, peers: int, caps: list[str], projects: int, timeout: float) -> float:
    """Invite s0..s<peers-1> from the hub with `caps`, join each, and wait until every peering on both sides has
    converged (`converged`); returns the seconds from the first invite to that."""
    hub = lab["hub"]
    start = time.monotonic()
    for i in range(peers):
        hub.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": f"s{i}"},
                        "spec": {"type": "Invite", "capabilities": caps}})
    for i in range(peers):
        text = await connection_string(hub, f"s{i}")
        lab[f"s{i}"].api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "hub"},
                                 "spec": {"type": "Join", "capabilities": caps, "join": {"connectionString": text}}})
    pairs = [(hub, f"s{i}") for i in range(peers)] + [(lab[f"s{i}"], "hub") for i in range(peers)]
    await wait_for(lambda: all(converged(c, n, projects, len(caps)) for c, n in pairs), timeout,
                   "every peering converged", interval=0.5)
    return time.monotonic() - start


async def bench_scale(peers: int, projects: int, capabilities: int, steady: float, workdir: pathlib.Path) -> dict:
    names = ["hub"] + [f"s{i}" for i in range(peers)]
    caps = [f"cap-{i}" for i in range(capabilities)]
    async with lab_clusters(workdir / "scale", names, peering_command=peering_command) as lab:
        hub = lab["hub"]
        for n in names:
            seed_scale(lab[n], projects, capabilities)
        start = time.monotonic()  # the first invite: peer_with_hub starts with it
        converge = await peer_with_hub(lab, peers, caps, projects, 1800)
        counters = [WriteCounter(lab[n]) for n in names]
        try:
            # The statuses are converged; the grants reconcilers may still be writing Roles. Everything is done
            # at the start of the first quiet stretch of 10 s (no write on any cluster).
            quiet_since, last = time.monotonic(), 0
            while time.monotonic() - quiet_since < 10:
                await asyncio.sleep(0.2)
                total = sum(c.total for c in counters)
                if total != last:
                    quiet_since, last = time.monotonic(), total
            converge_all = quiet_since - start
            for c in counters:
                c.counts.clear()
            await asyncio.sleep(steady)
            writes = {n: dict(c.counts) for n, c in zip(names, counters) if c.counts}
            total = sum(c.total for c in counters)
        finally:
            for c in counters:
                c.close()
        hub_objects = {r: len(hub.api.list("rbac.authorization.k8s.io", r)) for r in ("roles", "rolebindings")}
        hub_objects["projectpeers"] = len(hub.api.list(GROUP, "projectpeers"))
        lease = hub.api.get("coordination.k8s.io", "leases", "peering", NAMESPACE) or {}
    return {"peers": peers, "projects": projects, "capabilities": capabilities, "converge_s": round(converge, 2),
            "converge_all_writes_s": round(converge_all, 2),
            "steady_seconds": steady, "steady_writes_per_minute": round(total * 60 / steady, 2),
            "steady_writes": writes, "hub_objects": hub_objects,
            "hub_lease_transitions": int((lease.get("spec") or {}).get("leaseTransitions") or 0)}


def summarise_scale(runs: list[dict]) -> dict:
    """Medians over the scale runs, with each run's values kept."""
    first = runs[0]
    out = {k: first[k] for k in ("peers", "projects", "capabilities", "steady_seconds", "hub_objects")}
    for k in ("converge_s", "converge_all_writes_s", "steady_writes_per_minute", "hub_lease_transitions"):
        out[k] = summary([r[k] for r in runs])
    out["steady_writes"] = [r["steady_writes"] for r in runs if r["steady_writes"]]
    out["runs"] = runs
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def render(results: dict, command: str) -> str:
    j = results["join"]
    lines = [SECTION, "", f"Command: `{command}`  ", f"Machine: {machine()}  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| measurement | median | min | max | runs | target |", "|---|---|---|---|---|---|",
             "| Join created → Active and Ready on both sides | {median} s | {min} s | {max} s | {runs} | ≤ 2 s |"
             .format(**j["join_to_ready_both_sides_s"]),
             "| Offer change → in the peer's status.peer (periodic sync 30 s, so by notify) | {median} s | {min} s "
             "| {max} s | {runs} | ≤ 1 s |".format(**j["offer_change_to_peer_s"])]
    s = results.get("scale")
    if s:
        lines += ["", f"Scale: one cluster peered with {s['peers']} others, {s['projects']} same-named projects on "
                  f"each and {s['capabilities']} capabilities opened on every peering.", "",
                  "| measurement | median | min | max | runs | target |", "|---|---|---|---|---|---|",
                  "| Status convergence (every ClusterPeer of every cluster Active, Ready, all capabilities "
                  "effective, all projects paired) | {median} s | {min} s | {max} s | {runs} | |"
                  .format(**s["converge_s"]),
                  "| Full convergence (also every Role, binding and ProjectPeer written: the last write before 10 s "
                  "without any) | {median} s | {min} s | {max} s | {runs} | |".format(**s["converge_all_writes_s"]),
                  f"| API writes per minute in steady state (all clusters, Leases left out, over {s['steady_seconds']}"
                  " s) | {median} | {min} | {max} | {runs} | 0 |".format(**s["steady_writes_per_minute"]),
                  "| Changes of holder of the hub's Lease during the run | {median} | {min} | {max} | {runs} | 0 |"
                  .format(**s["hub_lease_transitions"]), "",
                  f"Objects on the hub: {json.dumps(s['hub_objects'])}"]
        if s["steady_writes"]:
            lines += ["", f"Steady-state writes seen: `{json.dumps(s['steady_writes'])}`"]
    return "\n".join(lines) + "\n"


def write_section(path: pathlib.Path, text: str) -> None:
    """Replace (or append) the "Control loop" section, leaving every other section as it is."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    start = old.find(SECTION + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    path.write_text(new)


async def main_async(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="control-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        results = {"join": await bench_join(args.runs, workdir)}
        print(json.dumps(results), flush=True)
        if not args.skip_scale:
            runs = []
            for i in range(args.scale_runs):
                runs.append(await bench_scale(args.peers, args.projects, args.capabilities, args.steady,
                                              workdir / f"run-{i}"))
                print(json.dumps(runs[-1]), flush=True)
            results["scale"] = summarise_scale(runs)
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.control_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--peers", type=int, default=10)
    p.add_argument("--projects", type=int, default=200)
    p.add_argument("--capabilities", type=int, default=5)
    p.add_argument("--steady", type=float, default=60.0)
    p.add_argument("--scale-runs", type=int, default=3, help="repetitions of the scale run, on fresh clusters")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--results", default=None, help="write the Control loop section of this Markdown file")
    args = p.parse_args(argv)
    results = asyncio.run(main_async(args))
    print(json.dumps(results, indent=2))
    if args.results:
        command = "python -m bench.control_bench " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(pathlib.Path(args.results), render(results, command.strip()))


if __name__ == "__main__":
    main()
