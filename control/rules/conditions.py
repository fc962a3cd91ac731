"""Conditions of a ClusterPeer and how each reason is chosen from what was observed.

`set_condition` keeps lastTransitionTime unless the status changes. The choosers below are the only place where a
reason is picked: TokenExchangeReady from the observed TokenExchangeProvider, ClientCertEnforced and ServerCertOurs
from the self-check probe, and Ready with the phase from the state of the peering. docs/protocol.md lists every
reason with what it means and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from contract import reasons
from control.connstring import format_time

READY = "Ready"
TOKEN_EXCHANGE_READY = "TokenExchangeReady"
CLIENT_CERT_ENFORCED = "ClientCertEnforced"
SERVER_CERT_OURS = "ServerCertOurs"
ACCEPTED = "Accepted"

PENDING, ACTIVE, ERROR = "Pending", "Active", "Error"


@dataclass(frozen=True)
class Cond:
    """A condition's value without its bookkeeping (type, times, generation)."""

    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str


def get_condition(conditions: list[dict] | None, type_: str) -> dict | None:
    return next((c for c in conditions or [] if isinstance(c, dict) and c.get("type") == type_), None)


def set_condition(
    conditions: list[dict] | None, type_: str, value: Cond, *, generation: int | None, now: datetime
) -> list[dict]:
    """A new list with condition `type_` set to `value`; lastTransitionTime moves only when the status changes,
    so an unchanged condition compares equal and causes no write."""
    out = [dict(c) for c in conditions or [] if isinstance(c, dict)]
    cur = get_condition(out, type_)
    new = {"type": type_, "status": value.status, "reason": value.reason, "message": value.message[:32768]}
    if generation is not None:
        new["observedGeneration"] = generation
    if cur is not None and cur.get("status") == value.status and cur.get("lastTransitionTime"):
        new["lastTransitionTime"] = cur["lastTransitionTime"]
    else:
        new["lastTransitionTime"] = format_time(now)
    if cur is None:
        out.append(new)
    else:
        out[out.index(cur)] = new
    return out


# --- TokenExchangeReady ------------------------------------------------------------------------------------------

PROVIDER_READY = "ProviderReady"
PROVIDER_PENDING = "ProviderPending"
PROVIDER_DELETING = "ProviderDeleting"
PROVIDER_NOT_READY = "ProviderNotReady"
PROVIDER_REJECTED = "ProviderRejected"
FOREIGN_PROVIDER = "ForeignProvider"
AWAITING_ISSUER = "AwaitingIssuer"
PREFIX_CONFLICT = "PrefixConflict"
#: Reasons user-authn gives a provider, passed on as they are with their message.
USER_AUTHN_REASONS = frozenset({PREFIX_CONFLICT, "InvalidSpec", "DiscoveryFailed", "ApplyError"})
#: TokenExchangeReady reasons that make Ready False: the peer's consumers cannot be served at all, and with
#: PrefixConflict their usernames could be another peering's.
READY_BLOCKING_PROVIDER_REASONS = frozenset({PROVIDER_REJECTED, FOREIGN_PROVIDER, PREFIX_CONFLICT})


@dataclass(frozen=True)
class ProviderObservation:
    """What the reconciler saw of the peer's TokenExchangeProvider in this pass."""

    #: The object as read after our write, or None when it does not exist (yet).
    obj: dict | None = None
    #: Message of an API refusal (403, 422...) to read or write it; None when the API answered.
    api_error: str | None = None
    #: Whether the peer published its issuer URL and JWKS (status.peer.issuer).
    issuer_published: bool = True
    #: Why the peer's JWKS is not a JWK Set (offer.jwks_problem), or None.
    jwks_problem: str | None = None
    #: Whether the object carries the module's labels (ownership.belongs_to).
    ours: bool = True
    #: Why the API server serves no TokenExchangeProvider API (OptionalApi.absent_message), or None when it does.
    api_absent: str | None = None
    #: The gateway's last failed exchange through this provider's connector, (reason, message), or None.
    exchange_failure: tuple[str, str] | None = None


