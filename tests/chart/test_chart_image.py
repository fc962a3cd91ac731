"""The module's werf build (werf.yaml, .werf/stages/, images/peering/werf.inc.yaml), checked for what can be checked
without werf: every file a stage takes from the repository exists, every image a stage imports from or builds on is
defined, the process's third-party imports are all pinned (with hashes) in the lock its wheels come from, the hooks'
library is pinned likewise and reaches the bundle, and the final image runs `peering run` as Deckhouse's
unprivileged user on a distroless base, with the pod's read-only root file system and writable /tmp."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys

import pytest
import yaml

from chart_paths import CHART_DIR, REPO_ROOT
from module_values import objects, one, values

WERF_INC = CHART_DIR / "images" / "peering" / "werf.inc.yaml"
LOCK = CHART_DIR / "images" / "peering" / "requirements.lock"
HOOKS_LOCK = CHART_DIR / "lib" / "python" / "requirements.txt"
STAGES = CHART_DIR / ".werf" / "stages"
# What .werf/stages/images.yaml and werf.yaml hand the templates: the module folder in the repository and the
# image's folder name.
CONTEXT = {"ModulePath": "charts/peering/", "ImageName": "peering"}
# The base images of base_images.yml.example, which the stages build on.
BASES = {name for name in yaml.safe_load((CHART_DIR / "base_images.yml.example").read_text()) if name != "REGISTRY_PATH"}


def substitute(text: str) -> str:
    """A stage file with the context's two variables put in; anything else templated is left for werf and must not
    be in a git mapping or an image reference (the checks below would then see it)."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", text, flags=re.S)
    for key, value in CONTEXT.items():
        text = re.sub(r"\{\{\s*\$?\." + key + r"\s*\}\}", value, text)
    return text


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def image_docs() -> list[dict]:
    return documents(substitute(WERF_INC.read_text()))


def stage_docs() -> list[dict]:
    out = []
    for path in sorted(STAGES.glob("*.yaml")):
        if path.name in ("base-images.yaml", "images.yaml", "images-digests.yaml"):
            continue  # loops and lists over other files, checked through what they produce
        out += documents(substitute(path.read_text()))
    return out


def lock_pins(path) -> dict[str, list[str]]:
    """name -> hashes of every `name==version` requirement of a pip requirements file."""
    text = path.read_text().replace("\\\n", " ")
    pins: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)\s*(.*)", line)
        assert m, f"{path.name}: {line!r} is not an exact pin (name==version --hash=...)"
        pins[canonical(m.group(1))] = re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(3))
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_file_a_stage_takes_from_the_repository_exists() -> None:
    mappings = [(doc["image"], g) for doc in image_docs() + stage_docs() for g in doc.get("git", [])]
    assert len(mappings) >= 6
    for image, git in mappings:
        add = git["add"]
        assert "{{" not in add, f"{image}: git add {add!r} is templated with something the build does not set"
        source = REPO_ROOT / add.lstrip("/")
        assert source.exists(), f"{image} takes {add} from the repository, which has no such path"
        for include in git.get("includePaths", []):
            assert list(source.glob(include)), f"{image} includes {add}/{include}, which matches nothing"


def test_every_imported_or_base_image_is_defined() -> None:
    docs = image_docs() + stage_docs()
    defined = {d["image"] for d in docs} | BASES | {"images-digests-and-version"}
    for doc in docs:
        assert doc.get("fromImage") in defined, f"{doc['image']} builds on {doc.get('fromImage')}, defined nowhere"
        for imported in doc.get("import", []):
            assert imported["image"] in defined, f"{doc['image']} imports from {imported['image']}, defined nowhere"


def test_the_process_is_built_from_the_locked_wheels_offline() -> None:
    by_name = {d["image"]: d for d in image_docs()}
    assert set(by_name) == {"peering/wheels", "peering/install", "peering/peering"}
    wheels = " ".join(by_name["peering/wheels"]["shell"]["install"])
    assert "pip wheel" in wheels and "--require-hashes" in wheels and "-r /src/requirements.lock" in wheels
    assert by_name["peering/wheels"]["final"] is False and by_name["peering/install"]["final"] is False
    install = " ".join(by_name["peering/install"]["shell"]["install"])
    for flag in ("--no-index", "--find-links /wheels", "--require-hashes", "--no-deps", "-r /src/requirements.lock"):
        assert flag in install, flag
    # The process's own packages come from the repository, every one the process imports.
    taken = {g["add"].strip("/") for g in by_name["peering/install"]["git"]}
    assert imported_local_packages() <= taken


