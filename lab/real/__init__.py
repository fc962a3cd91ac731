"""The lab's real backend: etcd, kube-apiserver and kube-controller-manager built from their Go modules; upstream
Dex, built the same way, which the lab's Dex is held to (`upstream_dex.py` runs it); and the chart tests' promtool.

`build.py` builds the pinned binaries into a cache outside the work tree (`python -m lab.real build`; promtool's
path: `build.promtool()` or `python -m lab.real paths`);
`config.py` says how a Deckhouse control plane is configured where it matters to the module; `runner.py` runs
one lab cluster's control plane on loopback (`RealControlPlane`), with `process.py` (its processes), `seeding.py`
(server-side apply, CRDs, tokens) and `documents.py` (the YAML it is given); `proxy.py` lets kube-apiserver reach
the lab's host names; `pool.py` keeps control planes between the lab clusters of a process (`baseline.py` empties
them); `api.py` is `cluster.api` on this backend, over control/kube.py. See lab/README.md, "The
real backend".
"""

# `lab.real.build` stays the module (its `build()` builds); the names the lab needs are re-exported.
from lab.real.build import Binaries, BuildError, require_built, required
from lab.real.config import JWTIssuer
from lab.real.documents import ApplyError
from lab.real.process import StartError
from lab.real.runner import RealControlPlane

__all__ = ["ApplyError", "Binaries", "BuildError", "JWTIssuer", "RealControlPlane", "StartError",
           "require_built", "required"]
