"""Build the real components the lab is held to from their Go modules: the control plane (etcd, kube-apiserver,
kube-controller-manager) and upstream Dex.

The versions are those of the pinned Go modules next to this file (`gomod/kube`, `gomod/etcd`, `gomod/dex`):
their go.mod names them and their go.sum fixes every byte. The binaries land in a cache outside the work tree:

    ${PEERING_LAB_CACHE:-~/.cache/deckhouse-peering}/kube/<k8s version>/{kube-apiserver,kube-controller-manager}
    ${PEERING_LAB_CACHE:-~/.cache/deckhouse-peering}/etcd/<etcd version>/etcd
    ${PEERING_LAB_CACHE:-~/.cache/deckhouse-peering}/dex/<Dex release>/dex

with a `stamp.json` beside them recording the hash of go.mod and go.sum, the Go version and the build flags; a
build whose stamp matches is reused. Go's module and build caches live under the same root (`gomodcache/`,
`gocache/`), so a second checkout, or CI on the same machine, downloads and compiles nothing twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

HERE = pathlib.Path(__file__).resolve().parent
GOMOD = HERE / "gomod"
# The oldest Go that the pinned modules accept (k8s.io/kubernetes v1.37 says `go 1.26.0`).
MIN_GO = (1, 26)
# What a CI run exports to make a missing real backend a failure instead of a skip.
REQUIRE_ENV = "PEERING_REQUIRE_REAL_APISERVER"
CACHE_ENV = "PEERING_LAB_CACHE"
# Small binaries with no local paths in them; static, as kube's own release builds are.
BUILD_FLAGS = ("-trimpath",)
LINK_FLAGS = ("-s", "-w")
# Bump when the way a binary is built changes (flags, link variables): older stamps then no longer match.
RECIPE = 1
# How often a running build says it is still alive.
HEARTBEAT_SECONDS = 30.0
# Where Go's installers put it, for a shell whose PATH lacks it.
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")


class BuildError(Exception):
    """The binaries cannot be built here; the message says what is missing and what to do."""


@dataclasses.dataclass(frozen=True)
class Component:
    """One pinned Go module and the commands it builds."""

    name: str                 # cache directory: kube, etcd or dex
    module_dir: pathlib.Path  # our go.mod + go.sum
    main_module: str          # the module whose version keys the cache
    commands: tuple[tuple[str, str], ...]  # (binary name, package path)
    # Variables the release scripts set at link time (`-X pkg.var=value`), from the version.
    link_vars: Callable[[str], dict[str, str]] = lambda version: {}
    # The release a module version is (a pseudo-version names a commit, not the tag on it); keys the cache.
    release_of: Callable[[str], str] = lambda version: version
    # Built with cgo (and so a C compiler); the others are static, CGO_ENABLED=0.
    cgo: bool = False

    def version(self) -> str:
        return module_version(self.module_dir / "go.mod", self.main_module)

    def release(self) -> str:
        return self.release_of(self.version())

    def source_hash(self) -> str:
        h = hashlib.sha256()
        for f in ("go.mod", "go.sum"):
            h.update(f.encode() + b"\0" + (self.module_dir / f).read_bytes() + b"\0")
        return h.hexdigest()


def _kube_version_vars(version: str) -> dict[str, str]:
    """What kubernetes' hack/lib/version.sh sets, so that /version reports the release and not
    `v0.0.0-master`. The commit is unknown from a module download and stays empty."""
    m = re.match(r"v(\d+)\.(\d+)\.", version)
    if not m:
        raise BuildError(f"k8s.io/kubernetes version {version!r} is not vMAJOR.MINOR.PATCH")
    values = {"gitVersion": version, "gitMajor": m.group(1), "gitMinor": m.group(2), "gitTreeState": "clean",
              "gitCommit": "", "buildDate": _module_time("k8s.io/kubernetes", version)}
    return {f"{pkg}.{k}": v for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
            for k, v in values.items()}


KUBE = Component("kube", GOMOD / "kube", "k8s.io/kubernetes", (
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
), _kube_version_vars)
ETCD = Component("etcd", GOMOD / "etcd", "go.etcd.io/etcd/server/v3", (
    ("etcd", "go.etcd.io/etcd/server/v3"),
))

# The module proxy refuses Dex's v2 tags (its module path has no /v2), so gomod/dex requires a commit by its
# pseudo-version; this says which release that commit is tagged. Pin another commit: add its release here.
DEX_RELEASES = {"v0.0.0-20240807174518-43956db7fd75": "v2.41.1"}


def _dex_release(version: str) -> str:
    try:
        return DEX_RELEASES[version]
    except KeyError:
        raise BuildError(f"gomod/dex requires github.com/dexidp/dex {version}, which DEX_RELEASES in "
                         f"{pathlib.Path(__file__).name} does not name: add the release tag of that commit") from None


# Dex's command does not compile without cgo: it names its sqlite3 storage, which exists only with cgo (Dex's own
# release builds use it too). Linked against the C library of the machine that builds it, where it then runs.
DEX = Component("dex", GOMOD / "dex", "github.com/dexidp/dex", (
    ("dex", "github.com/dexidp/dex/cmd/dex"),
), lambda version: {"main.version": _dex_release(version)}, _dex_release, cgo=True)


def _prometheus_release(version: str) -> str:
    """The Prometheus release a module version is: module v0.309.1 is Prometheus v3.9.1."""
    m = re.match(r"v0\.(\d+?)(\d{2})\.(\d+)$", version)
    if not m:
        raise BuildError(f"github.com/prometheus/prometheus version {version!r} is not v0.<major><minor>.<patch>")
    return f"v{int(m.group(1))}.{int(m.group(2))}.{m.group(3)}"


def _prometheus_version_vars(version: str) -> dict[str, str]:
    """What Prometheus's release build sets, so that `promtool --version` names the release."""
    return {f"github.com/prometheus/common/version.{k}": v
            for k, v in {"Version": _prometheus_release(version).lstrip("v"), "Branch": "HEAD",
                         "BuildUser": "deckhouse-peering",
                         "BuildDate": _module_time("github.com/prometheus/prometheus", version)}.items()}


