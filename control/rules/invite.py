"""Invite tokens, the desired `status.invite`, and the redemption decision of `POST /v1/join`.

Only `sha256(secret)` is stored. Redemption compares in constant time and answers an unknown token ID and a wrong
secret alike, so the public join endpoint reveals nothing about which token IDs exist.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from contract import reasons
from contract.errors import InputError
from control.connstring import format_time

TTL_MIN = timedelta(minutes=10)
TTL_MAX = timedelta(hours=24)
TTL_DEFAULT = timedelta(hours=24)
TOKEN_ID_LENGTH = 8
#: 32 random bytes: 256 bits, twice the 128 the design asks for.
SECRET_BYTES = 32

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms|us|µs|ns)")
_UNIT = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}


class InviteError(InputError):
    """A spec.invite the module cannot use; `reason` is machine-readable."""


@dataclass(frozen=True)
class Token:
    token_id: str
    secret: str = field(repr=False)

    @property
    def text(self) -> str:
        return f"{self.token_id}.{self.secret}"


def generate_token() -> Token:
    """A fresh token: an 8-character lower-case ID and a 256-bit URL-safe secret."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    token_id = "".join(secrets.choice(alphabet) for _ in range(TOKEN_ID_LENGTH))
    return Token(token_id, secrets.token_urlsafe(SECRET_BYTES))


def token_hash(secret: str) -> str:
    """SHA-256 of the secret, 64 lower-case hex characters: all that status.invite keeps of it."""
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(text: str) -> tuple[str, str] | None:
    """`(tokenID, secret)` of a presented token, or None when it is not `<id>.<secret>`."""
    if not isinstance(text, str):
        return None
    token_id, sep, secret = text.partition(".")
    if not sep or not token_id or not secret or len(token_id) > 16 or len(secret) > 256:
        return None
    return token_id, secret


def parse_duration(text: str) -> timedelta:
    """A Go duration string (`1h`, `90m`, `1h30m`, `1.5h`, `600s`); ValueError when it is not one."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    if s == "0":
        return timedelta(0)
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"{text!r} is not a duration")
    return timedelta(seconds=total)


def parse_ttl(text: str | None) -> timedelta:
    """spec.invite.tokenTTL: 10m to 24h, 24h when unset; InviteError InvalidTokenTTL otherwise."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return TTL_DEFAULT
    if not isinstance(text, str):
        raise InviteError("InvalidTokenTTL", f"spec.invite.tokenTTL must be a string like 1h or 90m, got {text!r}")
    try:
        ttl = parse_duration(text)
    except ValueError:
        raise InviteError(
            "InvalidTokenTTL",
            f"spec.invite.tokenTTL {text!r} is not a duration; write it like 1h, 90m or 1h30m (from 10m to 24h)",
        ) from None
    if not TTL_MIN <= ttl <= TTL_MAX:
        raise InviteError(
            "InvalidTokenTTL",
            f"spec.invite.tokenTTL {text!r} is out of range; set a value from 10m to 24h, or remove it for 24h",
        )
    return ttl


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time as Kubernetes writes it, or None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class InviteDecision:
    """Keep the current status.invite (`issue` False) or issue a new string expiring at `expires_at`."""

    issue: bool
    expires_at: datetime | None = None
    #: Why, for logs and events: Missing, Expired, Unreadable, Valid, Used.
    why: str = ""


def decide_invite(current: dict | None, *, ttl: timedelta, now: datetime) -> InviteDecision:
    """Whether an Invite ClusterPeer needs a new connection string. Call it only while no peer Secret exists (the
    exchange has not started on this side): once it has, the invite is history.

    A new one when there is none or the unused one expired; never while a valid unused one exists. A used one is
    kept while its redemption may still complete: the redeemer retrying with its key is answered and whatever is
    missing rebuilt. It is re-issued (`why` is then the reason Ready shows) when the redemption can no longer
    complete: a join with another key found it stranded (`abandoned`: RedeemedWithAnotherKey), or the redeemer did
    not come back within `ttl` of redeeming it (JoinAbandoned).
    """
    if not current or not current.get("tokenHash") or not current.get("tokenID"):
        return InviteDecision(True, now + ttl, "Missing")
    if current.get("used") is True:
        abandoned = current.get("abandoned")
        if isinstance(abandoned, dict) and abandoned.get("reason") == REDEEMED_WITH_ANOTHER_KEY:
            return InviteDecision(True, now + ttl, REDEEMED_WITH_ANOTHER_KEY)
        deadline = completion_deadline(current, ttl)
        if deadline is not None and now >= deadline:
            return InviteDecision(True, now + ttl, JOIN_ABANDONED)
        return InviteDecision(False, why="Used")
    if not current.get("connectionString"):
        # The secret is not stored, so a lost string can only be replaced, never shown again.
        return InviteDecision(True, now + ttl, "Missing")
    expires = parse_time(current.get("expiresAt"))
    if expires is None:
        return InviteDecision(True, now + ttl, "Unreadable")
    if now >= expires:
        return InviteDecision(True, now + ttl, "Expired")
    return InviteDecision(False, why="Valid")


