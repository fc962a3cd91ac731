"""Control planes kept between the lab clusters of one process (a pytest worker), so that a test on the real
backend neither waits for nor pays a new etcd, kube-apiserver and kube-controller-manager: 2.5 to 5 CPU-s and 5
to 10 s a cluster here, the largest share of `make test`'s CPU while every two-cluster test started two.

    pool = shared()                           # this process's pool (lab/testing.py `lab_clusters` uses it)
    plane = pool.take("a", without_crds)      # a kept plane of cluster "a" started without those CRDs, or None
    await pool.adopt(plane, without_crds)     # a plane just started (nothing written to it yet): its baseline
    await pool.give_back(plane)               # brought back to its baseline and kept, or stopped

A kept plane goes to a cluster of the same name started without the same CRDs, with its PKI (its serving
certificate, client CA and ServiceAccount keys are the new cluster's from then on) and the signing key of the
plane's first Dex: kube-apiserver caches an issuer's keys for as long as its /keys answer says (hours, for Dex)
and fetches them again only then, so the cluster's Dex signs with that key, as a Dex restarted on its storage
does; the cluster routes the plane's proxy to its Dex (`RealControlPlane.route`). Given back, a plane is reset to what it held when it was
adopted (lab/real/baseline.py: every object made since is deleted, the control plane's own leases left), and kept
only if its processes all still run and nothing of that baseline was deleted or changed (a test that deleted a
CRD, or labelled a namespace of the baseline): otherwise it is stopped and the next cluster starts a new one. A
plane kept idle for IDLE_SECONDS is stopped (an idle control plane costs about 0.05 of a core), at most MAX_KEPT
are kept, and every plane of the pool is stopped when the process exits (their processes also die with it).

What a cluster sees of an earlier one: nothing it can read through the API (every object it finds is new), the
same CA, API server port and ServiceAccount keys, and the earlier clusters' lines in the plane's logs.
PEERING_LAB_KEEP_PLANES=0 turns keeping off: every cluster starts its own plane.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import dataclasses
import logging
import os
import pathlib
import shutil
import threading
import time
from typing import Any, Awaitable, Callable, Iterable

from lab.apiserver.errors import ApiError
from lab.real.baseline import Baseline

log = logging.getLogger(__name__)

IDLE_SECONDS = 20.0
MAX_KEPT = 3
RESET_TIMEOUT = 30.0
KEEP_ENV = "PEERING_LAB_KEEP_PLANES"


@dataclasses.dataclass
class _Entry:
    plane: Any  # lab.real.RealControlPlane
    key: tuple[str, tuple[str, ...]]
    api: Any  # lab.real.api.HttpApi, the admin's
    baseline: Baseline
    processes: frozenset[str]
    signing_key: Any
    timer: threading.Timer | None = None
    kept_at: float = 0.0


class PlanePool:
    def __init__(self, *, idle_seconds: float = IDLE_SECONDS, max_kept: int = MAX_KEPT) -> None:
        self.idle_seconds = idle_seconds
        self.max_kept = max_kept
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, tuple[str, ...]], list[_Entry]] = {}
        self._lent: dict[int, _Entry] = {}
        #: taken, started (a plane was adopted), kept, and each reason a plane was stopped instead.
        self.counts: collections.Counter[str] = collections.Counter()

    @staticmethod
    def _key(name: str, without_crds: Iterable[str]) -> tuple[str, tuple[str, ...]]:
        return name, tuple(sorted(without_crds))

    def take(self, name: str, without_crds: Iterable[str] = ()) -> Any:
        """A kept plane of cluster `name` started without `without_crds`, now the caller's; None if there is none."""
        key = self._key(name, without_crds)
        with self._lock:
            entries = self._kept.get(key) or []
            if not entries:
                return None
            entry = entries.pop()
            if entry.timer is not None:
                entry.timer.cancel()
                entry.timer = None
            self._lent[id(entry.plane)] = entry
            self.counts["taken"] += 1
            return entry.plane

    async def adopt(self, plane: Any, without_crds: Iterable[str] = (), signing_key: Any = None) -> None:
        """A plane just started, before anything else wrote to it: what it holds now is what each reset keeps;
        `signing_key` is its Dex's, which the next clusters' Dex sign with (`signing_key(plane)`)."""
        from lab.real.api import HttpApi

        api = await asyncio.to_thread(HttpApi, f"{plane.name}-pool", plane.admin_kubeconfig)
        try:
            baseline = await _settled(api)
        except BaseException:
            await asyncio.to_thread(api.close)
            raise
        with self._lock:
            self._lent[id(plane)] = _Entry(plane, self._key(plane.name, without_crds), api, baseline,
                                           frozenset(plane.pids()), signing_key)
            self.counts["started"] += 1

    def signing_key(self, plane: Any) -> Any:
        """The Dex signing key kube-apiserver of lent `plane` knows."""
        with self._lock:
            return self._lent[id(plane)].signing_key

    def lends(self, plane: Any) -> bool:
        with self._lock:
            return id(plane) in self._lent

    async def give_back(self, plane: Any) -> None:
        """Reset `plane` and keep it for the next cluster, or stop it where it cannot be brought back."""
        with self._lock:
            entry = self._lent.pop(id(plane))
        why = ""
        try:
            if set(plane.pids()) != entry.processes:
                why = "a process of it is not running"
            else:
                try:
                    now = await entry.baseline.reset(entry.api, RESET_TIMEOUT)
                except (TimeoutError, ApiError, OSError) as e:
                    why = f"its reset failed: {e}"
                else:
                    changed = entry.baseline.changed(now)
                    if changed:
                        why = "the test changed what it started with: " + ", ".join(changed[:5])
        except BaseException:
            await _stop(entry)
            raise
        if why:
            log.info("control plane of %s stopped, not kept: %s", plane.name, why)
            self.counts["not kept: " + why.split(":")[0]] += 1
            await _stop(entry)
            return
        evicted = []
        with self._lock:
            entries = self._kept.setdefault(entry.key, [])
            entries.append(entry)
            self.counts["kept"] += 1
            entry.kept_at = time.monotonic()
            entry.timer = threading.Timer(self.idle_seconds, self._idle, (entry,))
            entry.timer.daemon = True
            entry.timer.start()
            while sum(len(v) for v in self._kept.values()) > self.max_kept:
                oldest = min((e for v in self._kept.values() for e in v), key=lambda e: e.kept_at)
                self._drop(oldest)
                evicted.append(oldest)
        for e in evicted:
            await _stop(e)

    def _drop(self, entry: _Entry) -> None:
        self._kept[entry.key].remove(entry)
        if entry.timer is not None:
            entry.timer.cancel()

    def _idle(self, entry: _Entry) -> None:
        with self._lock:
            if entry not in self._kept.get(entry.key, []):
                return
            self._drop(entry)
            self.counts["stopped idle"] += 1
        asyncio.run(_stop(entry))

    def close(self) -> None:
        """Stop every plane of the pool, kept or lent (at exit)."""
        with self._lock:
            entries = [e for v in self._kept.values() for e in v] + list(self._lent.values())
            for e in entries:
                if e.timer is not None:
                    e.timer.cancel()
            self._kept.clear()
            self._lent.clear()
        for e in entries:
            asyncio.run(e.plane.stop())
            e.api.close()


