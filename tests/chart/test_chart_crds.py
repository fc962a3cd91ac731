"""The three CRDs against the CRD reference document: every field, type, description, limit, enum, default,
required value and sensitive marker, plus scope, short names, version and the status subresource.

The reference is parsed from the text administrators read (the rendered Deckhouse documentation), so a field
that drifts in either the document or the CRD fails here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import yaml

from chart_paths import CRD_DIR

KINDS = ("ClusterPeer", "PeeringCapability", "ProjectPeer")
ELEMENT = "Element of the array"
# A field bullet names a path under spec or status; other bullets (the condition types in a description) do not.
FIELD_BULLET = re.compile(rf"^\s*•\s+((?:spec|status)(?:\.(?:[A-Za-z][A-Za-z0-9]*|{ELEMENT}))*)\s*$")
DOC_TYPES = {
    "object": ("object", None),
    "string": ("string", None),
    "integer": ("integer", None),
    "boolean": ("boolean", None),
    "array of strings": ("array", "string"),
    "array of objects": ("array", "object"),
}
SENSITIVE_NOTE = "Without permission on the clusterpeers/sensitive subresource"


@dataclass
class Field:
    type: tuple[str, str | None]
    description: str | None = None
    required: bool = False
    max_length: int | None = None
    enum: list[str] | None = None
    minimum: int | None = None
    default: str | None = None


@dataclass
class Resource:
    kind: str
    scope: str = ""
    version: str = ""
    short_names: list[str] = field(default_factory=list)
    description: str | None = None
    fields: dict[str, Field] = field(default_factory=dict)


def normalize(text: str | None) -> str | None:
    """Text as a reader sees it: list markers dropped (the site renders Markdown "- " as "•"), whitespace folded."""
    if text is None:
        return None
    lines = [re.sub(r"^\s*(?:•|-)\s+", "", line) for line in text.splitlines()]
    folded = " ".join(" ".join(lines).split())
    return folded or None


def _parse_field(type_line: str, body: list[str]) -> Field:
    assert type_line in DOC_TYPES, f"the reference names a type this test does not know: {type_line!r}"
    parsed = Field(type=DOC_TYPES[type_line])
    description: list[str] = []
    for line in body:
        if line == "Required value":
            parsed.required = True
        elif m := re.fullmatch(r"Maximum length: (\d+)", line):
            parsed.max_length = int(m.group(1))
        elif m := re.fullmatch(r"Allowed values: (\d+) <= X", line):
            parsed.minimum = int(m.group(1))
        elif m := re.fullmatch(r"Allowed values: (.+)", line):
            parsed.enum = [v.strip() for v in m.group(1).split(",")]
        elif m := re.fullmatch(r"Default: (.+)", line):
            parsed.default = m.group(1)
        else:
            description.append(line)
    parsed.description = normalize("\n".join(description))
    return parsed


def parse_reference(text: str) -> dict[str, Resource]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() in KINDS]
    assert [lines[i].strip() for i in starts] == list(KINDS), "the reference no longer lists the three kinds in order"
    resources: dict[str, Resource] = {}
    for n, start in enumerate(starts):
        section = lines[start + 1 : starts[n + 1] if n + 1 < len(starts) else len(lines)]
        res = Resource(kind=lines[start].strip())
        bullets = [i for i, line in enumerate(section) if FIELD_BULLET.match(line)]
        header = [line.strip() for line in section[: bullets[0] if bullets else len(section)]]
        description: list[str] = []
        for line in header:
            if m := re.fullmatch(r"Short names: (.+)", line):
                res.short_names = [s.strip() for s in m.group(1).split(",")]
            elif m := re.fullmatch(r"Scope: (\w+)", line):
                res.scope = m.group(1)
            elif m := re.fullmatch(r"Version: (\w+)", line):
                res.version = m.group(1)
            else:
                description.append(line)
        res.description = normalize("\n".join(description))
        for k, b in enumerate(bullets):
            path = FIELD_BULLET.match(section[b]).group(1)
            end = bullets[k + 1] if k + 1 < len(bullets) else len(section)
            body = [line.strip() for line in section[b + 1 : end]]
            while body and not body[0]:
                body.pop(0)
            res.fields[path] = _parse_field(body[0], body[1:])
        resources[res.kind] = res
    return resources


def crd_fields(schema: dict, prefix: str = "") -> dict[str, dict]:
    """Every field of an openAPIV3Schema by the reference's path notation: object items of an array share the
    array's path; scalar items are `<array>.Element of the array`, listed (as the documentation lists them) only
    when they say more than their type."""
    out: dict[str, dict] = {}
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out[path] = prop
        out.update(_below(prop, path))
    return out


def _below(prop: dict, path: str) -> dict[str, dict]:
    if prop.get("type") == "object":
        return crd_fields(prop, path)
    if prop.get("type") == "array":
        items = prop["items"]
        if items.get("type") == "object":
            return crd_fields(items, path)
        if set(items) - {"type"}:
            return {f"{path}.{ELEMENT}": items, **_below(items, f"{path}.{ELEMENT}")}
    return {}


def crd_required(schema: dict, prefix: str = "") -> set[str]:
    """Paths that the CRD makes required in their parent object."""
    out = {f"{prefix}.{r}" if prefix else r for r in schema.get("required", [])}
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        node = prop["items"] if prop.get("type") == "array" else prop
        out |= crd_required(node, path)
    return out


def list_map_keys(schema: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out |= {f"{path}.{key}" for key in prop.get("x-kubernetes-list-map-keys", [])}
        out |= list_map_keys(prop["items"] if prop.get("type") == "array" else prop, path)
    return out


def sensitive_markers(node, path: str = "") -> set[str]:
    """Every place of a schema carrying x-kubernetes-sensitive-data, wherever it hides (items, nested props)."""
    found: set[str] = set()
    if isinstance(node, dict):
        if node.get("x-kubernetes-sensitive-data") is not None:
            found.add(path)
        for key, value in node.items():
            step = {"properties": "", "items": ELEMENT}.get(key, key)
            if key == "properties" and isinstance(value, dict):
                for name, prop in value.items():
                    found |= sensitive_markers(prop, f"{path}.{name}" if path else name)
            elif key != "properties":
                found |= sensitive_markers(value, f"{path}.{step}" if path else step)
    elif isinstance(node, list):
        for item in node:
            found |= sensitive_markers(item, path)
    return found


@pytest.fixture(scope="module")
def reference(reference_text: str) -> dict[str, Resource]:
    return parse_reference(reference_text)


def test_the_parser_sees_the_whole_reference(reference: dict[str, Resource]) -> None:
    """Guards the parser itself: a document it misread would make every comparison below vacuous."""
    assert {k: len(r.fields) for k, r in reference.items()} == {"ClusterPeer": 68, "PeeringCapability": 26,
                                                                "ProjectPeer": 10}
    cp = reference["ClusterPeer"].fields
    assert cp["spec.type"].required and cp["spec.type"].enum == ["Invite", "Join"]
    assert cp["status.conditions.observedGeneration"].minimum == 0
    assert cp["status.peer.alias"].max_length == 1048576
    assert "ClientCertEnforced" in cp["status.conditions"].description
    assert reference["PeeringCapability"].fields["spec.consumers.kind"].default == "ServiceAccount"


@pytest.mark.parametrize("kind", KINDS)
def test_crd_identity_matches_the_reference(kind: str, reference: dict[str, Resource], crds: dict) -> None:
    doc, crd = reference[kind], crds[kind]
    assert crd["spec"]["group"] == "peering.deckhouse.io"
    assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.peering.deckhouse.io"
    assert crd["spec"]["scope"] == doc.scope
    assert crd["spec"]["names"].get("shortNames", []) == doc.short_names
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (doc.version, True, True)
    assert version["subresources"] == {"status": {}}
    assert normalize(version["schema"]["openAPIV3Schema"].get("description")) == doc.description


#: Status fields beyond the reference, each a documented departure (docs/design-changes.md names its parent): the
#: record of who redeemed an invite, written with `used`, and why a used string was issued again.
EXTENSIONS = {"ClusterPeer": {"status.invite.redeemer", "status.invite.abandoned", "status.invite.reissue"}}


def _extension(kind: str, path: str) -> bool:
    return any(path == e or path.startswith(e + ".") for e in EXTENSIONS.get(kind, ()))


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_of_the_reference_is_in_the_crd_and_nothing_else(kind: str, reference, crds) -> None:
    fields = crd_fields(crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert sorted(p for p in fields if not _extension(kind, p)) == sorted(reference[kind].fields)
    for extension in EXTENSIONS.get(kind, ()):
        assert extension in fields and extension not in reference[kind].fields, extension


def test_each_extension_is_a_documented_departure() -> None:
    docs = (CRD_DIR.parents[2] / "docs" / "design-changes.md").read_text()
    for paths in EXTENSIONS.values():
        for path in paths:
            assert f"`{path}`" in docs, f"{path} extends the CRD reference: say why in docs/design-changes.md"


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_has_the_type_description_limits_and_enum_of_the_reference(kind, reference, crds) -> None:
    fields = crd_fields(crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    for path, want in reference[kind].fields.items():
        got = fields[path]
        got_type = (got["type"], got["items"]["type"] if got["type"] == "array" else None)
        assert got_type == want.type, path
        assert normalize(got.get("description")) == want.description, path
        assert got.get("maxLength") == want.max_length, path
        assert got.get("enum") == want.enum, path
        assert got.get("minimum") == want.minimum, path


def test_defaults_are_those_of_the_reference_and_the_guide(reference, crds, guide_text: str) -> None:
    """The reference gives consumers.kind; the administrator's guide gives tokenTTL ("24h by default")."""
    ttl_default = re.search(r"tokenTTL is [^:]*: from \S+ to \S+, (\S+) by default", guide_text).group(1)
    expected = {
        (kind, path): f.default for kind, r in reference.items() for path, f in r.fields.items() if f.default
    }
    expected[("ClusterPeer", "spec.invite.tokenTTL")] = ttl_default
    found = {
        (kind, path): prop["default"]
        for kind, crd in crds.items()
        for path, prop in crd_fields(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).items()
        if "default" in prop
    }
    assert found == expected == {
        ("PeeringCapability", "spec.consumers.kind"): "ServiceAccount",
        ("ClusterPeer", "spec.invite.tokenTTL"): "24h",
    }