#: Ready reasons of an Invite whose string was re-issued because the redemption of the previous one could not
#: complete (docs/protocol.md §5).
JOIN_ABANDONED = "JoinAbandoned"
REDEEMED_WITH_ANOTHER_KEY = "RedeemedWithAnotherKey"
REISSUE_REASONS = frozenset({JOIN_ABANDONED, REDEEMED_WITH_ANOTHER_KEY})


def completion_deadline(current: dict, ttl: timedelta) -> datetime | None:
    """Until when a used string's redemption may complete: `ttl` after `redeemer.redeemedAt`; for a string used
    before the redeemer was recorded, its expiry."""
    redeemer = current.get("redeemer") if isinstance(current.get("redeemer"), dict) else {}
    redeemed = parse_time(redeemer.get("redeemedAt"))
    if redeemed is not None:
        return redeemed + ttl
    return parse_time(current.get("expiresAt"))


def invite_status(token: Token, connection_string: str, expires_at: datetime, *,
                  previous: dict | None = None, why: str = "", now: datetime | None = None) -> dict:
    """The status.invite of a freshly issued string. When it replaces a used string whose redemption could not
    complete (`why` in REISSUE_REASONS), `reissue` says so, naming the previous redeemer."""
    out = {
        "connectionString": connection_string,
        "expiresAt": format_time(expires_at),
        "tokenHash": token_hash(token.secret),
        "tokenID": token.token_id,
        "used": False,
    }
    if why in REISSUE_REASONS and previous:
        out["reissue"] = {"reason": why, "message": reissue_message(why, previous.get("redeemer")),
                          **({"at": format_time(now)} if now else {})}
    return out


def reissue_message(why: str, redeemer) -> str:
    """Ready's message while a re-issued string waits to be used."""
    who = "a cluster"
    if isinstance(redeemer, dict) and redeemer.get("clusterUUID"):
        who = f"cluster {redeemer['clusterUUID']}" + (f" at {redeemer['redeemedAt']}" if redeemer.get("redeemedAt")
                                                        else "")
    if why == REDEEMED_WITH_ANOTHER_KEY:
        detail = ("and then a join came with the same string and another key, so the first redemption can no longer "
                  "complete (the joining ClusterPeer was probably re-created)")
    else:
        detail = "and did not complete the exchange in time (the joining cluster gave up or was stopped)"
    return (f"the previous connection string was redeemed by {who} {detail}; a new connection string was issued "
            "in status.invite.connectionString: give it to the joining cluster")


def mark_used(current: dict, redeemer: "Redeemer", now: datetime) -> dict:
    """status.invite after a successful redemption, written with a resourceVersion precondition: the token is used
    and who redeemed it is recorded in the same write, so that a crash after it loses nothing (the same joiner
    retrying is answered again, whatever came after the write is rebuilt)."""
    out = {k: v for k, v in current.items() if k not in ("reissue", "abandoned")}
    return {**out, "used": True, "redeemer": {"clusterUUID": redeemer.cluster_uuid,
                                              "keyFingerprint": redeemer.key_fingerprint,
                                              "redeemedAt": format_time(now)}}


def mark_abandoned(current: dict, now: datetime) -> dict:
    """status.invite once a join with another key found the redemption stranded (no peer Secret was ever written):
    the reconciler then issues a fresh string with reason RedeemedWithAnotherKey."""
    return {**current, "abandoned": {"reason": REDEEMED_WITH_ANOTHER_KEY, "at": format_time(now)}}


def stranded(current: dict | None, now: datetime, grace: timedelta) -> bool:
    """Whether a used string whose peer Secret does not exist was cut short by a crash: used, not yet marked
    abandoned, and redeemed more than `grace` ago (or before the redeemer was recorded). A redemption still under
    way between its two writes is younger than that."""
    if not current or current.get("used") is not True or current.get("abandoned"):
        return False
    redeemer = current.get("redeemer") if isinstance(current.get("redeemer"), dict) else {}
    redeemed = parse_time(redeemer.get("redeemedAt"))
    return redeemed is None or now - redeemed >= grace


