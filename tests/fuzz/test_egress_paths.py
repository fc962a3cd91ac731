"""The egress's path filter (gateway/admission.py `egress_path_allowed`) under arbitrary targets: a path it allows
names, after the percent-decoding kube-apiserver does (once, as Go's net/url does; a second decoding changes
nothing), a canonical path under /api, /apis or /openapi/v3, or /version or /openapi/v2: no dot segment, no empty
segment, no backslash, no escaped slash, whatever dot segments, escapes, double encodings, backslashes, queries or
fragments it was built from; the query never changes the answer; and a plain Kubernetes API path is allowed."""

from __future__ import annotations

import posixpath
from urllib.parse import quote_from_bytes, unquote_to_bytes

from hypothesis import given
from hypothesis import strategies as st

from gateway.admission import EGRESS_EXACT, EGRESS_ROOTS, egress_path_allowed

from tests.fuzz.strategies import FUZZ

_tricks = st.sampled_from([
    b"/", b".", b"..", b"%2e", b"%2E", b"%2e%2e", b".%2e", b"%2f", b"%2F", b"%5c", b"%5C", b"\\", b"%25", b"%252e",
    b"%252f", b"%25252e", b"%", b"%2", b"%zz", b"?", b"#", b"%3f", b"%23", b";", b"%3b", b"%00", b"\x00", b"//",
    b"/./", b"/../", b"peering", b"v1", b"pods", b"namespaces", b"default", b"system:auth-delegator",
    b"system%3Aauth-delegator", b"%c0%ae", b"\xc0\xae", b"\xef\xbc\x8e", b" ", b"%20", b"+", b"~"])
_roots = st.sampled_from([*EGRESS_ROOTS, *EGRESS_EXACT, b"/peering/v1", b"/", b"", b"/API", b"/apis2", b"/openapi",
                          b"/openapi/v3x", b"/metrics", b"/logs"])
_paths = (st.builds(lambda root, parts: root + b"".join(parts), _roots, st.lists(_tricks, max_size=8))
          | st.binary(max_size=60) | st.builds(lambda root, tail: root + tail, _roots, st.binary(max_size=30)))


def _under_a_root(path: bytes) -> bool:
    return path in EGRESS_EXACT or any(path == root or path.startswith(root + b"/") for root in EGRESS_ROOTS)


@FUZZ
@given(_paths)
def test_an_allowed_path_is_canonical_under_a_root_after_decoding(path):
    if not egress_path_allowed(path):
        return
    raw = path.partition(b"?")[0]
    decoded = unquote_to_bytes(raw)
    assert unquote_to_bytes(decoded) == decoded, path  # a double encoding hides nothing
    for name, form in (("as sent", raw), ("as decoded", decoded)):
        assert b"#" not in form and b"\\" not in form, (name, path)
        assert posixpath.normpath(form) == form and b"//" not in form, (name, path)
        assert all(segment not in (b"", b".", b"..") for segment in form.split(b"/")[1:]), (name, path)
        assert _under_a_root(form), (name, path)


@FUZZ
@given(_paths, st.binary(max_size=30))
def test_the_query_never_changes_the_answer(path, query):
    raw = path.partition(b"?")[0]
    assert egress_path_allowed(raw + b"?" + query) == egress_path_allowed(raw)


_segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789-.:", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))


@FUZZ
@given(st.sampled_from(EGRESS_ROOTS), st.lists(_segment, max_size=6), st.booleans())
def test_a_plain_kubernetes_api_path_is_allowed(root, segments, escape):
    """Plain segments under a root pass, and so do their escaped spellings (system%3Aauth-delegator)."""
    parts = [quote_from_bytes(s.encode(), safe="") if escape else s for s in segments]
    assert egress_path_allowed(b"/".join([root, *(p.encode() for p in parts)]))
    for exact in EGRESS_EXACT:
        assert egress_path_allowed(exact) and egress_path_allowed(exact + b"?timeout=32s")
