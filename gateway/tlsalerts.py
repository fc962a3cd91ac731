"""What a TLS alert from the other side means: whether it refused the client certificate we showed it. The egress
tells such a refusal by a peer's entrance apart from other upstream failures (PeerRefusedCertificate), as the
control loop's peer client does for the ClusterPeer's Ready condition."""

from __future__ import annotations

#: What OpenSSL names the alerts with which a server refuses the client certificate it was shown.
CERTIFICATE_REFUSALS = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "CERTIFICATE_REVOKED",
                        "CERTIFICATE_EXPIRED", "CERTIFICATE_REQUIRED")


def refused_certificate(exc: BaseException | None) -> str | None:
    """The alert with which the other side refused our client certificate (`CERTIFICATE_EXPIRED`, ...), None when
    `exc` says nothing of the kind. A TLS 1.3 server refuses it after the client's handshake is done, so it comes
    on the first read, not from the handshake."""
    if exc is None:
        return None
    text = f"{getattr(exc, 'reason', '')} {exc}".upper()
    return next((alert for alert in CERTIFICATE_REFUSALS if alert in text), None)
