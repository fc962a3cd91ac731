"""The module folder charts/peering/ rendered the way Deckhouse renders it.

Deckhouse never passes a module top-level values of its own choosing: it validates the ModuleConfig's settings
against `openapi/config-values.yaml`, fills in the schema's defaults, adds what the module's hooks computed under
`internal` (checked against `openapi/values.yaml`), and renders the templates with `<moduleName>.*` beside the
cluster's `global.*` (publicDomainTemplate, https, placement, the cluster UUID, the enabled modules, the image
digests). `module_values()` builds exactly that shape; `render()` renders it with the Helm v4 SDK. The lab
installs what comes out, and the chart tests check it.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "charts" / "peering"
MODULE_NAME = "peering"
NAMESPACE = "d8-peering"
# What a Deckhouse build puts in global.modulesImages for this module: digests of the werf images, by image.
DEFAULT_REGISTRY = "registry.deckhouse.io/deckhouse/ce"
FAKE_DIGEST = "sha256:" + "0" * 63 + "1"


class SettingsError(ValueError):
    """A ModuleConfig setting that the module's schema refuses; the message names the setting."""


def _load_yaml(path: pathlib.Path) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)


def config_schema(module_dir: pathlib.Path = MODULE_DIR) -> dict:
    """openapi/config-values.yaml: the schema of the ModuleConfig's `spec.settings`."""
    return _load_yaml(module_dir / "openapi" / "config-values.yaml")


def values_schema(module_dir: pathlib.Path = MODULE_DIR) -> dict:
    """openapi/values.yaml with its `x-extend` resolved: the settings' schema plus `internal`."""
    schema = _load_yaml(module_dir / "openapi" / "values.yaml")
    extend = schema.pop("x-extend", None)
    if extend:
        parent = _load_yaml(module_dir / "openapi" / extend["schema"])
        merged = copy.deepcopy(parent)
        merged.setdefault("properties", {}).update(schema.get("properties", {}))
        for key, value in schema.items():
            if key != "properties":
                merged[key] = value
        schema = merged
    return schema


def _json_schema(schema: dict) -> dict:
    """The OpenAPI schema as JSON Schema: Deckhouse's `x-*` keys dropped, unknown keys refused as Deckhouse does."""
    if isinstance(schema, dict):
        out = {k: _json_schema(v) for k, v in schema.items() if not k.startswith("x-")}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_json_schema(v) for v in schema]
    return schema