async def _settled(api: Any, *, quiet: float = 0.5, timeout: float = 20.0) -> Baseline:
    """The baseline once kube-controller-manager made what it makes in the namespaces there are (their
    ServiceAccount `default`, ConfigMap `kube-root-ca.crt`): two readings `quiet` s apart that agree, leases and
    events aside."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = await asyncio.to_thread(Baseline.of, api)
    while True:
        await asyncio.sleep(quiet)  # bounded poll: nothing says when the controllers are done with a namespace
        now = await asyncio.to_thread(Baseline.of, api)
        if _counted(now) == _counted(last) or loop.time() > deadline:
            return now
        last = now


def _counted(base: Baseline) -> set[str]:
    return {uid for uid, s in base.stored.items() if s.resource not in _UNSETTLING}


#: What keeps coming while the control plane runs: events, and leases (a reset leaves the baseline namespaces').
_UNSETTLING = {("", "events"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases")}


async def _stop(entry: _Entry) -> None:
    try:
        await entry.plane.stop()
    finally:
        await asyncio.to_thread(entry.api.close)


async def acquire_plane(pool: PlanePool | None, name: str, dir: pathlib.Path, *, pki: Any, dex_issuer: str,
                        start_dex: Callable[[Any, Any], Awaitable[Any]], crds: list,
                        without_crds: Iterable[str]) -> Any:
    """Lab cluster `name`'s control plane: one `pool` kept, or a new one in `dir` with `pki` and `crds`, adopted by
    `pool` when there is one. `start_dex(pki, signing_key)` starts the cluster's Dex and returns it: for a kept
    plane with the plane's PKI and the signing key of the plane's first Dex (kube-apiserver caches Dex's keys for
    as long as /keys says, hours), then the plane's proxy is routed to it and `dir` names the plane's directory;
    for a new plane with `pki` and a new key, before the plane starts (kube-apiserver reads its issuer's
    discovery at start)."""
    from lab import certs
    from lab.real import JWTIssuer, RealControlPlane

    dex_host = certs.dex_host(name)
    kept = pool.take(name, without_crds) if pool is not None else None
    if kept is not None:
        dex = await start_dex(kept.pki, pool.signing_key(kept))
        kept.route(dex_host, f"127.0.0.1:{dex.port}")
        await asyncio.to_thread(shutil.rmtree, dir, True)
        dir.unlink(missing_ok=True)
        dir.symlink_to(kept.files.dir, target_is_directory=True)
        return kept
    dex = await start_dex(pki, None)
    # A lab cluster starts new each time: nothing of an earlier run in the same directory (etcd's data, the
    # ServiceAccount key) is kept, as the emulator keeps nothing.
    await asyncio.to_thread(shutil.rmtree, dir, True)
    plane = RealControlPlane(name, dir, pki=pki, jwt_issuer=JWTIssuer(dex_issuer, pki.public_ca.cert_pem),
                             resolve={dex_host: f"127.0.0.1:{dex.port}"})
    await plane.start(crds=crds)
    if pool is not None:
        try:
            await pool.adopt(plane, without_crds, dex.signing_key)
        except BaseException:
            await plane.stop()
            raise
    return plane


async def release_plane(pool: PlanePool | None, plane: Any) -> None:
    """Give `plane` back to `pool` if it lent or adopted it, else stop it."""
    if pool is not None and pool.lends(plane):
        await pool.give_back(plane)
    else:
        await plane.stop()


_shared: PlanePool | None = None
_shared_lock = threading.Lock()


def shared() -> PlanePool | None:
    """This process's pool; None when PEERING_LAB_KEEP_PLANES=0."""
    global _shared
    if os.environ.get(KEEP_ENV, "1") == "0":
        return None
    with _shared_lock:
        if _shared is None:
            _shared = PlanePool()
            atexit.register(_shared.close)
        return _shared
