"""Deckhouse's module linter dmt, installed once and run on charts/peering.

    python tools/dmt.py install        # go install github.com/deckhouse/dmt/cmd/dmt@VERSION into the cache
    python tools/dmt.py lint [ARGS]    # dmt lint charts/peering [ARGS], installing it first when needed

The binary lives outside the work tree, in ${PEERING_LAB_CACHE:-~/.cache/deckhouse-peering}/dmt/<version>/, and
is reused when present. `PEERING_DMT` names a dmt binary to use instead (one installed by other means, at the
same version). Without Go, or when the Go module proxy does not serve dmt, `install` says so and exits 3.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

VERSION = "v0.1.105"
MODULE = "github.com/deckhouse/dmt/cmd/dmt"
ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "charts" / "peering"
UNAVAILABLE = 3


class DmtUnavailable(RuntimeError):
    """dmt cannot be had here; the message says why and what to do."""


def cache_dir() -> pathlib.Path:
    base = os.environ.get("PEERING_LAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "deckhouse-peering")
    return pathlib.Path(base) / "dmt" / VERSION


def binary() -> pathlib.Path | None:
    """The dmt to run, when there is one: PEERING_DMT, else the cached install."""
    given = os.environ.get("PEERING_DMT")
    if given:
        path = pathlib.Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise DmtUnavailable(f"PEERING_DMT={given} is not an executable file: point it at a dmt {VERSION} binary "
                                 "or unset it")
        return path
    cached = cache_dir() / "dmt"
    return cached if cached.is_file() and os.access(cached, os.X_OK) else None


def install() -> pathlib.Path:
    """`go install` the pinned dmt into the cache (atomically: a failed install leaves nothing half-made)."""
    found = binary()
    if found is not None:
        return found
    go = shutil.which("go")
    if go is None:
        raise DmtUnavailable(f"dmt {VERSION} is not installed and there is no Go toolchain to install it: install Go "
                             f"1.25 or newer, or set PEERING_DMT to a dmt binary")
    target = cache_dir()
    partial = target / ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"installing dmt {VERSION} into {target} (go install {MODULE}@{VERSION}) ...", file=sys.stderr, flush=True)
    env = {**os.environ, "GOBIN": str(partial)}
    proc = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], env=env, cwd=str(target), capture_output=True,
                          text=True)
    if proc.returncode != 0 or not (partial / "dmt").is_file():
        shutil.rmtree(partial, ignore_errors=True)
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DmtUnavailable(f"go install {MODULE}@{VERSION} failed, so dmt cannot be run here: "
                             + " | ".join(detail)
                             + " (is the Go module proxy reachable and does it serve github.com/deckhouse/dmt? "
                               "Otherwise set PEERING_DMT to a dmt binary)")
    os.replace(partial / "dmt", target / "dmt")
    shutil.rmtree(partial, ignore_errors=True)
    return target / "dmt"


def lint(args: list[str], module_dir: pathlib.Path = MODULE_DIR) -> subprocess.CompletedProcess:
    """`dmt lint <module_dir> ARGS`, colourless, with dmt's reporting of lint metrics kept local."""
    exe = install()
    env = {**os.environ, "NO_COLOR": "1", "DMT_REPOSITORY": "deckhouse-peering", "DMT_METRICS_URL": ""}
    return subprocess.run([str(exe), "lint", str(module_dir), *args], env=env, capture_output=True, text=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("install", "lint"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        if argv[0] == "install":
            print(install())
            return 0
        proc = lint(argv[1:])
    except DmtUnavailable as exc:
        print(f"dmt: {exc}", file=sys.stderr)
        return UNAVAILABLE
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