# promtool checks the module's PrometheusRules and parses its dashboard queries (tests/chart/promtool.py).
PROMTOOL = Component("promtool", GOMOD / "promtool", "github.com/prometheus/prometheus", (
    ("promtool", "github.com/prometheus/prometheus/cmd/promtool"),
), _prometheus_version_vars)
# What the real kube-apiserver backend runs, and everything `build` builds.
CONTROL_PLANE = (ETCD, KUBE)
COMPONENTS = (ETCD, KUBE, DEX, PROMTOOL)


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Where the three built binaries are, with the versions they were built from."""

    etcd: pathlib.Path
    kube_apiserver: pathlib.Path
    kube_controller_manager: pathlib.Path
    kube_version: str
    etcd_version: str


def module_version(go_mod: pathlib.Path, module: str) -> str:
    """The version `go_mod` requires of `module` (in a require line or block)."""
    pattern = re.compile(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", re.M)
    m = pattern.search(go_mod.read_text())
    if not m:
        raise BuildError(f"{go_mod} does not require {module}: the pinned Go module is broken, restore it from git")
    return m.group(1)


def _module_time(module: str, version: str) -> str:
    """The release time the module proxy recorded (`.info`), as a reproducible build date."""
    info = cache_root() / "gomodcache" / "cache" / "download" / module / "@v" / f"{version}.info"
    try:
        return json.loads(info.read_text())["Time"]
    except (OSError, ValueError, KeyError):
        return "1970-01-01T00:00:00Z"


def cache_root() -> pathlib.Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return pathlib.Path(root).expanduser().resolve()
    return pathlib.Path.home() / ".cache" / "deckhouse-peering"


def component_dir(component: Component, root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or cache_root()) / component.name / component.release()


def binaries(root: pathlib.Path | None = None) -> Binaries:
    """The paths where the binaries are or will be (nothing is checked)."""
    kube, etcd = component_dir(KUBE, root), component_dir(ETCD, root)
    return Binaries(etcd=etcd / "etcd", kube_apiserver=kube / "kube-apiserver",
                    kube_controller_manager=kube / "kube-controller-manager",
                    kube_version=KUBE.version(), etcd_version=ETCD.version())


def go_env(root: pathlib.Path) -> dict[str, str]:
    """The environment of every go command: caches under `root`, no toolchain switching, static binaries."""
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "gomodcache"),
        GOCACHE=str(root / "gocache"),
        # The module cache is read-only by default, which makes `rm -rf` of the cache root fail.
        GOFLAGS=" ".join(f for f in (env.get("GOFLAGS", ""), "-modcacherw", "-mod=readonly") if f),
        # The installed Go is new enough; never fetch another toolchain behind the user's back.
        GOTOOLCHAIN="local",
        GOWORK="off",
        CGO_ENABLED="0",
    )
    return env


def find_go() -> str:
    go = shutil.which("go")
    if go is None:
        for candidate in GO_CANDIDATES:
            if os.access(candidate, os.X_OK):
                go = candidate
                break
    if go is None:
        raise BuildError(f"no `go` on PATH: the real kube-apiserver is built from source and needs Go "
                         f"{MIN_GO[0]}.{MIN_GO[1]} or newer; install it (or add its bin/ to PATH) and run "
                         f"`python -m lab.real build` again")
    return go


def go_version(go: str, env: dict[str, str]) -> str:
    """`go1.26.8`; refuses a Go older than the pinned modules need."""
    try:
        out = subprocess.run([go, "env", "GOVERSION"], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"`{go} env GOVERSION` failed: {e}") from e
    version = out.stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", version)
    if out.returncode != 0 or not m:
        raise BuildError(f"`{go} env GOVERSION` failed: {_quote(out.stderr or out.stdout)}")
    if (int(m.group(1)), int(m.group(2))) < MIN_GO:
        raise BuildError(f"{go} is {version}, but k8s.io/kubernetes {KUBE.version()} needs Go "
                         f"{MIN_GO[0]}.{MIN_GO[1]} or newer: install a newer Go")
    return version


def _quote(text: str, lines: int = 15) -> str:
    """The end of a command's output, indented, for an error message."""
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return "\n    " + "\n    ".join(tail) if tail else " (no output)"