@pytest.mark.parametrize("kind", KINDS)
def test_required_values_are_those_of_the_reference(kind, reference, crds) -> None:
    """Exactly the reference's required fields, plus what makes them bite (their parent objects, so that an
    object without spec cannot dodge spec.type) and the keys of list maps (the API server demands those)."""
    schema = crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    doc_required = {path for path, f in reference[kind].fields.items() if f.required}
    parents = {".".join(p.split(".")[:i]) for p in doc_required for i in range(1, p.count(".") + 1)}
    assert crd_required(schema) == doc_required | parents | list_map_keys(schema)


def test_sensitive_markers_are_on_the_two_connection_strings_only(reference, crds) -> None:
    from_document = {
        (kind, path)
        for kind, r in reference.items()
        for path, f in r.fields.items()
        if f.description and SENSITIVE_NOTE in f.description
    }
    assert from_document == {
        ("ClusterPeer", "spec.join.connectionString"),
        ("ClusterPeer", "status.invite.connectionString"),
    }
    in_crds = {(kind, path) for kind, crd in crds.items() for path in sensitive_markers(crd, "")}
    prefix = "spec.versions.schema.openAPIV3Schema."
    assert {(kind, path.removeprefix(prefix)) for kind, path in in_crds} == from_document
    for kind, path in from_document:
        prop = crd_fields(crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])[path]
        assert prop["x-kubernetes-sensitive-data"] is True