def exchange_failure_hint(reason: str, message: str) -> str:
    """What else a failed exchange may mean, said after the gateway's message. Dex answers 500 `server_error` (the
    gateway's TokenExchangeMisconfigured, its message naming "500 server_error") not only when its `kubernetes`
    client does not trust ours, but first of all when it has no `kubernetes` client: user-authn creates that client
    only while its publishAPI is enabled, a kubeconfigGenerator entry exists, or a DexAuthenticator allows access
    to Kubernetes, and publishAPI is off by default."""
    if reason == reasons.TOKEN_EXCHANGE_MISCONFIGURED and "500 server_error" in message:
        return ("; Dex answers so as well when it has no client 'kubernetes' at all, which user-authn creates only "
                "while its publishAPI is enabled (or a kubeconfigGenerator entry, or a DexAuthenticator with "
                "allowAccessToKubernetes): `d8 k peering check` says which")
    return ""


def token_exchange_condition(obs: ProviderObservation) -> Cond:
    """TokenExchangeReady exactly as the CRD reference lists its reasons."""
    if obs.api_absent is not None:
        return Cond(
            "False",
            PROVIDER_REJECTED,
            f"{obs.api_absent}. Until then Dex cannot exchange the tokens of the peer's consumers and their "
            "requests are refused; invites, joins and offers keep working, and the provider is created as soon as "
            "the API is served",
        )
    if obs.api_error is not None:
        return Cond(
            "False",
            PROVIDER_REJECTED,
            f"the API server refused to read or write the TokenExchangeProvider: {obs.api_error}; "
            "check that user-authn is enabled and the module may manage tokenexchangeproviders",
        )
    if not obs.issuer_published:
        return Cond(
            "False",
            AWAITING_ISSUER,
            "the peer has not published the issuer of its ServiceAccount tokens yet; it appears with its next offer",
        )
    if obs.jwks_problem is not None:
        return Cond(
            "False",
            PROVIDER_REJECTED,
            f"the keys the peer published are not usable ({obs.jwks_problem}); the peer must publish a JWK Set",
        )
    if obs.obj is None:
        return Cond("False", PROVIDER_PENDING, "the TokenExchangeProvider is being created")
    meta = obs.obj.get("metadata") or {}
    if not obs.ours:
        return Cond(
            "False",
            FOREIGN_PROVIDER,
            f"a TokenExchangeProvider named {meta.get('name')} exists and was not written by the peering module; "
            "delete or rename it so the module can create its own",
        )
    if meta.get("deletionTimestamp"):
        return Cond(
            "False", PROVIDER_DELETING, "the TokenExchangeProvider is being deleted; it is created again once gone"
        )
    status = obs.obj.get("status")
    if status is None:
        return Cond("False", PROVIDER_PENDING, "user-authn has not applied the TokenExchangeProvider yet")
    if not isinstance(status, dict) or not isinstance(status.get("conditions", []), list):
        return Cond("False", PROVIDER_NOT_READY, "the status of the TokenExchangeProvider cannot be read")
    ready = get_condition(status.get("conditions"), "Ready")
    generation = meta.get("generation")
    seen = status.get("observedGeneration")
    if ready is not None and ready.get("observedGeneration") is not None:
        seen = ready.get("observedGeneration")
    if ready is None or (isinstance(generation, int) and isinstance(seen, int) and seen < generation):
        return Cond("False", PROVIDER_PENDING, "user-authn has not applied the latest TokenExchangeProvider yet")
    if ready.get("status") == "True":
        if obs.exchange_failure is not None:
            reason, message = obs.exchange_failure
            return Cond("True", PROVIDER_READY, f"user-authn applied the provider, but the last token exchange "
                                                f"failed ({reason}): {message}{exchange_failure_hint(reason, message)}")
        return Cond("True", PROVIDER_READY, "Dex exchanges the tokens of the peer's consumers")
    reason = ready.get("reason")
    message = str(ready.get("message") or "")
    if reason in USER_AUTHN_REASONS:
        return Cond("False", reason, message)
    return Cond(
        "False",
        PROVIDER_NOT_READY,
        f"user-authn reports the TokenExchangeProvider not ready (reason {reason!r}): {message}".rstrip(": "),
    )