def _stamp(component: Component, go_ver: str) -> dict:
    return {"recipe": RECIPE, "version": component.version(), "sources": component.source_hash(), "go": go_ver,
            "flags": _go_build_flags(component), "cgo": component.cgo,
            "binaries": [b for b, _ in component.commands]}


def _component_env(component: Component, env: dict[str, str]) -> dict[str, str]:
    """`env` for building `component`: with cgo on for those that need it, once a C compiler is found."""
    if not component.cgo:
        return env
    cc = env.get("CC") or "gcc"
    if shutil.which(cc) is None and shutil.which("cc") is None:
        raise BuildError(f"{label(component)} is built with cgo (its command does not compile without it) and "
                         f"there is no C compiler ({cc} or cc) on PATH: install one (Debian: apt-get install gcc) "
                         f"and run `python -m lab.real build` again")
    return dict(env, CGO_ENABLED="1")


def _go_build_flags(component: Component) -> list[str]:
    link = list(LINK_FLAGS) + [f"-X={k}={v}" for k, v in sorted(component.link_vars(component.version()).items())]
    return [*BUILD_FLAGS, "-ldflags=" + " ".join(link)]


def _is_current(component: Component, target: pathlib.Path) -> bool:
    """Built from exactly this go.mod/go.sum, and every binary still there. The Go version is recorded, not
    compared: a Go upgrade alone does not force a rebuild."""
    try:
        stamp = json.loads((target / "stamp.json").read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("recipe") == RECIPE and stamp.get("sources") == component.source_hash()
            and all(os.access(target / b, os.X_OK) for b, _ in component.commands))


def is_built(root: pathlib.Path | None = None, components: tuple[Component, ...] = CONTROL_PLANE) -> bool:
    return all(_is_current(c, component_dir(c, root)) for c in components)