def test_sensitive_marker_walk_finds_markers_anywhere() -> None:
    """The walk above must see a marker put on an object, on array items or on the root, or it proves nothing."""
    schema = {
        "x-kubernetes-sensitive-data": True,
        "properties": {
            "a": {"type": "object", "x-kubernetes-sensitive-data": True, "properties": {}},
            "b": {"type": "array", "items": {"type": "string", "x-kubernetes-sensitive-data": True}},
        },
    }
    assert sensitive_markers(schema) == {"", "a", f"b.{ELEMENT}"}


def test_conditions_are_a_list_map_keyed_by_type(crds) -> None:
    for kind in ("ClusterPeer", "PeeringCapability"):
        conditions = crd_fields(crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])["status.conditions"]
        assert conditions["x-kubernetes-list-type"] == "map", kind
        assert conditions["x-kubernetes-list-map-keys"] == ["type"], kind


def test_printer_columns_are_those_the_guide_reads(crds, guide_text: str) -> None:
    shown = {
        kind: {c["name"].upper(): c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
               if c.get("priority", 0) == 0}
        for kind, crd in crds.items()
    }
    assert shown == {
        "ClusterPeer": {
            "PHASE": ".status.phase",
            "READY": '.status.conditions[?(@.type=="Ready")].status',
            "EFFECTIVE": ".status.effectiveCapabilities",
            "AGE": ".metadata.creationTimestamp",
        },
        "PeeringCapability": {
            "ACCEPTED": '.status.conditions[?(@.type=="Accepted")].status',
            "AGE": ".metadata.creationTimestamp",
        },
        "ProjectPeer": {"STATE": ".status.state", "AGE": ".metadata.creationTimestamp"},
    }
    for column in ("PHASE", "READY", "EFFECTIVE", "ACCEPTED", "STATE"):
        assert re.search(rf"\b{column}\b", guide_text), f"the guide no longer speaks of the {column} column"