# --- self-check --------------------------------------------------------------------------------------------------

CLIENT_CERT_REQUIRED = "ClientCertRequired"
CLIENT_CERT_NOT_REQUIRED = "ClientCertNotRequired"
ENTRANCE_UNREACHABLE = "EntranceUnreachable"
PEERING_ROOT_CERT = "PeeringRootCert"
FOREIGN_CERT = "ForeignCert"


def client_cert_condition(probe: str, detail: str = "") -> Cond:
    """ClientCertEnforced from the probe without a client certificate.

    probe: "refused" (the handshake or the request was refused for want of a client certificate), "served" (an
    answer came back), "unreachable" (no connection, or an answer that is not the gateway serving).
    """
    if probe == "refused":
        return Cond("True", CLIENT_CERT_REQUIRED, "the entrance refuses a request without a client certificate")
    if probe == "served":
        return Cond(
            "False",
            CLIENT_CERT_NOT_REQUIRED,
            "the entrance let a request without a client certificate through: something in front of it terminates "
            "TLS; pass connections to peering-gateway without TLS decryption",
        )
    return Cond(
        "Unknown",
        ENTRANCE_UNREACHABLE,
        "the self-check could not reach the entrance" + (f": {detail}" if detail else ""),
    )


def server_cert_condition(cert_pem: str | None, ca_pem: str, host: str, now: datetime, detail: str = "") -> Cond:
    """ServerCertOurs from the certificate the entrance presented (None: the handshake brought none)."""
    from control import pki  # certificates need the crypto backend; the other choosers do not

    if not cert_pem:
        return Cond(
            "Unknown",
            ENTRANCE_UNREACHABLE,
            "the handshake with the entrance brought no certificate" + (f": {detail}" if detail else ""),
        )
    try:
        ours = pki.issued_by(cert_pem, ca_pem) and host in pki.dns_names(cert_pem)
        valid = pki.valid_at(cert_pem, now)
    except pki.PKIError:
        ours, valid = False, False
    if ours and valid:
        return Cond("True", PEERING_ROOT_CERT, f"the entrance presents the peering CA's certificate for {host}")
    if ours:
        return Cond(
            "False",
            FOREIGN_CERT,
            f"the entrance certificate for {host} is expired or not yet valid; peers cannot connect. "
            "It is renewed by the control loop; check the Secret peering-gateway-tls and the clocks",
        )
    return Cond(
        "False",
        FOREIGN_CERT,
        f"the entrance presents a certificate not issued by the peering CA for {host}; peers cannot connect. "
        "Pass connections to peering-gateway to the module without TLS termination",
    )


# --- Ready and phase ---------------------------------------------------------------------------------------------

PEERING_READY = "PeeringReady"
INVITE_PENDING = "InvitePending"
INVITE_EXPIRED = "InviteExpired"
JOINING = "Joining"
CREDENTIALS_PENDING = "CredentialsPending"
AWAITING_OFFER = "AwaitingOffer"
PEER_UNREACHABLE = "PeerUnreachable"
PEER_REFUSED_CERTIFICATE = reasons.PEER_REFUSED_CERTIFICATE
CREDENTIALS_FROM_OTHER_CA = "CredentialsFromOtherCA"
INVALID_SPEC = "InvalidSpec"
#: Join refusals and connection-string errors the administrator must fix: phase Error until the spec changes.
PERMANENT_JOIN_REASONS = frozenset(
    {
        reasons.TOKEN_INVALID,
        reasons.TOKEN_EXPIRED,
        reasons.TOKEN_USED,
        reasons.CLUSTER_NOT_EXPECTED,
        reasons.CLUSTER_UUID_IN_USE,
        reasons.MALFORMED,
        "UnsupportedVersion",
        "TooLong",
        "Expired",
        "PinMismatch",
        "InvalidAnswer",
        "InvalidTokenTTL",
        INVALID_SPEC,
    }
)
#: Sync failures that leave the peering Active with Ready=False (KeyMismatch: the peer refused to renew our client
#: certificate for the key we hold).
SYNC_REASONS = frozenset({PEER_UNREACHABLE, PEER_REFUSED_CERTIFICATE, reasons.OFFER_INVALID, reasons.OFFER_TOO_LARGE,
                          reasons.KEY_MISMATCH})