@contextlib.contextmanager
def _build_lock(root: pathlib.Path, say: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per cache root (two checkouts, or CI beside a developer)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another build holds {root / 'build.lock'}; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _run_go(argv: list[str], cwd: pathlib.Path, env: dict[str, str], label: str,
            say: Callable[[str], None], count_lines: bool = False) -> None:
    """Run a go command, saying every HEARTBEAT_SECONDS that it is still going; a failure quotes go's words."""
    start = time.monotonic()
    lines: list[str] = []
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            extra = f", {len(lines)} packages compiled" if count_lines else ""
            say(f"  {label}: still going, {_elapsed(start)}{extra}")

    t = threading.Thread(target=heartbeat, daemon=True)
    t.start()
    try:
        with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.append(line.rstrip("\n"))
                rc = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
    except OSError as e:
        raise BuildError(f"{label}: cannot run {argv[0]}: {e}") from e
    finally:
        done.set()
        t.join()
    if rc != 0:
        # `go build -v` names each package it compiles, one bare path a line: the quote keeps go's own words.
        output = "\n".join(ln for ln in lines if not (count_lines and _PACKAGE_LINE.fullmatch(ln)))
        hint = ""
        if re.search(r"dial tcp|lookup .* no such host|i/o timeout|connection refused|403 Forbidden|"
                     r"proxyconnect|TLS handshake|unrecognized import path", output):
            hint = ("\n  The Go module proxy could not be reached or refused a download: check GOPROXY and the "
                    "network, then run `python -m lab.real build` again.")
        raise BuildError(f"{label} failed after {_elapsed(start)} (`{' '.join(argv[:3])} ...` in {cwd}); "
                         f"the go command said:{_quote(output)}{hint}")
    say(f"  {label}: done in {_elapsed(start)}")


_PACKAGE_LINE = re.compile(r"[\w.\-~/]+")


def _elapsed(start: float) -> str:
    s = int(time.monotonic() - start)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _build_component(component: Component, root: pathlib.Path, go: str, env: dict[str, str], go_ver: str,
                     say: Callable[[str], None], parallel: int | None) -> None:
    target = component_dir(component, root)
    if _is_current(component, target):
        say(f"{label(component)}: up to date in {target}")
        return
    env = _component_env(component, env)
    say(f"{label(component)}: building into {target}")
    _run_go([go, "mod", "download"], component.module_dir, env, f"downloading the modules of {component.name}", say)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for binary, package in component.commands:
        argv = [go, "build", "-v", *_go_build_flags(component), "-o", str(staging / binary)]
        if parallel:
            argv.insert(2, f"-p={parallel}")
        _run_go(argv + [package], component.module_dir, env, f"building {binary}", say, count_lines=True)
    (staging / "stamp.json").write_text(json.dumps(_stamp(component, go_ver), indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def label(component: Component) -> str:
    """`etcd v3.6.16`; `dex v2.41.1 (github.com/dexidp/dex v0.0.0-...)` when the module version is not the release."""
    version, release = component.version(), component.release()
    return f"{component.name} {release}" + (f" ({component.main_module} {version})" if version != release else "")


def by_name(names: list[str]) -> tuple[Component, ...]:
    """The components called `names` (all of them for none), in build order; ValueError naming the known ones."""
    known = {c.name: c for c in COMPONENTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"no component {', '.join(map(repr, unknown))}: choose from {', '.join(known)}")
    return tuple(c for c in COMPONENTS if not names or c.name in names)


def build(*, root: pathlib.Path | None = None, say: Callable[[str], None] | None = None,
          parallel: int | None = None, components: tuple[Component, ...] = COMPONENTS) -> Binaries:
    """Build whatever of `components` is not current in the cache and return the control plane's binaries (their
    paths: with `components` leaving it out, nothing says they are built); raises BuildError saying what is
    missing. One component that fails does not keep the others from being built; the error names each failure.

    `parallel` limits how many packages go compiles at once (`go build -p`), for a machine short of memory.
    """
    root = root or cache_root()
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if is_built(root, components):
        return binaries(root)
    go = find_go()
    env = go_env(root)
    go_ver = go_version(go, env)
    start = time.monotonic()
    failed: list[str] = []
    with _build_lock(root, say):
        for component in components:
            try:
                _build_component(component, root, go, env, go_ver, say, parallel)
            except BuildError as e:
                say(f"{label(component)}: NOT BUILT")
                failed.append(str(e))
    if failed:
        raise BuildError("\n".join(failed))
    say(f"{', '.join(c.name for c in components)} built with {go_ver} in {_elapsed(start)} (cache: {root})")
    return binaries(root)


def _not_built(what: str, components: tuple[Component, ...], root: pathlib.Path | None) -> BuildError:
    missing = [f"{c.name} {c.release()}" for c in components if not _is_current(c, component_dir(c, root))]
    return BuildError(f"{what} not built ({', '.join(missing)} missing or out of date in {root or cache_root()}): run "
                      f"`python -m lab.real build` (the first build takes a while, see lab/README.md)")


def require_built(root: pathlib.Path | None = None) -> Binaries:
    """The control plane's binaries if the cache holds current ones; otherwise BuildError naming the command that
    builds them."""
    if not is_built(root):
        raise _not_built("the real control plane's binaries are", CONTROL_PLANE, root)
    return binaries(root)


def require_dex(root: pathlib.Path | None = None) -> pathlib.Path:
    """The built upstream `dex` binary; otherwise BuildError naming the command that builds it."""
    if not is_built(root, (DEX,)):
        raise _not_built("upstream Dex is", (DEX,), root)
    return component_dir(DEX, root) / "dex"


def promtool(root: pathlib.Path | None = None) -> pathlib.Path:
    """The built `promtool`; otherwise BuildError naming the command that builds it."""
    if not is_built(root, (PROMTOOL,)):
        raise _not_built("promtool is", (PROMTOOL,), root)
    return component_dir(PROMTOOL, root) / "promtool"


def required() -> bool:
    """True when a missing real component (the kube-apiserver backend, upstream Dex, promtool) must fail (CI) rather
    than be skipped."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0", "false", "no")
