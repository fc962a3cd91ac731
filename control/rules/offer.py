"""Offers: what each side publishes to its peer (status.offer), the bounds a received offer must respect, and
status.peer built from an accepted one (DESIGN.md §5).

A received offer that breaks a bound is refused with OfferInvalid or OfferTooLarge; the caller keeps the previous
status.peer, so a bad offer never takes access away that a good one gave. Project and namespace names must be
DNS-1123 labels (namespaces at most 63 characters, projects 61): a name that no cluster can have is refused, never
matched or written anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from contract import reasons
from control.connstring import format_time

MAX_OFFER_BYTES = 256 * 1024
MAX_PROJECTS = 10_000
MAX_NAMESPACES_PER_PROJECT = 1_000
MAX_CAPABILITIES = 256
MAX_NAME = 253
MAX_VERSION = 64
MAX_JWKS_KEYS = 16
#: Key types whose public half is all a JWK Set of a token issuer carries.
ASYMMETRIC_KTY = frozenset({"RSA", "EC", "OKP"})
#: JWK members that only private or symmetric keys have (RFC 7518 §6.2.2, §6.3.2, §6.4; RFC 8037).
PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
SCOPES = frozenset({"project", "cluster"})
#: A namespace name: a DNS-1123 label (RFC 1123: lower-case letters, digits and '-', a letter or digit at each end).
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_NAMESPACE_NAME = 63
#: A Project's name becomes its main namespace's name: a DNS-1123 label too, and multitenancy-manager allows 61.
MAX_PROJECT_NAME = 61
_LABEL_RULE = "lower-case letters, digits and '-', beginning and ending with a letter or digit"

OFFER_INVALID = reasons.OFFER_INVALID
OFFER_TOO_LARGE = reasons.OFFER_TOO_LARGE


def build_offer(
    *,
    issuer_url: str,
    jwks: str,
    projects: Mapping[str, Iterable[str]],
    capabilities: list[dict],
    peering_version: str,
) -> dict:
    """status.offer for one peer. `capabilities` come from effective.offered_capabilities (opened and Accepted)."""
    return {
        "issuer": {"url": issuer_url, "jwks": jwks},
        "projects": [{"name": name, "namespaces": sorted(set(ns))} for name, ns in sorted(projects.items())],
        "capabilities": [
            {"name": c["name"], "version": c["version"], "scope": sorted(c.get("scope") or [])}
            for c in sorted(capabilities, key=lambda c: c["name"])
        ],
        "peeringVersion": peering_version,
    }


@dataclass(frozen=True)
class OfferCheck:
    ok: bool
    reason: str = ""
    message: str = ""


def jwks_problem(text) -> str | None:
    """Why `text` is not a public JWK Set fit for verifying tokens, or None when it is."""
    if not isinstance(text, str) or not text.strip():
        return "the JWKS is empty"
    try:
        doc = json.loads(text)
    except ValueError:
        return "the JWKS is not JSON"
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        return 'the JWKS is not a JWK Set (an object with a "keys" list)'
    keys = doc["keys"]
    if not keys:
        return "the JWK Set has no keys"
    if len(keys) > MAX_JWKS_KEYS:
        return f"the JWK Set has {len(keys)} keys, more than {MAX_JWKS_KEYS}"
    from jwcrypto import jwk  # only here: the rest of the rules need no crypto

    for i, key in enumerate(keys):
        if not isinstance(key, dict):
            return f"key {i + 1} of the JWK Set is not an object"
        if key.get("kty") not in ASYMMETRIC_KTY:
            return f"key {i + 1} of the JWK Set has kty {key.get('kty')!r}; only RSA, EC and OKP public keys are allowed"
        private = sorted(PRIVATE_MEMBERS & set(key))
        if private:
            return f"key {i + 1} of the JWK Set carries private members ({', '.join(private)}); publish public keys only"
        try:
            jwk.JWK(**key)
        except Exception:  # jwcrypto raises several unrelated types for one bad key
            return f"key {i + 1} of the JWK Set is not a valid {key.get('kty')} key"
    return None


def _bad(message: str) -> OfferCheck:
    return OfferCheck(False, OFFER_INVALID, f"the peer's offer was refused: {message}; the previous offer is kept")


def _name_ok(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def _shown(name: str) -> str:
    """A name of the peer's as a message may quote it: bounded, and with anything unprintable escaped."""
    return repr(name if len(name) <= 70 else name[:70] + "...")