def with_defaults(schema: dict, value: Any) -> Any:
    """`value` with the schema's defaults filled in wherever an object is present (or defaulted), as Deckhouse does."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = with_defaults(prop, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [with_defaults(schema["items"], item) for item in value]
    return value


def definition(module_dir: pathlib.Path = MODULE_DIR) -> dict:
    """module.yaml: the module's name, namespace, stage, requirements and disable options, as Deckhouse reads them."""
    return _load_yaml(module_dir / "module.yaml")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _go(value: Any) -> str:
    """A value as Go's %v prints it in go-openapi's messages: lists as [a b], numbers without a trailing .0."""
    if isinstance(value, list):
        return "[" + " ".join(_go(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def openapi_errors(schema: dict, value: Any, root: str) -> list[str]:
    """What addon-operator's go-openapi validator says of `value` (the settings with their defaults, under `root`,
    the module's values key), one message a problem, in its words: `<root>.<path> in body should ...`."""
    import jsonschema

    out = []
    for e in jsonschema.Draft7Validator(_json_schema(schema)).iter_errors(value):
        path = ".".join([root, *(str(p) for p in e.absolute_path)])
        keyword, want = e.validator, e.validator_value
        if keyword == "additionalProperties":
            known = set((e.schema.get("properties") or {}))
            out += [f"{path}.{extra} in body is a forbidden property" for extra in sorted(set(e.instance) - known)]
        elif keyword == "required":
            out += [f"{path}.{field} in body is required" for field in want if field not in e.instance]
        else:
            words = {
                "type": f"must be of type {want}: \"{_json_type(e.instance)}\"",
                "enum": f"should be one of {_go(want)}",
                "minimum": f"should be greater than or equal to {_go(want)}",
                "maximum": f"should be less than or equal to {_go(want)}",
                "exclusiveMinimum": f"should be greater than {_go(want)}",
                "exclusiveMaximum": f"should be less than {_go(want)}",
                "pattern": f"should match '{want}'",
                "minLength": f"should be at least {want} chars long",
                "maxLength": f"should be at most {want} chars long",
                "minItems": f"should have at least {want} items",
                "maxItems": f"should have at most {want} items",
            }
            out.append(f"{path} in body {words.get(keyword, e.message)}")
    return sorted(out)


def multierror_text(problems: list[str]) -> str:
    """hashicorp/go-multierror's text of several errors, as Deckhouse flattens it into one line (each line trimmed
    and put after a space): ` 1 error occurred: * <problem>  `."""
    head = "1 error occurred:" if len(problems) == 1 else f"{len(problems)} errors occurred:"
    text = "\n".join([head, *(f"\t* {p}" for p in problems), "", ""])
    return "".join(" " + part.strip() for part in text.split("\n"))


def validate(schema: dict, value: Any, where: str) -> None:
    """Raise SettingsError naming the first bad setting, its value and what the schema wants."""
    import jsonschema

    validator = jsonschema.Draft7Validator(_json_schema(schema))
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path)
        name = f"{where}.{path}" if path else where
        raise SettingsError(f"{name}: {e.message}")


def settings_values(settings: dict | None, internal: dict | None = None,
                    module_dir: pathlib.Path = MODULE_DIR) -> dict:
    """`.Values.peering`: the ModuleConfig's settings checked and defaulted, plus the hooks' `internal`."""
    settings = copy.deepcopy(settings or {})
    validate(config_schema(module_dir), settings, "settings")
    values = dict(settings)
    values["internal"] = copy.deepcopy(internal or {})
    schema = values_schema(module_dir)
    values = with_defaults(schema, values)
    validate(schema, values, MODULE_NAME)
    return values


def global_values(*, public_domain_template: str, https: dict | None = None, cluster_uuid: str,
                  enabled_modules: list[str] | tuple[str, ...] = ("user-authn", "cert-manager"),
                  high_availability: bool = False, ingress_class: str = "nginx", placement: dict | None = None,
                  cluster_domain: str = "cluster.local", kubernetes_version: str = "1.33.0",
                  system_nodes: int = 0, registry: str = DEFAULT_REGISTRY, digests: dict | None = None,
                  kube_rbac_proxy_ca: str = "") -> dict:
    """`.Values.global` as Deckhouse computes it for a cluster, in the keys the module's templates read."""
    return {
        "clusterConfiguration": {"apiVersion": "deckhouse.io/v1", "kind": "ClusterConfiguration",
                                 "clusterDomain": cluster_domain, "clusterType": "Static",
                                 "kubernetesVersion": "Automatic", "podSubnetCIDR": "10.111.0.0/16",
                                 "serviceSubnetCIDR": "10.222.0.0/16"},
        "discovery": {"clusterUUID": cluster_uuid, "kubernetesVersion": kubernetes_version,
                      "clusterControlPlaneIsHighlyAvailable": high_availability,
                      "d8SpecificNodeCountByRole": {"system": system_nodes} if system_nodes else {}},
        "enabledModules": list(enabled_modules),
        "highAvailability": high_availability,
        "modules": {
            "publicDomainTemplate": public_domain_template,
            "ingressClass": ingress_class,
            "https": copy.deepcopy(https if https is not None else
                                   {"mode": "CertManager", "certManager": {"clusterIssuerName": "letsencrypt"}}),
            "placement": copy.deepcopy(placement or {}),
        },
        "modulesImages": {
            "registry": {"base": registry},
            "digests": copy.deepcopy(digests if digests is not None else
                                     {"common": {"kubeRbacProxy": FAKE_DIGEST}, MODULE_NAME: {"peering": FAKE_DIGEST}}),
        },
        "internal": {"modules": {"kubeRBACProxyCA": {"cert": kube_rbac_proxy_ca, "key": ""}}},
    }


def module_values(settings: dict | None = None, *, internal: dict | None = None,
                  module_dir: pathlib.Path = MODULE_DIR, **global_kw: Any) -> dict:
    """Everything the templates get: `{"global": ..., "peering": ...}`."""
    return {"global": global_values(**global_kw), MODULE_NAME: settings_values(settings, internal, module_dir)}


def render(values: dict, module_dir: pathlib.Path = MODULE_DIR, chart: Any = None) -> list[dict]:
    """The module's objects for `values`, rendered with the Helm v4 SDK as an install into d8-peering."""
    import helm_python

    if chart is None:
        with helm_python.Chart.load(str(module_dir)) as loaded:
            return render(values, module_dir, loaded)
    manifests = chart.render(values, name=MODULE_NAME, namespace=NAMESPACE, is_install=True)
    objects: list[dict] = []
    for path in sorted(manifests):
        for doc in yaml.load_all(manifests[path], Loader=yaml.CSafeLoader):
            if isinstance(doc, dict) and doc:
                objects.append(doc)
    return objects


def crds(module_dir: pathlib.Path = MODULE_DIR) -> list[dict]:
    """The module's CRDs, which Deckhouse installs from crds/ before the templates (doc-ru-* files are docs)."""
    out = []
    for path in sorted((module_dir / "crds").glob("*.yaml")):
        if path.name.startswith("doc-ru-"):
            continue
        out.extend(d for d in yaml.load_all(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader) if d)
    return out
