"""Which TLS errors say that the other side refused our client certificate (the egress's PeerRefusedCertificate,
the control loop's peer client): the alerts a server sends for a certificate it does not take, and nothing of
our own verification of its certificate. The real handshake is test_egress's."""

from __future__ import annotations

import ssl

import pytest

from gateway.tlsalerts import refused_certificate


@pytest.mark.parametrize("text, alert", [
    ("[SSL: SSLV3_ALERT_CERTIFICATE_EXPIRED] sslv3 alert certificate expired (_ssl.c:2580)", "CERTIFICATE_EXPIRED"),
    ("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:2580)", "UNKNOWN_CA"),
    ("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required", "CERTIFICATE_REQUIRED"),
    ("[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate", "BAD_CERTIFICATE"),
    ("[SSL: SSLV3_ALERT_CERTIFICATE_REVOKED] sslv3 alert certificate revoked", "CERTIFICATE_REVOKED"),
    # Ours refusing the server's certificate, or a connection that simply ended: no refusal of ours.
    ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate", None),
    ("[SSL: WRONG_VERSION_NUMBER] wrong version number", None),
])
def test_the_alerts_of_a_refused_client_certificate_are_told_apart(text, alert):
    assert refused_certificate(ssl.SSLError(1, text)) == alert


def test_no_error_or_another_error_is_no_refusal():
    assert refused_certificate(None) is None
    assert refused_certificate(ConnectionResetError("the upstream closed the connection")) is None