def label_problem(name: str, what: str, limit: int) -> str | None:
    """Why `name` (a string) is not a valid `what` name (a DNS-1123 label of at most `limit` characters), or None."""
    if len(name) <= limit and NAMESPACE_NAME.fullmatch(name):
        return None
    return (f"{what} {_shown(name)} is not a valid {what} name ({_LABEL_RULE}, at most {limit} characters); "
            "the peer must not offer it")


def _named_items(offer: dict, key: str, what: str, limit: int) -> tuple[list, "OfferCheck | None"]:
    """The list `offer[key]` of objects with unique, bounded names, or the refusal that says what is wrong."""
    items = offer.get(key)
    items = [] if items is None else items
    if not isinstance(items, list):
        return [], _bad(f"{key} is not a list")
    if len(items) > limit:
        return [], OfferCheck(False, OFFER_TOO_LARGE, f"the peer offers {len(items)} {key}, more than {limit}")
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict) or not _name_ok(item.get("name")):
            return [], _bad(f"a {what} has no name or a name longer than {MAX_NAME}")
        if item["name"] in seen:
            return [], _bad(f"{what} {item['name']} is listed twice")
        seen.add(item["name"])
    return items, None


def _thumbprints(jwks_text) -> set[str]:
    from jwcrypto import jwk

    try:
        keys = json.loads(jwks_text).get("keys") or []
    except (TypeError, ValueError, AttributeError):
        return set()
    out = set()
    for key in keys if isinstance(keys, list) else []:
        try:
            out.add(jwk.JWK(**key).thumbprint())
        except Exception:  # a key jwks_problem refuses anyway
            continue
    return out


def _jwks_of(offer) -> str | None:
    issuer = offer.get("issuer") if isinstance(offer, dict) else None
    return issuer.get("jwks") if isinstance(issuer, dict) else None


def own_keys_problem(peer_offer, own_offer) -> str | None:
    """Why a peer's offer must be refused for publishing this cluster's own ServiceAccount keys as its issuer's,
    or None. Every default Deckhouse cluster has the same issuer URL, so the keys are the only thing that tells a
    peer's tokens from ours; our public keys are in our offer, so a hostile peer can copy them."""
    theirs, ours = _jwks_of(peer_offer), _jwks_of(own_offer)
    if not isinstance(theirs, str) or not isinstance(ours, str) or not theirs or not ours:
        return None
    if _thumbprints(theirs) & _thumbprints(ours):
        return ("the peer's offer names this cluster's own ServiceAccount signing keys as the keys of its issuer; "
                "a peer's tokens must be signed by keys of its own. The previous offer is kept")
    return None