def recorded_redeemer(current: dict | None) -> "Redeemer | None":
    """Who redeemed the string, as status.invite records it, or None."""
    r = (current or {}).get("redeemer")
    if not isinstance(r, dict):
        return None
    uuid, fp = r.get("clusterUUID"), r.get("keyFingerprint")
    if not isinstance(uuid, str) or not isinstance(fp, str) or not uuid or not fp:
        return None
    return Redeemer(uuid, fp)


@dataclass(frozen=True)
class Redeemer:
    """Who redeemed a token: recorded in status.invite.redeemer by the write that marks it used (and, before that
    record existed, read from the peer Secret), to answer a repeated join again."""

    cluster_uuid: str
    key_fingerprint: str


@dataclass(frozen=True)
class Redemption:
    """The join endpoint's decision.

    outcome: "accept" (mark used, sign, answer), "reanswer" (the same cluster and key that redeemed it: answer the
    stored result again, or rebuild what a crash left unwritten), "refuse" (answer `reason` with `message`).
    """

    outcome: str
    reason: str
    message: str

    @property
    def ok(self) -> bool:
        return self.outcome != "refuse"


_INVALID = Redemption(
    "refuse",
    reasons.TOKEN_INVALID,
    "the token of the connection string is not valid here; ask the inviting cluster for a new connection string",
)


def token_matches(stored_invite: dict | None, presented_token: str) -> bool:
    """Whether `presented_token` is the token of `stored_invite` (a status.invite, None when its token ID is
    unknown): ID and secret, compared in constant time, and hashed and compared even when nothing is stored, so
    neither the answer nor its timing tells an unknown token ID from a wrong secret."""
    parts = split_token(presented_token)
    presented_id, presented_secret = parts if parts else ("", "")
    presented_hash = token_hash(presented_secret)
    stored = stored_invite or {}
    stored_id = str(stored.get("tokenID") or "")
    stored_hash = str(stored.get("tokenHash") or "")
    id_ok = hmac.compare_digest(presented_id.encode(), stored_id.encode())
    hash_ok = hmac.compare_digest(presented_hash.encode(), (stored_hash or "-" * 64).encode())
    return bool(parts and stored_id and stored_hash and id_ok and hash_ok)


def redeem(
    stored_invite: dict | None,
    presented_token: str,
    joiner_uuid: str,
    expected_uuid: str | None,
    now: datetime,
    *,
    joiner_key_fingerprint: str = "",
    redeemed_by: Redeemer | None = None,
) -> Redemption:
    """Decide a redemption of `presented_token` against the status.invite found by its token ID (None if none).

    Order: token (constant time, unknown and wrong alike) → a used token (the same cluster and key get the same
    answer again, anyone else TokenUsed) → expiry → expected cluster.

    `redeemed_by` is who redeemed it: status.invite.redeemer (written with `used`), else who the peer Secret
    `peer-<clusterpeer>` names. Whatever a crash left behind, the token counts as taken: the same cluster and key
    are answered again, anyone else gets TokenUsed.
    """
    if not token_matches(stored_invite, presented_token):
        return _INVALID
    stored = stored_invite or {}
    if stored.get("used") is True or redeemed_by is not None:
        if (
            redeemed_by is not None
            and joiner_key_fingerprint
            and hmac.compare_digest(redeemed_by.cluster_uuid.encode(), joiner_uuid.encode())
            and hmac.compare_digest(redeemed_by.key_fingerprint.encode(), joiner_key_fingerprint.encode())
        ):
            return Redemption("reanswer", "Redeemed", "the join was already accepted; answering it again")
        return Redemption(
            "refuse",
            reasons.TOKEN_USED,
            "the connection string was already used by another join; a string is valid for one connection, "
            "ask the inviting cluster for a new ClusterPeer of type Invite",
        )
    expires = parse_time(stored.get("expiresAt"))
    if expires is None or now >= expires:
        return Redemption(
            "refuse",
            reasons.TOKEN_EXPIRED,
            "the connection string expired; get the new one from status.invite.connectionString of the inviting "
            "cluster",
        )
    if expected_uuid and not hmac.compare_digest(expected_uuid.encode(), joiner_uuid.encode()):
        return Redemption(
            "refuse",
            reasons.CLUSTER_NOT_EXPECTED,
            f"the inviting cluster only accepts the cluster named in its spec.invite.expectedClusterUUID, not "
            f"{joiner_uuid}; check that you joined with the right cluster or ask for the UUID to be corrected",
        )
    return Redemption("accept", "Accepted", "the join is accepted")
