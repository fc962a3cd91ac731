"""`python -m lab.real build|paths`: the real control plane's binaries, and the chart tests' promtool.

    python -m lab.real build              build etcd, kube-apiserver, kube-controller-manager and promtool into
                                          the cache
    python -m lab.real build --optional   the same, but when they cannot be built say why loudly and exit 0
                                          (exit 1 anyway when PEERING_REQUIRE_REAL_APISERVER=1): what `make test` runs
    python -m lab.real paths              print the binaries' paths as JSON (exit 1 when not built); `promtool`
                                          is there once it is built

`-p N` limits how many packages go compiles at once (for a machine short of memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from lab.real import build as builder


def _loud(msg: str) -> None:
    bar = "=" * 78
    print(f"{bar}\n{msg}\n{bar}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.real", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the binaries into the cache (reused when current)")
    b.add_argument("--optional", action="store_true",
                   help="when they cannot be built, say so and exit 0 unless PEERING_REQUIRE_REAL_APISERVER=1")
    b.add_argument("-p", type=int, default=None, metavar="N", help="go build -p N")
    sub.add_parser("paths", help="print where the binaries are, as JSON")
    args = parser.parse_args(argv)

    if args.command == "paths":
        try:
            bins = builder.require_built()
        except builder.BuildError as e:
            print(e, file=sys.stderr)
            return 1
        paths = {k: str(v) for k, v in dataclasses.asdict(bins).items()}
        try:
            paths["promtool"] = str(builder.promtool())
        except builder.BuildError as e:
            print(e, file=sys.stderr)
        print(json.dumps(paths, indent=2))
        return 0

    if args.p is not None and args.p < 1:
        parser.error(f"-p {args.p}: give the number of packages go may compile at once, 1 or more")
    try:
        bins = builder.build(parallel=args.p)
    except builder.BuildError as e:
        if not args.optional:
            print(f"python -m lab.real build: {e}", file=sys.stderr)
            return 1
        if builder.required():
            _loud(f"THE REAL KUBE-APISERVER CANNOT BE BUILT, and {builder.REQUIRE_ENV} is set:\n{e}")
            return 1
        _loud(f"SKIPPING THE REAL KUBE-APISERVER BACKEND: its tests will be skipped.\n{e}")
        return 0
    print(f"kube-apiserver {bins.kube_version}, kube-controller-manager {bins.kube_version}, etcd "
          f"{bins.etcd_version}: {bins.kube_apiserver.parent} and {bins.etcd.parent}; promtool "
          f"{builder.PROMTOOL.version()}: {builder.promtool().parent}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