def validate_offer(offer, *, size: int | None = None) -> OfferCheck:
    """Check a received offer against the bounds; `size` is the byte length of the body it came in, if known."""
    if size is None:
        try:
            size = len(json.dumps(offer, separators=(",", ":")).encode())
        except (TypeError, ValueError):
            return _bad("it is not JSON data")
    if size > MAX_OFFER_BYTES:
        return OfferCheck(
            False,
            OFFER_TOO_LARGE,
            f"the peer's offer is {size} bytes, more than {MAX_OFFER_BYTES}; the previous offer is kept. "
            "The peer has too many projects or namespaces for one peering",
        )
    if not isinstance(offer, dict):
        return _bad("it is not an object")

    issuer = offer.get("issuer")
    if issuer is not None:
        if not isinstance(issuer, dict):
            return _bad("issuer is not an object")
        url = issuer.get("url")
        if url:
            try:
                parts = urlsplit(url) if isinstance(url, str) else None
            except ValueError:  # an unbalanced "[" of an IPv6 literal
                parts = None
            if parts is None or parts.scheme not in ("https", "http") or not parts.hostname or len(url) > 2048:
                return _bad("issuer.url is not an http(s) URL")
        if issuer.get("jwks"):
            problem = jwks_problem(issuer["jwks"])
            if problem:
                return _bad(problem)

    projects, refusal = _named_items(offer, "projects", "project", MAX_PROJECTS)
    if refusal:
        return refusal
    for p in projects:
        problem = label_problem(p["name"], "project", MAX_PROJECT_NAME)
        if problem:
            return _bad(problem)
        ns = p.get("namespaces")
        ns = [] if ns is None else ns
        if not isinstance(ns, list) or not all(_name_ok(n) for n in ns):
            return _bad(f"the namespaces of project {p['name']} are not a list of names")
        if len(ns) > MAX_NAMESPACES_PER_PROJECT:
            return OfferCheck(
                False,
                OFFER_TOO_LARGE,
                f"project {p['name']} of the peer has {len(ns)} namespaces, more than {MAX_NAMESPACES_PER_PROJECT}",
            )
        for n in ns:
            problem = label_problem(n, "namespace", MAX_NAMESPACE_NAME)
            if problem:
                return _bad(f"{problem} (in project {p['name']})")

    caps, refusal = _named_items(offer, "capabilities", "capability", MAX_CAPABILITIES)
    if refusal:
        return refusal
    for c in caps:
        version = c.get("version")
        if not isinstance(version, str) or not 0 < len(version) <= MAX_VERSION:
            return _bad(f"capability {c['name']} has no version or one longer than {MAX_VERSION}")
        scope = c.get("scope")
        scope = [] if scope is None else scope
        if not isinstance(scope, list) or not all(isinstance(x, str) and x in SCOPES for x in scope):
            return _bad(f"capability {c['name']} has a scope other than project and cluster")

    pv = offer.get("peeringVersion")
    if pv is not None and (not isinstance(pv, str) or len(pv) > MAX_VERSION):
        return _bad(f"peeringVersion is not a string of at most {MAX_VERSION} characters")
    return OfferCheck(True)


def peer_status(offer: dict, *, alias: str, cluster_uuid: str, endpoint: str, last_sync: datetime) -> dict:
    """status.peer from an accepted offer, the peer's name for this peering, and where it was fetched."""
    issuer = offer.get("issuer") or {}
    return {
        "alias": alias,
        "clusterUUID": cluster_uuid,
        "endpoint": endpoint,
        "issuer": {"url": issuer.get("url") or "", "jwks": issuer.get("jwks") or ""},
        "projects": [
            {"name": p["name"], "namespaces": list(p.get("namespaces") or [])} for p in offer.get("projects") or []
        ],
        "capabilities": [
            {"name": c["name"], "version": c["version"], "scope": list(c.get("scope") or [])}
            for c in offer.get("capabilities") or []
        ],
        "peeringVersion": offer.get("peeringVersion") or "",
        "lastSyncTime": format_time(last_sync),
    }


def offer_of_peer(peer: dict | None) -> dict | None:
    """The offer part of a status.peer (to compare with a newly fetched one), or None without a peer."""
    if not peer:
        return None
    return {k: peer[k] for k in ("issuer", "projects", "capabilities", "peeringVersion") if k in peer}


#: What status.peer says besides the offer: who the peer is and where it was reached.
PEER_IDENTITY = ("alias", "clusterUUID", "endpoint")


def same_peer(stored: dict | None, fresh: dict) -> bool:
    """Whether a freshly pulled status.peer says nothing the stored one did not (lastSyncTime aside): then the
    stored one stays as it is, and a steady state writes nothing."""
    return stored is not None and offer_of_peer(stored) == offer_of_peer(fresh) and \
        all(stored.get(k) == fresh.get(k) for k in PEER_IDENTITY)
