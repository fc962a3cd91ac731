"""Every suite that talks to a lab cluster's API server runs on both backends, or is an exception named with its
reason in tests/backends.py; no exception listed there is one no longer; and README.md states the share of the
whole suite's tests that run on the real kube-apiserver. The suite as this session collected it, when the session
collected all of tests/ and deselected nothing (as `make test` runs it; each xdist worker collects it all too);
otherwise one `--collect-only` of tests/ in a subprocess, with tests/backends.py as a plugin reporting every test's
marks."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import backends

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The sentence of README.md where it describes the two backends.
SHARE = re.compile(r"(\d+(?:\.\d+)?) % of the whole suite's tests run on the real kube-apiserver")


def _collected_all(config) -> bool:
    """Whether this session collected the whole of tests/ and kept every test."""
    args = [pathlib.Path(a.split("::", 1)[0]).resolve() for a in config.args]
    whole = args in ([ROOT], [ROOT / "tests"])
    narrowed = ("keyword", "markexpr", "deselect", "ignore", "ignore_glob", "lf")
    return whole and not any(config.getoption(name, None) for name in narrowed)


@pytest.fixture(scope="module")
def collected(request, tmp_path_factory) -> list[dict]:
    items = backends.report(request.session.items) if _collected_all(request.config) else _collect(tmp_path_factory)
    assert len(items) > 1000, f"only {len(items)} tests collected"
    return items


def _collect(tmp_path_factory) -> list[dict]:
    report = tmp_path_factory.mktemp("backends") / "items.json"
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "tests.backends"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "0"]  # collected here, where the plugin's hook sees the items
    done = subprocess.run([*cmd, "tests/"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, backends.REPORT_ENV: str(report)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_suite_that_talks_to_an_api_server_runs_on_both_backends_or_is_a_listed_exception(collected):
    scope = [i for i in collected if backends.in_scope(i["nodeid"])]
    assert any(i["real"] for i in scope) and any(i["emulator"] for i in scope)
    assert backends.problems(collected) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_states_the_share_of_tests_on_the_real_backend(collected):
    share = 100 * sum(1 for i in collected if i["real"]) / len(collected)
    stated = SHARE.findall((ROOT / "README.md").read_text())
    assert len(stated) == 1, "README.md must say once: '<N> % of the whole suite's tests run on the real " \
                             f"kube-apiserver' (now {share:.1f} %)"
    assert abs(float(stated[0]) - share) <= 1.0, f"README.md says {stated[0]} %, the suite has {share:.1f} %"


def _item(nodeid: str, *marks: str) -> dict:
    return {"nodeid": nodeid, "test": backends.test_key(nodeid), "emulator": "emulator" in marks,
            "real": "real" in marks}


E2E = "tests/e2e/test_x.py"
LISTED = {f"{E2E}::test_hooks": (backends.EMULATOR_ONLY, "needs the after-write hooks"),
          "tests/e2e/test_parts.py": (backends.PURE, "no cluster")}


def test_a_suite_on_both_backends_and_listed_exceptions_of_their_kind_pass():
    items = [_item(f"{E2E}::test_flow[emulator]", "emulator"), _item(f"{E2E}::test_flow[real]", "real"),
             _item(f"{E2E}::test_hooks[case-emulator]", "emulator"), _item("tests/e2e/test_parts.py::test_a"),
             _item("tests/control/test_elsewhere.py::test_emulator_only", "emulator")]
    assert backends.problems(items, LISTED) == []


def test_an_unlisted_test_on_one_backend_fails_and_so_does_one_on_none():
    items = [_item(f"{E2E}::test_flow[emulator]", "emulator"), _item(f"{E2E}::test_hooks[emulator]", "emulator"),
             _item("tests/e2e/test_parts.py::test_a"), _item("tests/gateway/test_kubectl.py::test_k")]
    found = backends.problems(items, LISTED)
    assert len(found) == 2
    assert found[0].startswith(f"{E2E}::test_flow runs on emulator only")
    assert found[1].startswith("tests/gateway/test_kubectl.py::test_k is marked with no backend")


def test_an_exception_that_no_longer_is_one_fails():
    items = [_item(f"{E2E}::test_hooks[emulator]", "emulator"), _item(f"{E2E}::test_hooks[real]", "real"),
             _item("tests/e2e/test_parts.py::test_a", "real")]
    found = backends.problems(items, LISTED)
    assert found == ["tests/e2e/test_parts.py::test_a is listed as pure in tests/backends.py but runs on real: "
                     "correct its entry",
                     f"{E2E}::test_hooks is listed as emulator only in tests/backends.py but runs on both backends: "
                     "take it off the list"]


def test_an_exception_naming_nothing_collected_or_without_a_reason_fails():
    items = [_item("tests/e2e/test_parts.py::test_a")]
    found = backends.problems(items, {**LISTED, "tests/e2e/test_parts.py": (backends.PURE, "")})
    assert any("give one of" in p for p in found)
    assert f"{E2E}::test_hooks is listed in tests/backends.py but no such test is collected in scope: take it off" \
        in found
