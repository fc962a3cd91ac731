"""`python -m lab.real build|paths`: the binaries of the real components (the control plane, upstream Dex, the
chart tests' promtool).

    python -m lab.real build              build etcd, kube-apiserver, kube-controller-manager, dex and promtool into
                                          the cache
    python -m lab.real build dex          only the components named (etcd, kube, dex, promtool)
    python -m lab.real build --optional   the same, but when they cannot be built say why loudly and exit 0
                                          (exit 1 anyway when PEERING_REQUIRE_REAL_APISERVER=1): what `make test` runs
    python -m lab.real paths              print the built binaries' paths as JSON; exit 1 when any is not built,
                                          saying on stderr which tests that leaves untested

`-p N` limits how many packages go compiles at once (for a machine short of memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from lab.real import build as builder

# What `paths` says of each part that is not built, one line each (`make test` repeats them at its end).
NOT_TESTED_CONTROL_PLANE = "REAL KUBE-APISERVER BACKEND NOT TESTED"
NOT_TESTED_DEX = "UPSTREAM DEX NOT TESTED (the differential test of the lab's Dex)"
NOT_TESTED_PROMTOOL = "PROMQL NOT PARSED (the chart's alerts and dashboard queries, by promtool)"


def _loud(msg: str) -> None:
    bar = "=" * 78
    print(f"{bar}\n{msg}\n{bar}", file=sys.stderr, flush=True)


def _paths() -> int:
    found: dict[str, str] = {}
    missing: list[str] = []
    try:
        bins = builder.require_built()
        found.update({k: str(v) for k, v in dataclasses.asdict(bins).items()})
    except builder.BuildError as e:
        missing.append(f"{NOT_TESTED_CONTROL_PLANE}: {e}")
    try:
        found.update(dex=str(builder.require_dex()), dex_version=builder.DEX.release())
    except builder.BuildError as e:
        missing.append(f"{NOT_TESTED_DEX}: {e}")
    try:
        found.update(promtool=str(builder.promtool()), promtool_version=builder.PROMTOOL.release())
    except builder.BuildError as e:
        missing.append(f"{NOT_TESTED_PROMTOOL}: {e}")
    print(json.dumps(found, indent=2))
    for line in missing:
        print(line, file=sys.stderr)
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.real", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the binaries into the cache (reused when current)")
    b.add_argument("components", nargs="*", metavar="COMPONENT",
                   help=f"build only these ({', '.join(c.name for c in builder.COMPONENTS)}; all by default)")
    b.add_argument("--optional", action="store_true",
                   help="when they cannot be built, say so and exit 0 unless PEERING_REQUIRE_REAL_APISERVER=1")
    b.add_argument("-p", type=int, default=None, metavar="N", help="go build -p N")
    sub.add_parser("paths", help="print where the binaries are, as JSON")
    args = parser.parse_args(argv)

    if args.command == "paths":
        return _paths()

    if args.p is not None and args.p < 1:
        parser.error(f"-p {args.p}: give the number of packages go may compile at once, 1 or more")
    try:
        components = builder.by_name(args.components)
    except ValueError as e:
        parser.error(str(e))
    names = ", ".join(c.name for c in components)
    try:
        builder.build(parallel=args.p, components=components)
    except builder.BuildError as e:
        if not args.optional:
            print(f"python -m lab.real build: {e}", file=sys.stderr)
            return 1
        if builder.required():
            _loud(f"THE REAL COMPONENTS ({names}) CANNOT BE BUILT, and {builder.REQUIRE_ENV} is set:\n{e}")
            return 1
        _loud(f"SKIPPING THE REAL KUBE-APISERVER BACKEND OR UPSTREAM DEX, whichever is not built ({names} were "
              f"asked for): their tests will be skipped.\n{e}")
        return 0
    for c in components:
        print(f"{builder.label(c)}: {builder.component_dir(c)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
