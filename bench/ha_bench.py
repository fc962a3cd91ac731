"""Failover with two replicas of the peering process per cluster (the chart's Deployment), on lab clusters a and b.

    python -m bench.ha_bench [--runs 5] [--steady 60] [--results bench/RESULTS.md]

1. SIGKILL of a's leader: the time until the other replica holds the Lease, and until it has reconciled a change
   made right after the kill (a new namespace of a paired project: only a leader writes the grant's Role into it).
   The killed replica is started again (it joins as a follower) before the next run.
2. SIGTERM of a's leader: the same; the stopping leader releases the Lease, so the other takes it at its next
   attempt instead of waiting out leaseDurationSeconds.
3. Steady state with two replicas on each cluster: API writes over --steady seconds counted at both emulated API
   servers (every client's, Lease renewals left out); it must be 0.

The results go to stdout as JSON and, with --results, into the "Replicas and failover" section of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import signal
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from bench.control_bench import machine, summary, wait_for  # noqa: E402
from control.config import LeaseSettings  # noqa: E402
from lab.testing import lab_clusters  # noqa: E402
from peering_lab import (API_VERSION, WriteCounter, clusterpeer, connection_string, create_invite,  # noqa: E402
                         create_join, fast_peering_command, ready)

SECTION = "## Replicas and failover"
CAP = "configmaps-reader"
PROJECT = "shop"


def seed(cluster) -> None:
    api = cluster.api
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "consumer"}})
    api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": CAP},
                "spec": {"version": "v1", "consumers": [{"kind": "ServiceAccount", "namespace": "consumer",
                                                         "name": "app"}],
                         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}})
    cluster.create_project(PROJECT)


async def peer(lab) -> None:
    a, b = lab["a"], lab["b"]
    for c in (a, b):
        seed(c)
    create_invite(a, "to-b")
    create_join(b, "to-a", await connection_string(a, "to-b"))
    for c, name in ((a, "to-b"), (b, "to-a")):
        obj = await wait_for(lambda: clusterpeer(c, name), 60, name)
        obj["spec"]["capabilities"] = [CAP]
        c.api.update(obj)
    for c, name in ((a, "to-b"), (b, "to-a")):
        await wait_for(lambda: ready(clusterpeer(c, name)) == ("Active", "True", "PeeringReady") and
                       ((clusterpeer(c, name).get("status") or {}).get("grants") or []), 120, f"{name} ready",
                       interval=0.05)


async def failover(lab, sig: int, run: int) -> dict:
    a = lab["a"]
    leader = await wait_for(a.leader, 60, "a leader", interval=0.05)
    survivor = next(r for r in a.replicas if r is not leader)
    # The follower must be a follower that has seen the leader renew (it has just started after a previous run).
    await asyncio.sleep(LeaseSettings().retry_period * 1.5)
    t0 = time.monotonic()
    stopping = asyncio.ensure_future(a.stop_replica(leader.index, sig))
    namespace = a.add_project_namespace(PROJECT, f"{signal.Signals(sig).name.lower()}-{run}")
    await wait_for(lambda: a.leader() is survivor, 120, "the survivor leads", interval=0.02)
    took_over = time.monotonic() - t0
    await wait_for(lambda: a.api.get("rbac.authorization.k8s.io", "roles", f"d8:peering:to-b:{CAP}", namespace),
                   120, "the change reconciled", interval=0.02)
    reconciled = time.monotonic() - t0
    await stopping
    await a.start_replica(leader.index)
    return {"signal": signal.Signals(sig).name, "took_over_s": round(took_over, 3),
            "reconciled_s": round(reconciled, 3)}


async def steady(lab, seconds: float) -> dict:
    counters = [WriteCounter(lab[n]) for n in ("a", "b")]
    try:
        # The first quiet stretch of 10 s (no write on either cluster) ends what the failovers started.
        quiet_since, last = time.monotonic(), -1
        while time.monotonic() - quiet_since < 10:
            await asyncio.sleep(0.2)
            total = sum(c.total for c in counters)
            if total != last:
                quiet_since, last = time.monotonic(), total
        for c in counters:
            c.counts.clear()
        transitions = {n: lab[n].leader().identity for n in ("a", "b")}
        await asyncio.sleep(seconds)
        writes = {n: dict(c.counts) for n, c in zip("ab", counters) if c.counts}
        total = sum(c.total for c in counters)
        same = {n: lab[n].leader().identity for n in ("a", "b")} == transitions
    finally:
        for c in counters:
            c.close()
    return {"seconds": seconds, "writes": total, "writes_by_resource": writes, "leaders_unchanged": same}


async def main_async(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="ha-bench-") as tmp:
        async with lab_clusters(pathlib.Path(tmp), ["a", "b"], peering_command=fast_peering_command,
                                replicas=2) as lab:
            await peer(lab)
            runs = []
            for i in range(args.runs):
                for sig in (signal.SIGKILL, signal.SIGTERM):
                    runs.append(await failover(lab, sig, i))
                    print(json.dumps(runs[-1]), flush=True)
            quiet = await steady(lab, args.steady)
            print(json.dumps(quiet), flush=True)
    out = {"lease": {"duration": LeaseSettings().duration, "renew_deadline": LeaseSettings().renew_deadline,
                     "retry_period": LeaseSettings().retry_period}, "steady": quiet, "runs": runs}
    for name in ("SIGKILL", "SIGTERM"):
        mine = [r for r in runs if r["signal"] == name]
        out[name] = {"took_over_s": summary([r["took_over_s"] for r in mine]),
                     "reconciled_s": summary([r["reconciled_s"] for r in mine])}
    return out


def render(results: dict, command: str) -> str:
    lease = results["lease"]
    rows = []
    for name, how in (("SIGKILL", "killed (SIGKILL)"), ("SIGTERM", "stopped (SIGTERM)")):
        r = results[name]
        rows.append(f"| Leader {how} → the other replica holds the Lease | {{median}} s | {{min}} s | {{max}} s | "
                    f"{{runs}} |".format(**r["took_over_s"]))
        rows.append(f"| Leader {how} → a change made after it reconciled by the other | {{median}} s | {{min}} s | "
                    f"{{max}} s | {{runs}} |".format(**r["reconciled_s"]))
    s = results["steady"]
    lines = [SECTION, "", f"Command: `{command}`  ", f"Machine: {machine()}  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "Two lab clusters, a and b, each with two replicas of `peering run` behind its ingress and passthroughs "
             f"(`replicas=2`), peered, one capability and one paired project. Lease: leaseDurationSeconds "
             f"{lease['duration']:g}, renew deadline {lease['renew_deadline']:g} s, retry period "
             f"{lease['retry_period']:g} s (jittered up to +20% for candidates).", "",
             "| measurement | median | min | max | runs |", "|---|---|---|---|---|", *rows, "",
             f"API writes in steady state with two replicas per cluster, over {s['seconds']:g} s, counted at both "
             f"emulated API servers (Lease renewals left out): **{s['writes']}** (target 0); the leaders did "
             f"{'not change' if s['leaders_unchanged'] else 'CHANGE'} meanwhile."]
    if s["writes_by_resource"]:
        lines += ["", f"Writes seen: `{json.dumps(s['writes_by_resource'])}`"]
    lines += ["", "What the figures are: a killed leader does not release its Lease, so the other replica takes it "
              "once the record has not changed for leaseDurationSeconds on its own clock, at its next attempt: the "
              "last renewal was up to a retry period before the kill, so the takeover lands between duration − "
              "retry period and duration + 1.2 × retry period after it. A leader stopped with SIGTERM releases the "
              "Lease on its way out and the other takes it at its next attempt (at most 1.2 × retry period). The "
              "reconcile of the change follows the takeover closely (the difference of the two rows): the "
              "survivor's informers are warm, so it needs no resync before reconciling."]
    return "\n".join(wrap(line) for line in lines) + "\n"


def wrap(line: str, width: int = 115) -> str:
    """A paragraph wrapped as the rest of RESULTS.md is; tables, headings and short lines as they are."""
    if len(line) <= width or line.startswith(("|", "#", "Command:")):
        return line
    return "\n".join(textwrap.wrap(line, width, break_on_hyphens=False))


def write_section(path: pathlib.Path, text: str, section: str = SECTION) -> None:
    """Replace (or append) `section` (by default "Replicas and failover"), leaving every other section as it is."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    start = old.find(section + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(section))
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    path.write_text(new)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ha_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="failovers of each kind")
    p.add_argument("--steady", type=float, default=60.0, help="seconds of steady state counted")
    p.add_argument("--results", default=None, help="write the Replicas and failover section of this Markdown file")
    args = p.parse_args(argv)
    if args.runs < 1 or args.steady <= 0:
        p.error("--runs must be at least 1 and --steady positive")
    results = asyncio.run(main_async(args))
    print(json.dumps(results, indent=2))
    if args.results:
        command = "python -m bench.ha_bench " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(pathlib.Path(args.results), render(results, command.strip()))


if __name__ == "__main__":
    main()
