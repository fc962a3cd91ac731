"""The lab's multitenancy-manager, as far as the peering module sees it: Projects and their namespaces left the
way Deckhouse's controller leaves them.

A Project `p` (cluster-scoped, `deckhouse.io`, stored as v1alpha3) has its main namespace `p`; a ProjectNamespace
adds `p-<x>`. Every project namespace carries the label `projects.deckhouse.io/project=p`, and the Project's
`status.namespaces` lists them: `[{name: p, kind: Main}, {name: p-x, kind: Additional}]` in v1alpha3 (read
through v1alpha2 the same list is `[string]` in the real CRD; see lab/apiserver/crds/project.yaml for what this
API server's conversion does to it).

There is no controller here: `create_project` and `add_project_namespace` write, in-process, what the controller
would have written once it had reconciled. Without the Project CRD (`without_crds=["projects.deckhouse.io"]`)
they fail with the API server's 404, as kubectl would.
"""

from __future__ import annotations

from typing import Any

GROUP = "deckhouse.io"
VERSION = "v1alpha3"
PLURAL = "projects"
CRD_NAME = f"{PLURAL}.{GROUP}"
PROJECT_LABEL = "projects.deckhouse.io/project"
MAIN = "Main"
ADDITIONAL = "Additional"
# The project name becomes the main namespace; multitenancy-manager's CRD allows at most this much.
MAX_PROJECT_NAME = 61


def _check_free(api: Any, name: str, project: str) -> None:
    ns = api.get("", "namespaces", name)
    owner = ((ns or {}).get("metadata", {}).get("labels") or {}).get(PROJECT_LABEL)
    if owner not in (None, project):
        raise ValueError(f"namespace {name} belongs to project {owner!r}, not {project!r}; choose another name")


def _label_namespace(api: Any, name: str, project: str) -> None:
    _check_free(api, name, project)
    ns = api.get("", "namespaces", name)
    if ns is None:
        api.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": {PROJECT_LABEL: project}}})
        return
    ns["metadata"]["labels"] = {**(ns["metadata"].get("labels") or {}), PROJECT_LABEL: project}
    api.update(ns)


def _set_namespaces(api: Any, project: str, entries: list[dict]) -> dict:
    obj = api.get(GROUP, PLURAL, project)
    if obj is None:
        raise ValueError(f"there is no Project {project!r}; create it first (create_project)")
    obj["apiVersion"] = f"{GROUP}/{VERSION}"
    obj["status"] = {**(obj.get("status") or {}), "namespaces": entries, "state": "Deployed"}
    return api.update(obj, subresource="status")


def create_project(api: Any, name: str, spec: dict | None = None) -> dict:
    """Project `name` with its main namespace `name`, labelled and listed as Main in its status."""
    if len(name) > MAX_PROJECT_NAME:
        raise ValueError(f"project name {name!r} is longer than {MAX_PROJECT_NAME} characters: it becomes the "
                         "main namespace's name")
    _check_free(api, name, name)
    api.create({"apiVersion": f"{GROUP}/{VERSION}", "kind": "Project", "metadata": {"name": name},
                "spec": dict(spec or {})})
    _label_namespace(api, name, name)
    return _set_namespaces(api, name, [{"name": name, "kind": MAIN}])


def add_project_namespace(api: Any, project: str, suffix: str) -> str:
    """Namespace `<project>-<suffix>` as a ProjectNamespace makes it: labelled, and Additional in the status."""
    if not suffix:
        raise ValueError("give the additional namespace a suffix: it is named <project>-<suffix>")
    name = f"{project}-{suffix}"
    obj = api.get(GROUP, PLURAL, project)
    if obj is None:
        raise ValueError(f"there is no Project {project!r}; create it first (create_project)")
    _label_namespace(api, name, project)
    entries = [e for e in (obj.get("status") or {}).get("namespaces") or [] if isinstance(e, dict)]
    if not any(e.get("name") == name for e in entries):
        entries.append({"name": name, "kind": ADDITIONAL})
    _set_namespaces(api, project, entries)
    return name