def test_each_crd_file_holds_one_crd() -> None:
    """One CRD per file and no stray documents: Deckhouse installs every document under crds/ as it is. Beside
    each CRD, doc-ru-<file> holds its Russian descriptions for the documentation and nothing else."""
    kinds = []
    paths = sorted(CRD_DIR.glob("*"))
    translations = {p.name.removeprefix("doc-ru-") for p in paths if p.name.startswith("doc-ru-")}
    for path in paths:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        assert path.suffix == ".yaml" and len(docs) == 1, path.name
        if path.name.startswith("doc-ru-"):
            assert set(docs[0]) == {"spec"} and set(docs[0]["spec"]) == {"versions"}, path.name
            continue
        assert docs[0]["kind"] == "CustomResourceDefinition", path.name
        assert docs[0]["metadata"]["labels"]["heritage"] == "deckhouse", path.name
        assert docs[0]["metadata"]["labels"]["module"] == "peering", path.name
        kinds.append(docs[0]["spec"]["names"]["kind"])
    assert sorted(kinds) == sorted(KINDS)
    assert translations == {p.name for p in paths if not p.name.startswith("doc-ru-")}


def described(schema: dict, path: str = "") -> dict[str, str]:
    """Every description of a schema (or of a doc-ru file's mirror of it) by path, array items as `[]`."""
    out = {path or "<root>": schema["description"]} if isinstance(schema.get("description"), str) else {}
    for name, prop in (schema.get("properties") or {}).items():
        out.update(described(prop, f"{path}.{name}" if path else name))
    if isinstance(schema.get("items"), dict):
        out.update(described(schema["items"], path + "[]"))
    return out


def schema_paths(schema: dict, path: str = "") -> set[str]:
    out = {path or "<root>"}
    for name, prop in (schema.get("properties") or {}).items():
        out |= schema_paths(prop, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        out |= schema_paths(schema["items"], path + "[]")
    return out


CYRILLIC = re.compile(r"[А-Яа-яЁё]")


@pytest.mark.parametrize("kind", KINDS)
def test_every_description_has_its_russian_twin(kind: str, crds) -> None:
    """doc-ru-<crd>.yaml translates every description of the CRD, at the same path, and nothing the CRD does not
    describe: the Russian documentation of a field is never missing nor says what the English does not."""
    crd = crds[kind]
    source = next(p for p in CRD_DIR.glob("*.yaml") if not p.name.startswith("doc-ru-") and yaml.safe_load(
        p.read_text())["spec"]["names"]["kind"] == kind)
    ru = yaml.safe_load((CRD_DIR / f"doc-ru-{source.name}").read_text())
    [version] = crd["spec"]["versions"]
    [ru_version] = ru["spec"]["versions"]
    assert ru_version["name"] == version["name"]
    english = described(version["schema"]["openAPIV3Schema"])
    russian = described(ru_version["schema"]["openAPIV3Schema"])
    assert sorted(set(english) - set(russian)) == [], "described in English only"
    assert sorted(set(russian) - set(english)) == [], "described in Russian only"
    assert schema_paths(ru_version["schema"]["openAPIV3Schema"]) <= schema_paths(version["schema"]["openAPIV3Schema"])
    for path, text in russian.items():
        assert CYRILLIC.search(text), f"{kind} {path}: the Russian description is not in Russian: {text!r}"
        # The sensitive-field note and the condition reasons are kept word for word where they are names.
        for name in re.findall(r"clusterpeers/sensitive|<omitted>|\b[A-Z][a-z]+[A-Z][A-Za-z]+", english[path]):
            # A plural of English ("ServiceAccounts") is a name in its singular in Russian.
            assert name.removesuffix("s") in text, f"{kind} {path}: the Russian description drops {name!r}"


def test_the_twin_check_sees_a_missing_translation() -> None:
    english = {"description": "x", "properties": {"a": {"description": "A"}, "b": {"description": "B"}}}
    russian = {"description": "икс", "properties": {"a": {"description": "А"}}}
    assert set(described(english)) - set(described(russian)) == {"b"}
    assert described({"items": {"properties": {"n": {"description": "N"}}}}, "l") == {"l[].n": "N"}