def sync_failure(status: int | None, body, *, refused_certificate: bool = False) -> tuple[str, str]:
    """(reason, message) of a failed call to the peer's entrance (an offer pull, a credentials delivery): `status`
    None when no HTTP answer came (then `body` says why). A refused client certificate says the peer probably
    revoked us; its message is chosen by `readiness`."""
    answer = body if isinstance(body, dict) else {}
    if refused_certificate or (status in (401, 403) and answer.get("reason") == reasons.PEER_UNKNOWN):
        return PEER_REFUSED_CERTIFICATE, ""
    if status is None:
        return PEER_UNREACHABLE, (f"the peer's entrance did not answer ({body}); the peering stays and the sync is "
                                  "retried. Check that peering-gateway.<domain> of the peer is reachable from here")
    detail = answer.get("message") if isinstance(answer.get("message"), str) else ""
    return PEER_UNREACHABLE, (f"the peer's entrance answered HTTP {status}"
                              + (f" ({answer.get('reason')}: {detail[:300]})" if detail else "")
                              + "; the peering stays and the sync is retried")


@dataclass(frozen=True)
class PeeringState:
    """What the reconciler knows about one ClusterPeer, reduced to what Ready and the phase depend on."""

    type: str  # "Invite" or "Join"
    #: Credentials in the peer Secret: "none", "partial" (one direction: the peer's CA and our client cert, or
    #: the cert we issued, but not both), "complete" (both directions: the peering is established).
    credentials: str = "none"
    #: The credentials were issued by a peering CA other than the current one (module re-enabled).
    credentials_from_other_ca: bool = False
    #: A spec problem found before any network call: (reason, message), e.g. InvalidTokenTTL, Malformed.
    spec_error: tuple[str, str] | None = None
    #: status.invite of an Invite ClusterPeer.
    invite: dict | None = None
    #: The last join attempt's failure: (reason, message), e.g. TokenUsed or JoinEndpointUnreachable.
    join_error: tuple[str, str] | None = None
    #: Whether status.peer holds an accepted offer.
    has_peer_offer: bool = False
    #: The last sync's failure: (reason in SYNC_REASONS, message), None after a successful sync.
    sync_error: tuple[str, str] | None = None
    #: A joiner's certificate for the inviter's key has not reached the inviter yet (/peering/v1/credentials).
    credentials_undelivered: bool = False
    #: TokenExchangeReady as chosen by token_exchange_condition.
    token_exchange: Cond | None = None
    #: Why projects cannot pair (the Project API is not served), or None.
    projects_absent: str | None = None


@dataclass(frozen=True)
class Readiness:
    phase: str
    ready: Cond


def _now_text(now: datetime | None) -> str:
    return format_time(now) if now else ""


