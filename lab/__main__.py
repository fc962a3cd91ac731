"""`python -m lab up|down|serve`: run lab clusters in the background for tests, benchmarks and the demo.

    python -m lab up --clusters a,b --dir DIR     start clusters a and b, return once all are ready
    python -m lab down --dir DIR                  stop them and wait until they are gone
    python -m lab serve --clusters a,b --dir DIR  the same clusters in the foreground (what `up` runs)

`--no-peering` starts the clusters without the peering process; `--peering-arg=FLAG` (repeatable) passes one
more flag to `peering run`. `--without-crd NAME` (repeatable) starts every cluster without that CRD, e.g.
`projects.deckhouse.io` (no multitenancy-manager) or `tokenexchangeproviders.deckhouse.io` (a user-authn
without the feature); `--without-crd CLUSTER:NAME` leaves it out of one cluster only. Installing the CRD later
(`kubectl apply` of lab/apiserver/crds/*.yaml) makes the API appear while everything runs.

`--apiserver real` runs each cluster's API server as a real etcd + kube-apiserver + kube-controller-manager
(lab/real/, built once by `python -m lab.real build`) instead of the in-process emulator (`--apiserver emulator`,
the default); everything else is the same.

`--replicas N` runs N peering processes per cluster (the chart's Deployment runs 2), each with its own Lease
identity `lab-<cluster>-<i>`, ports and log (`DIR/<cluster>/peering.log` for the first, `peering-<i>.log` for the
others); the ingress and the passthroughs spread connections across the live ones. The default is 1.

`up` writes DIR/lab.json (per cluster: uuid, resolver map, CA bundles, file paths), DIR/<cluster>/kubeconfig for
a cluster-admin (`kubectl --kubeconfig DIR/a/kubeconfig get namespaces`), DIR/lab.pid and logs in DIR/lab.log
and DIR/<cluster>/peering.log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

from lab.cluster import (APISERVERS, MAX_REPLICAS, ROOT, Lab, check_cluster_name, check_crd_names,
                         default_peering_command)

log = logging.getLogger("lab")

UP_TIMEOUT = 180.0
DOWN_TIMEOUT = 60.0


def _pid_file(d: pathlib.Path) -> pathlib.Path:
    return d / "lab.pid"


def _read_pid(d: pathlib.Path) -> int | None:
    try:
        return int(_pid_file(d).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_lab_process(pid: int) -> bool:
    """Alive and really a `python -m lab serve`: a pid file may outlive its process and the pid be reused."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):  # exited, waiting to be reaped: gone for our purposes
        return False
    return b"lab" in cmdline and b"serve" in cmdline


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _clusters(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give cluster names separated by commas, e.g. a,b")
    for name in names:
        try:
            check_cluster_name(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"cluster names {value!r}: each name once")
    return names


def _replicas(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"--replicas {value!r}: give a whole number of peering processes per "
                                         f"cluster from 1 to {MAX_REPLICAS}")
    return n


def _without_crd(value: str) -> str:
    """NAME or CLUSTER:NAME, checked against the CRDs the lab installs."""
    cluster, sep, name = value.rpartition(":")
    try:
        if sep:
            check_cluster_name(cluster)
        check_crd_names([name])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def without_crds(values: list[str], clusters: list[str]) -> dict[str, list[str]]:
    """The CRDs each cluster starts without, from --without-crd values (NAME for all, CLUSTER:NAME for one)."""
    out: dict[str, list[str]] = {c: [] for c in clusters}
    for value in values:
        cluster, sep, name = value.rpartition(":")
        if sep and cluster not in out:
            raise ValueError(f"--without-crd {value}: there is no cluster {cluster!r} (clusters: "
                             f"{', '.join(clusters)})")
        for c in ([cluster] if sep else clusters):
            if name not in out[c]:
                out[c].append(name)
    return out


def cmd_up(args: argparse.Namespace) -> int:
    d = pathlib.Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    pid = _read_pid(d)
    if pid is not None and _is_lab_process(pid):
        print(f"a lab already runs from {d} (pid {pid}); stop it with: python -m lab down --dir {d}", file=sys.stderr)
        return 1
    try:
        without_crds(args.without_crd, args.clusters)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.apiserver == "real":
        from lab.real import build as builder

        try:
            builder.require_built()
        except builder.BuildError as e:
            print(f"--apiserver real needs the real backend's binaries: {e}", file=sys.stderr)
            return 2
    (d / "lab.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "lab", "serve", "--clusters", ",".join(args.clusters), "--dir", str(d),
           "--apiserver", args.apiserver, "--replicas", str(args.replicas)]
    if args.no_peering:
        cmd.append("--no-peering")
    cmd += [f"--peering-arg={a}" for a in args.peering_arg]
    cmd += [f"--without-crd={n}" for n in args.without_crd]
    with open(d / "lab.log", "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=str(ROOT),
                                start_new_session=True)
    _pid_file(d).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + args.timeout
    while True:
        code = proc.poll()
        if code is not None:
            _pid_file(d).unlink(missing_ok=True)
            print(f"the lab failed to start (exit {code}); {d / 'lab.log'} ends with:\n{_tail(d / 'lab.log')}",
                  file=sys.stderr)
            return 1
        try:
            info = json.loads((d / "lab.json").read_text())
        except (OSError, ValueError):
            info = None
        if info and info.get("ready"):
            break
        if time.monotonic() > deadline:
            proc.terminate()
            try:
                proc.wait(timeout=DOWN_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _pid_file(d).unlink(missing_ok=True)
            print(f"the lab was not ready within {args.timeout:.0f}s; stopped it. {d / 'lab.log'}:\n"
                  f"{_tail(d / 'lab.log')}", file=sys.stderr)
            return 1
        time.sleep(0.1)  # bounded poll of another process's file
    for name, c in info["clusters"].items():
        replicas = c["peering"].get("replicas") or []
        print(f"cluster {name}: {c['apiserver']} API server {c['apiServer']}, uuid {c['uuid']}, kubeconfig "
              f"{c['files']['kubeconfig']}, peering {c['peering']['state']}"
              + (f" ({len(replicas)} replicas: {', '.join(r['identity'] for r in replicas)})"
                 if len(replicas) > 1 else ""))
    print(f"lab ready: {d / 'lab.json'}; stop it with: python -m lab down --dir {d}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    d = pathlib.Path(args.dir).resolve()
    pid = _read_pid(d)
    if pid is None or not _is_lab_process(pid):
        _pid_file(d).unlink(missing_ok=True)
        print(f"no lab runs from {d}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while _is_lab_process(pid):
        if time.monotonic() > deadline:
            print(f"the lab (pid {pid}) did not stop within {args.timeout:.0f}s; killing it", file=sys.stderr)
            os.killpg(pid, signal.SIGKILL)
            break
        time.sleep(0.1)  # bounded poll: the process is not our child, nothing to wait on
    _pid_file(d).unlink(missing_ok=True)
    print(f"lab in {d} stopped")
    return 0


def with_extra_args(extra: list[str]):
    """The default peering command with `extra` flags appended (e.g. shorter sync intervals for a demo)."""
    def command(cluster):
        cmd = default_peering_command(cluster)
        return None if cmd is None else cmd + list(extra)
    return command


async def _serve(args: argparse.Namespace) -> int:
    d = pathlib.Path(args.dir).resolve()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lab = Lab(d, args.clusters, peering_command=None if args.no_peering else with_extra_args(args.peering_arg),
              without_crds=without_crds(args.without_crd, args.clusters), apiserver=args.apiserver,
              replicas=args.replicas)
    start = asyncio.ensure_future(lab.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([start, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not start.done():
        # Asked to stop while starting: starting cleans up after itself when cancelled.
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
        return 0
    stopped.cancel()
    await asyncio.gather(stopped, return_exceptions=True)
    try:
        start.result()
    except Exception:
        log.exception("the lab failed to start")
        return 1
    _pid_file(d).write_text(f"{os.getpid()}\n")
    log.info("lab ready: %s", d / "lab.json")
    await stop.wait()
    log.info("stopping the lab")
    await lab.stop()
    info = json.loads((d / "lab.json").read_text())
    info["ready"] = False
    (d / "lab.json").write_text(json.dumps(info, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--clusters", type=_clusters, default=["a", "b"], help="cluster names, e.g. a,b")
        p.add_argument("--dir", required=True, help="directory for lab.json, kubeconfigs and logs")
        p.add_argument("--no-peering", action="store_true", help="do not start the peering process")
        p.add_argument("--peering-arg", action="append", default=[], metavar="FLAG",
                       help="one more flag for `peering run`, e.g. --peering-arg=--log-level=debug (repeatable)")
        p.add_argument("--without-crd", action="append", default=[], type=_without_crd, metavar="[CLUSTER:]NAME",
                       help="start without this CRD, e.g. projects.deckhouse.io; CLUSTER:NAME for one cluster only "
                            "(repeatable)")
        p.add_argument("--apiserver", choices=APISERVERS, default="emulator",
                       help="each cluster's API server: the in-process emulator (default) or a real kube-apiserver")
        p.add_argument("--replicas", type=_replicas, default=1, metavar="N",
                       help=f"peering processes per cluster, 1 to {MAX_REPLICAS} (default 1; the chart runs 2)")
        p.add_argument("--timeout", type=float, default=UP_TIMEOUT, help="seconds to wait for readiness")
    p = sub.add_parser("down")
    p.add_argument("--dir", required=True)
    p.add_argument("--timeout", type=float, default=DOWN_TIMEOUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "up":
        return cmd_up(args)
    if args.command == "down":
        return cmd_down(args)
    # The background process hosts every cluster's emulated API server: on uvloop its small GETs cost about a
    # fifth less CPU and a watch about a fifth of the memory (bench/RESULTS.md, "Lab API server").
    import uvloop

    return uvloop.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
