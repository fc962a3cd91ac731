"""Every machine-readable reason the module answers a request with, and its HTTP code.

A gateway refusal, a refused join or peer call is a Kubernetes Status whose `reason` is one of these (kubectl
prints it as "Error from server (<reason>)"); the joining cluster shows a join refusal's reason in its Ready
condition. docs/protocol.md and gateway/README.md list each with what it means; a test holds them to this table.
The reasons of conditions (Ready, TokenExchangeReady...) are chosen in control/rules/conditions.py.
"""

from __future__ import annotations

# --- the peer's consumer token at the entrance (gateway/tokens.py) ------------------------------------------------
TOKEN_MISSING = "TokenMissing"
TOKEN_MALFORMED = "TokenMalformed"
TOKEN_TOO_LARGE = "TokenTooLarge"
TOKEN_ALGORITHM_REFUSED = "TokenAlgorithmRefused"
TOKEN_KEY_UNKNOWN = "TokenKeyUnknown"
TOKEN_SIGNATURE_INVALID = "TokenSignatureInvalid"
TOKEN_ISSUER_MISMATCH = "TokenIssuerMismatch"
TOKEN_EXPIRED = "TokenExpired"
TOKEN_NOT_YET_VALID = "TokenNotYetValid"
TOKEN_AUDIENCE_MISMATCH = "TokenAudienceMismatch"
NOT_A_CONSUMER = "NotAConsumer"
PEER_ISSUER_UNKNOWN = "PeerIssuerUnknown"
# --- the token exchange at Dex (gateway/exchange.py, docs/user-authn-contract.md) --------------------------------
TOKEN_EXCHANGE_REFUSED = "TokenExchangeRefused"
TOKEN_EXCHANGE_MISCONFIGURED = "TokenExchangeMisconfigured"
TOKEN_EXCHANGE_UNAVAILABLE = "TokenExchangeUnavailable"
TOKEN_EXCHANGE_RATE_LIMITED = "TokenExchangeRateLimited"
# --- the peer protocol's bound per peer (gateway/peercalls.py) ------------------------------------------------------
PEER_CALLS_RATE_LIMITED = "PeerCallsRateLimited"
# --- the egress (a local consumer) --------------------------------------------------------------------------------
TOKEN_INVALID = "TokenInvalid"
NO_EFFECTIVE_CAPABILITY = "NoEffectiveCapability"
TOKEN_REVIEW_UNAVAILABLE = "TokenReviewUnavailable"
PEER_NOT_FOUND = "PeerNotFound"
PEER_NOT_CONNECTED = "PeerNotConnected"
PEER_CREDENTIALS_INVALID = "PeerCredentialsInvalid"
PEER_REFUSED_CERTIFICATE = "PeerRefusedCertificate"  # also the Ready reason of its ClusterPeer
PATH_NOT_ALLOWED = "PathNotAllowed"
TOKEN_AUDIENCE_TOO_BROAD = "TokenAudienceTooBroad"
# --- any listener -------------------------------------------------------------------------------------------------
PEER_UNKNOWN = "PeerUnknown"
CERTIFICATE_EXPIRED = "CertificateExpired"
CERTIFICATE_NOT_YET_VALID = "CertificateNotYetValid"
IMPERSONATION_REFUSED = "ImpersonationRefused"
UPGRADE_REFUSED = "UpgradeRefused"
AMBIGUOUS_BODY_LENGTH = "AmbiguousBodyLength"
MALFORMED_REQUEST = "MalformedRequest"
MALFORMED_BODY = "MalformedBody"
NOT_FOUND = "NotFound"
UNKNOWN_OPERATION = "UnknownOperation"
METHOD_NOT_ALLOWED = "MethodNotAllowed"
REQUEST_ENTITY_TOO_LARGE = "RequestEntityTooLarge"
REQUEST_HEADER_FIELDS_TOO_LARGE = "RequestHeaderFieldsTooLarge"
UPSTREAM_FAILED = "UpstreamFailed"
UPSTREAM_UNAVAILABLE = "UpstreamUnavailable"
NOT_READY = "NotReady"
REQUEST_TIMEOUT = "RequestTimeout"
INTERNAL_ERROR = "InternalError"
# --- the join (control/rules/join.py, control/handlers/join.py) ---------------------------------------------------
MALFORMED = "Malformed"
TOKEN_USED = "TokenUsed"
CLUSTER_NOT_EXPECTED = "ClusterNotExpected"
CLUSTER_UUID_IN_USE = "ClusterUUIDInUse"
OFFER_INVALID = "OfferInvalid"
OFFER_TOO_LARGE = "OfferTooLarge"
INVALID_CSR = "InvalidCSR"
UNSUPPORTED_KEY = "UnsupportedKey"
TOO_MANY_ATTEMPTS = "TooManyAttempts"
# --- the peer protocol (control/handlers/peer.py) -----------------------------------------------------------------
NOT_JOINED = "NotJoined"
KEY_MISMATCH = "KeyMismatch"
CONFLICT = "Conflict"