def readiness(state: PeeringState, now: datetime | None = None) -> Readiness:
    """The phase and the Ready condition. Ready is True only when the peering works end to end; the self-check
    conditions never affect it, TokenExchangeReady only through ProviderRejected, ForeignProvider and
    PrefixConflict."""
    if state.credentials_from_other_ca:
        return Readiness(
            ERROR,
            Cond(
                "False",
                CREDENTIALS_FROM_OTHER_CA,
                "the credentials of this peering were issued by a peering CA that no longer exists (the module was "
                "disabled and enabled again); delete this ClusterPeer and establish the peering anew on both clusters",
            ),
        )
    if state.credentials == "complete":
        ready = _active_ready(state)
        if state.projects_absent is not None:
            ready = Cond(ready.status, ready.reason, f"{ready.message}; projects cannot pair: {state.projects_absent}"
                         if ready.message else f"projects cannot pair: {state.projects_absent}")
        return Readiness(ACTIVE, ready)

    if state.spec_error is not None:
        reason, message = state.spec_error
        return Readiness(ERROR, Cond("False", reason, message))
    if state.credentials == "partial":
        who = "the joining cluster" if state.type == "Invite" else "the inviting cluster"
        return Readiness(
            PENDING,
            Cond(
                "False",
                CREDENTIALS_PENDING,
                f"the connection string was accepted; waiting for the credentials exchange with {who} to complete",
            ),
        )
    if state.type == "Invite":
        inv = state.invite or {}
        if not inv.get("tokenHash"):
            return Readiness(PENDING, Cond("False", INVITE_PENDING, "the connection string is being issued"))
        if inv.get("used") is True:
            redeemer = inv.get("redeemer") if isinstance(inv.get("redeemer"), dict) else {}
            who = f" by cluster {redeemer['clusterUUID']}" if redeemer.get("clusterUUID") else ""
            return Readiness(
                PENDING,
                Cond(
                    "False",
                    CREDENTIALS_PENDING,
                    f"the connection string was used{who}; waiting for the joining cluster to complete the exchange "
                    "(a new string is issued if it does not within spec.invite.tokenTTL)",
                ),
            )
        from control.rules.invite import REISSUE_REASONS, parse_time  # the invite rules own status.invite

        expires = parse_time(inv.get("expiresAt"))
        if inv.get("used") is not True and expires is not None and now is not None and now >= expires:
            return Readiness(
                PENDING,
                Cond("False", INVITE_EXPIRED, "the connection string expired unused; a new one is being issued"),
            )
        # JoinAbandoned, RedeemedWithAnotherKey: the string was re-issued (the invite rules own those reasons).
        reissue = inv.get("reissue") if isinstance(inv.get("reissue"), dict) else {}
        if reissue.get("reason") in REISSUE_REASONS and isinstance(reissue.get("message"), str):
            return Readiness(PENDING, Cond("False", reissue["reason"], reissue["message"] + (
                f" (valid until {inv.get('expiresAt')})" if inv.get("expiresAt") else "")))
        return Readiness(
            PENDING,
            Cond(
                "False",
                INVITE_PENDING,
                "waiting for the other cluster to join with status.invite.connectionString"
                + (f" (valid until {inv.get('expiresAt')})" if inv.get("expiresAt") else ""),
            ),
        )
    if state.join_error is not None:
        reason, message = state.join_error
        return Readiness(ERROR if reason in PERMANENT_JOIN_REASONS else PENDING, Cond("False", reason, message))
    return Readiness(PENDING, Cond("False", JOINING, "joining the inviting cluster"))


def _active_ready(state: PeeringState) -> Cond:
    te = state.token_exchange
    if state.sync_error is not None:
        reason, message = state.sync_error
        if reason == PEER_REFUSED_CERTIFICATE and not message:
            message = (
                "the peer refused our client certificate: it has probably revoked this peering (deleted its "
                "ClusterPeer). If so, delete this ClusterPeer too; access stays until then"
            )
        return Cond("False", reason, message)
    if state.credentials_undelivered:
        return Cond("False", CREDENTIALS_PENDING, "the inviting cluster has not received our certificate for its "
                                                  "key yet (POST /peering/v1/credentials); retrying")
    if te is not None and te.reason in READY_BLOCKING_PROVIDER_REASONS:
        return Cond("False", te.reason, te.message)
    if not state.has_peer_offer:
        return Cond("False", AWAITING_OFFER, "waiting for the peer's first offer")
    return Cond("True", PEERING_READY, "the peering works")
