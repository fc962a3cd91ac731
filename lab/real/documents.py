"""The documents the real backend is given: YAML files, directories of them, or dicts; and the CRD keys a stock
kube-apiserver refuses."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable, Mapping

import yaml


class ApplyError(Exception):
    """The API server refused to seed an object; the message names the object and quotes the server."""


def load_documents(sources: Iterable[os.PathLike | str | Mapping]) -> list[dict]:
    """YAML documents from files, from the *.yaml/*.yml files of directories (sorted), or dicts as they are."""
    docs: list[dict] = []
    for src in sources:
        if isinstance(src, Mapping):
            docs.append(dict(src))
            continue
        path = pathlib.Path(src)
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")) if path.is_dir() else [path]
        if not files:
            raise ApplyError(f"{path} holds no *.yaml files")
        for file in files:
            docs += [d for d in yaml.load_all(file.read_text(), Loader=yaml.CSafeLoader) if d]
    return docs


def strip_schema_keys(crd: dict, keys: tuple[str, ...]) -> list[str]:
    """Remove `keys` wherever they occur in the CRD's version schemas; returns the places, as JSON pointers."""
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k in [k for k in node if k in keys]:
                del node[k]
                found.append(f"{where}/{k}")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    if keys:
        for i, version in enumerate(crd.get("spec", {}).get("versions", [])):
            walk(version.get("schema"), f"{crd.get('metadata', {}).get('name')}/spec/versions/{i}/schema")
    return found


def writable_probe(crd: Mapping, version: str) -> tuple[str, dict]:
    """The collection path and an empty object of a CRD's `version`, for a dry-run create that tells whether the
    kind takes writes yet (the namespaced ones in `default`)."""
    spec = crd["spec"]
    where = "/namespaces/default" if spec.get("scope") == "Namespaced" else ""
    path = f"/apis/{spec['group']}/{version}{where}/{spec['names']['plural']}"
    return path, {"apiVersion": f"{spec['group']}/{version}", "kind": spec["names"]["kind"],
                  "metadata": {"name": "lab-writable-probe"}}
