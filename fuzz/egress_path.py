"""gateway/admission.py egress_path_allowed on any target path: an allowed path, percent-decoded once as
kube-apiserver decodes it, is canonical (no dot or empty segment, no backslash or escaped slash, a second decoding
changes nothing) and under /api, /apis or /openapi/v3, or is /version or /openapi/v2; the query never changes the
answer."""

from __future__ import annotations

import posixpath
from urllib.parse import unquote_to_bytes

import atheris

with atheris.instrument_imports():
    from gateway.admission import EGRESS_EXACT, EGRESS_ROOTS, egress_path_allowed

from fuzz.common import run


def _canonical_under_a_root(path: bytes) -> bool:
    return (b"#" not in path and b"\\" not in path and posixpath.normpath(path) == path and b"//" not in path
            and all(s not in (b"", b".", b"..") for s in path.split(b"/")[1:])
            and (path in EGRESS_EXACT or any(path == r or path.startswith(r + b"/") for r in EGRESS_ROOTS)))


def test_one_input(data: bytes) -> None:
    path = b"/" + data  # the egress's /peers/<name>/<rest> makes "/" + rest
    allowed = egress_path_allowed(path)
    raw, _, _ = path.partition(b"?")
    if allowed != egress_path_allowed(raw):
        raise AssertionError("the query changed the answer")
    if not allowed:
        return
    decoded = unquote_to_bytes(raw)
    if unquote_to_bytes(decoded) != decoded:
        raise AssertionError("a double encoding passed")
    if not _canonical_under_a_root(raw) or not _canonical_under_a_root(decoded):
        raise AssertionError(f"an allowed path that is not canonical under a root: {path!r}")


def seeds():
    yield b"api/v1/namespaces/default/pods?watch=true&resourceVersion=1"
    yield b"apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aauth-delegator"
    yield b"openapi/v3/apis/apps/v1?hash=abc"
    yield b"version"
    yield b"api/v1/%2e%2e/peering/v1/offer"
    yield b"apis/%252e%252e/x"


if __name__ == "__main__":
    run(test_one_input, seeds)