CODES: dict[str, int] = {
    TOKEN_MISSING: 401, TOKEN_MALFORMED: 401, TOKEN_TOO_LARGE: 401, TOKEN_ALGORITHM_REFUSED: 401,
    TOKEN_KEY_UNKNOWN: 401, TOKEN_SIGNATURE_INVALID: 401, TOKEN_ISSUER_MISMATCH: 401, TOKEN_EXPIRED: 401,
    TOKEN_NOT_YET_VALID: 401, TOKEN_AUDIENCE_MISMATCH: 401, NOT_A_CONSUMER: 403, PEER_ISSUER_UNKNOWN: 401,
    TOKEN_EXCHANGE_REFUSED: 401, TOKEN_EXCHANGE_MISCONFIGURED: 503, TOKEN_EXCHANGE_UNAVAILABLE: 503,
    TOKEN_EXCHANGE_RATE_LIMITED: 429, PEER_CALLS_RATE_LIMITED: 429,
    TOKEN_INVALID: 401, NO_EFFECTIVE_CAPABILITY: 403, TOKEN_REVIEW_UNAVAILABLE: 503, PEER_NOT_FOUND: 404,
    PEER_NOT_CONNECTED: 503, PEER_CREDENTIALS_INVALID: 503, PEER_REFUSED_CERTIFICATE: 503, PATH_NOT_ALLOWED: 403,
    TOKEN_AUDIENCE_TOO_BROAD: 401,
    PEER_UNKNOWN: 403, CERTIFICATE_EXPIRED: 401, CERTIFICATE_NOT_YET_VALID: 401, IMPERSONATION_REFUSED: 403,
    UPGRADE_REFUSED: 400, AMBIGUOUS_BODY_LENGTH: 400,
    MALFORMED_REQUEST: 400, MALFORMED_BODY: 400, NOT_FOUND: 404, UNKNOWN_OPERATION: 404, METHOD_NOT_ALLOWED: 405,
    REQUEST_ENTITY_TOO_LARGE: 413, REQUEST_HEADER_FIELDS_TOO_LARGE: 431, UPSTREAM_FAILED: 502,
    UPSTREAM_UNAVAILABLE: 503, NOT_READY: 503, INTERNAL_ERROR: 500, REQUEST_TIMEOUT: 408,
    MALFORMED: 400, TOKEN_USED: 409, CLUSTER_NOT_EXPECTED: 403, CLUSTER_UUID_IN_USE: 409, OFFER_INVALID: 400,
    OFFER_TOO_LARGE: 413,
    INVALID_CSR: 400, UNSUPPORTED_KEY: 400, TOO_MANY_ATTEMPTS: 429,
    NOT_JOINED: 409, KEY_MISMATCH: 403, CONFLICT: 409,
}
"""The HTTP code of each reason, the same on the entrance and the egress (NotAConsumer is 403 on both: the token
is fine, its ServiceAccount is no consumer). A reason may be answered with another code where the table of the
place that answers it says so (JOIN_CODES)."""

JOIN_REFUSALS = frozenset({MALFORMED, TOKEN_INVALID, TOKEN_EXPIRED, CLUSTER_NOT_EXPECTED, CLUSTER_UUID_IN_USE,
                           TOKEN_USED, OFFER_INVALID, OFFER_TOO_LARGE, INVALID_CSR, UNSUPPORTED_KEY})
"""What `POST /v1/join` refuses with; an unknown token and a wrong secret are both TokenInvalid."""
JOIN_CODES = {reason: (403 if reason in (TOKEN_INVALID, TOKEN_EXPIRED) else CODES[reason])
              for reason in JOIN_REFUSALS}
"""A join refused for its token is 403 whatever the token's fault, so that the answer tells nothing about it."""


def code_of(reason: str, default: int = 400) -> int:
    return CODES.get(reason, default)
