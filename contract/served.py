"""What the clusters serve: the resources of kube-apiserver (served_kubernetes.py) and of Deckhouse
(served_deckhouse.py), parsed once, each with its scope and where it comes from.

The capability policy takes the scope of a resource it knows from here (a rule on a cluster-scoped resource
becomes a ClusterRole), and the coverage test holds the policy to having a class for every row.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import served_deckhouse, served_kubernetes

NAMESPACED = "Namespaced"
CLUSTER = "Cluster"
_SCOPES = {NAMESPACED, CLUSTER}
DECKHOUSE_SNAPSHOT = "deckhouse/deckhouse@30543731e7df"


@dataclass(frozen=True)
class Served:
    """One resource or subresource (`pods`, `pods/exec`) of an API group ("" the core group)."""

    group: str
    resource: str
    scope: str | None  # NAMESPACED, CLUSTER, or None where the source's scope was not read
    source: str
    by_default: bool = True  # False: served only with every API version and feature gate turned on


def _rows(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            yield number, line.split()


def _kubernetes() -> list[Served]:
    out = []
    for number, cells in _rows(served_kubernetes.TABLE):
        if len(cells) not in (3, 4) or cells[2] not in _SCOPES or cells[3:] not in ([], ["all-apis"]):
            raise ValueError(f"served_kubernetes.TABLE line {number}: {' '.join(cells)!r} is not "
                             "`group resource Namespaced|Cluster [all-apis]`")
        group = "" if cells[0] == '""' else cells[0]
        source = f"kube-apiserver {served_kubernetes.VERSION}" + (" (all-apis)" if cells[3:] else "")
        out.append(Served(group, cells[1], cells[2], source, by_default=not cells[3:]))
    return out


def _deckhouse() -> list[Served]:
    out, folder = [], None
    for number, cells in _rows(served_deckhouse.TABLE):
        if len(cells) == 1 and cells[0].startswith("[") and cells[0].endswith("]"):
            folder = cells[0][1:-1]
            continue
        if folder is None or len(cells) != 5 or cells[2] not in _SCOPES | {"-"}:
            raise ValueError(f"served_deckhouse.TABLE line {number}: {' '.join(cells)!r} is not "
                             "`group resource Namespaced|Cluster|- subresources file` below a `[folder]` line")
        group, resource, scope, subresources, file = cells
        path = f"{folder}/{file}"
        source = path if path.startswith(("charts/", "lab/")) or "@" in file else f"{DECKHOUSE_SNAPSHOT} {path}"
        scope = None if scope == "-" else scope
        out.append(Served(group, resource, scope, source))
        if subresources != "-":
            out += [Served(group, f"{resource}/{sub}", scope, source) for sub in subresources.split(",")]
    return out


KUBERNETES: tuple[Served, ...] = tuple(_kubernetes())
DECKHOUSE: tuple[Served, ...] = tuple(_deckhouse())
ALL: tuple[Served, ...] = KUBERNETES + DECKHOUSE
_SCOPE = {(s.group, s.resource): s.scope for s in ALL if "/" not in s.resource}


def scope(group: str, resource: str) -> str | None:
    """NAMESPACED or CLUSTER for a resource (or subresource) the tables know the scope of, else None."""
    return _SCOPE.get((group, resource.split("/", 1)[0]))


def known(group: str, resource: str) -> bool:
    """Whether the tables list the resource (a subresource counts by its resource)."""
    return (group, resource.split("/", 1)[0]) in _SCOPE