def imported_modules(package: str) -> set[str]:
    found: set[str] = set()
    for path in (REPO_ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def local_packages() -> set[str]:
    return {p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").is_file()}


def imported_local_packages() -> set[str]:
    seen, todo = set(), {"control", "gateway"}
    while todo:
        package = todo.pop()
        seen.add(package)
        todo |= (imported_modules(package) & local_packages()) - seen - {"lab", "tests", "bench"}
    return seen


def third_party_imports() -> set[str]:
    names: set[str] = set()
    for package in imported_local_packages():
        names |= imported_modules(package)
    return names - set(sys.stdlib_module_names) - local_packages() - {"__future__"}


def test_every_third_party_import_of_the_process_is_pinned_with_hashes_in_the_lock() -> None:
    pins = lock_pins(LOCK)
    distributions = importlib.metadata.packages_distributions()
    imports = third_party_imports()
    assert {"aiohttp", "cryptography", "OpenSSL", "uvloop", "yaml"} <= imports
    for module in sorted(imports):
        dists = {canonical(d) for d in distributions.get(module, [])}
        assert dists, f"the process imports {module}, which no installed distribution provides"
        assert dists & set(pins), f"the process imports {module} ({sorted(dists)}), which {LOCK.name} does not pin"
    for name, hashes in pins.items():
        assert hashes, f"{LOCK.name} pins {name} without a hash"
    # Every dependency pyproject.toml declares is there (the lock is generated from it).
    import tomllib

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in declared:
        name = canonical(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))
        assert name in pins, f"pyproject.toml depends on {name}, which {LOCK.name} does not pin"


def test_the_lock_check_sees_an_unpinned_dependency(tmp_path) -> None:
    """The parser behind the checks above must fail on a loose requirement and see a missing hash."""
    loose = tmp_path / "loose.lock"
    loose.write_text("aiohttp>=3.10\n")
    with pytest.raises(AssertionError, match="is not an exact pin"):
        lock_pins(loose)
    bare = tmp_path / "bare.lock"
    bare.write_text("aiohttp==3.14.5\n")
    assert lock_pins(bare) == {"aiohttp": []}


def test_the_hooks_library_is_pinned_and_reaches_the_bundle() -> None:
    pins = lock_pins(HOOKS_LOCK)
    assert "deckhouse" in pins and all(pins.values())
    assert importlib.metadata.version("deckhouse") == re.search(r"deckhouse==(\S+)", HOOKS_LOCK.read_text()).group(1)
    for hook in (CHART_DIR / "hooks").glob("*.py"):
        assert "from deckhouse import hook" in hook.read_text(), hook.name
    by_name = {d["image"]: d for d in stage_docs()}
    install = " ".join(by_name["python-dependencies"]["shell"]["setup"])
    assert "--require-hashes" in install and "--target /lib/python/dist" in install
    bundle = by_name["bundle"]
    assert {"image": "python-dependencies", "add": "/lib/python/dist", "to": "/lib/python/dist"}.items() <= [
        i for i in bundle["import"] if i["image"] == "python-dependencies"][0].items()
    [git] = bundle["git"]
    assert {"module.yaml", "openapi", "crds", "templates", "hooks", "monitoring", "docs"} <= set(git["includePaths"])
    release = by_name["release-channel-version"]
    assert release["git"][0]["includePaths"] == ["module.yaml"]
    werf = (CHART_DIR / "werf.yaml").read_text()
    for stage in ("base-images", "images", "images-digests", "python-hooks", "bundle", "release"):
        assert f'.werf/stages/{stage}.yaml' in werf, stage


def test_the_final_image_runs_peering_run_as_an_unprivileged_user_on_a_distroless_base() -> None:
    final = [d for d in image_docs() if d.get("final", True)]
    assert [d["image"] for d in final] == ["peering/peering"]
    [image] = final
    # Deckhouse's base images (dmt: a final image builds on base/...); base/python is its distroless CPython.
    assert image["fromImage"] == "base/python"
    docker = image["docker"]
    assert docker["ENTRYPOINT"] == ["/usr/local/bin/peering"] and docker["CMD"] == ["run"]
    user = docker["USER"].split(":")
    assert user == ["64535", "64535"]
    script = CHART_DIR / "images" / "peering" / "rootfs" / "usr" / "local" / "bin" / "peering"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/python3\n") and "from control.cli import main" in text
    assert script.stat().st_mode & 0o111
    assert docker["ENV"]["PYTHONDONTWRITEBYTECODE"] == "1" and docker["ENV"]["PYTHONPATH"] == "/opt/peering"
    # The pod gives it what the image expects: read-only root, /tmp (mount-points.yaml) writable, not root.
    pod = one(objects(None, values()), "Deployment", "peering")["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "peering"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(user[0])
    mount_points = yaml.safe_load((CHART_DIR / "images" / "peering" / "mount-points.yaml").read_text())["dirs"]
    assert mount_points == [m["mountPath"] for m in container["volumeMounts"]]
    assert [container["command"][0], container["args"][0]] == ["peering", "run"]


def test_no_dockerfile_beside_the_werf_build() -> None:
    """Each images/<name>/ is its own build context for a Dockerfile in Deckhouse's werf builds, so a Dockerfile
    here could not reach the process's sources; werf.inc.yaml is the one recipe (docs/module-build.md)."""
    assert not list((CHART_DIR / "images").glob("*/Dockerfile"))


def test_oss_yaml_names_every_direct_dependency_at_its_locked_version() -> None:
    import tomllib

    pins = {name: version for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", LOCK.read_text(), re.M)}
    pins = {canonical(k): v for k, v in pins.items()}
    oss = {canonical(e["name"]): e["version"] for e in yaml.safe_load((CHART_DIR / "oss.yaml").read_text())}
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in declared:
        name = canonical(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))
        assert oss.get(name) == pins[name], f"oss.yaml has {name} at {oss.get(name)}, the lock at {pins[name]}"
    # The interpreter is base/python's.
    assert oss["cpython"].startswith("3.12.")
