"""The verdicts of `peering check` on what it asks now (control/check/dex.py, peers.py), as tables: whether Dex
has the `kubernetes` client every exchange asks for, whether Dex's token endpoint accepts the module's client, and
what the peer's entrance answered the check's own offer pull, against what the ClusterPeer's status still says."""

from __future__ import annotations

import base64
import datetime

import pytest

from control.check import dex, peers
from control.check.cluster import ERROR, FORBIDDEN, MISSING, OK, UNSERVED, Facts, Read
from control.check.probes import Https, dex_token_form
from control.peerclient import Answer

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
NONE = Read(OK, {"items": []})


def facts(**kw) -> Facts:
    return Facts(now=NOW, **kw)


def user_authn(settings: dict) -> Read:
    return Read(OK, {"spec": {"version": 2, "settings": settings}})


def authenticator(allow: bool) -> dict:
    return {"metadata": {"name": "dash", "namespace": "d8-dashboard"}, "spec": {"allowAccessToKubernetes": allow}}


@pytest.mark.parametrize(("config", "authenticators", "status", "reason"), [
    (user_authn({"publishAPI": {"enabled": True}}), NONE, "ok", ""),
    (user_authn({"kubeconfigGenerator": [{"id": "direct", "masterURI": "https://10.0.0.1:6443"}]}), NONE, "ok", ""),
    (user_authn({}), Read(OK, {"items": [authenticator(True)]}), "ok", ""),
    (user_authn({"publishAPI": {"enabled": False}}), Read(OK, {"items": [authenticator(False)]}), "fail",
     dex.NO_KUBERNETES_CLIENT),
    (Read(MISSING), NONE, "fail", dex.NO_KUBERNETES_CLIENT),                  # publishAPI is off by default
    (Read(MISSING), Read(UNSERVED), "fail", dex.NO_KUBERNETES_CLIENT),        # no DexAuthenticator API: none
    (Read(FORBIDDEN, detail="no"), NONE, "warn", "Forbidden"),
    (user_authn({}), Read(FORBIDDEN, detail="no"), "warn", "Forbidden"),
    (Read(ERROR, detail="boom"), NONE, "warn", "ReadFailed"),
    (Read(UNSERVED), Read(UNSERVED), "warn", "KubernetesClientUnknown"),
])
def test_whether_dex_has_its_kubernetes_client(config, authenticators, status, reason):
    line = dex.kubernetes_client_line(facts(user_authn_config=config, dex_authenticators=authenticators))
    assert (line.check, line.status, line.reason) == ("dex audience", status, reason), line
    if status == "fail":
        assert "500 server_error" in line.message
        assert '"spec":{"version":2,"settings":{"publishAPI":{"enabled":true}}}' in line.fix


def _secret(**values: str) -> Read:
    return Read(OK, {"data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}})


@pytest.mark.parametrize(("secret", "token", "status", "reason"), [
    (_secret(clientSecret="s"), Https(400, {"error": "invalid_request", "error_description": "Missing subject_token"}),
     "ok", ""),
    (_secret(clientSecret="s"), Https(401, {"error": "invalid_client"}), "fail", "DexClientRefused"),
    (_secret(clientSecret="s"), Https(error="no answer within 5 s"), "fail", "DexUnreachable"),
    (_secret(clientSecret="s"), Https(200, {"access_token": "x"}), "fail", "DexUnexpectedAnswer"),
    (_secret(other="x"), None, "fail", "NoDexSecret"),
    (Read(MISSING), None, "fail", "NoDexSecret"),
    (Read(FORBIDDEN, detail="no"), Https(401, {"error": "invalid_client"}), "warn", "Forbidden"),
])
def test_whether_dex_accepts_the_modules_client(secret, token, status, reason):
    line = dex.dex_client_line(facts(dex_secret=secret), token, "dex-client-peering@d8-peering")
    assert (line.status, line.reason) == (status, reason), line
    if secret.state == FORBIDDEN:
        assert "token endpoint answers" in line.message


def test_the_token_request_carries_no_token():
    form = dex_token_form()
    assert "subject_token" not in form and form["subject_token_type"].endswith(":id_token")


def _peering(ready: str, reason: str, synced: datetime.timedelta = datetime.timedelta(seconds=3)) -> dict:
    return {"metadata": {"name": "to-a"},
            "status": {"phase": "Active", "peer": {"lastSyncTime": (NOW - synced).strftime("%Y-%m-%dT%H:%M:%SZ")},
                       "conditions": [{"type": "Ready", "status": ready, "reason": reason, "message": ""}]}}


CREDENTIALS = _secret(**{"peer-entrance": "peering-gateway.a.lab", "peer-ca.crt": "ca", "client.crt": "c",
                         "client.key": "k"})


@pytest.mark.parametrize(("ready", "answer", "status", "reason", "said"), [
    (("True", "PeeringReady"), Answer(200, {}), "ok", "", "answered an offer pull over mTLS just now"),
    (("False", "PeerUnreachable"), Answer(200, {}), "warn", "StatusBehind", "the status is older than this probe"),
    (("True", "PeeringReady"), Answer(None, "no answer within 2 s"), "fail", "PeerUnreachable",
     "does not answer from here: no answer within 2 s; the status (Ready True PeeringReady, the last offer recorded "
     "3s ago) is older than this probe"),
    (("False", "PeerUnreachable"), Answer(None, "connection refused"), "fail", "PeerUnreachable",
     "does not answer from here: connection refused"),
    (("True", "PeeringReady"), Answer(None, "TLS failed: unknown ca", refused_certificate=True), "fail",
     "PeerRefusedCertificate", "refused this cluster's client certificate just now"),
    (("True", "PeeringReady"), Answer(503, {"reason": "NotLeader"}), "fail", "PeerUnreachable",
     "answered the offer pull HTTP 503 (NotLeader)"),
])
def test_the_peers_entrance_now_against_the_status(ready, answer, status, reason, said):
    line = peers.peer_entrance_line(facts(), _peering(*ready), CREDENTIALS, answer)
    assert (line.check, line.status, line.reason) == ("peer entrance", status, reason), line
    assert said in line.message
    if status == "ok" or ready[0] == "False" and status == "fail":
        assert "older" not in line.message


def test_a_viewer_is_told_it_cannot_probe_the_peer():
    line = peers.peer_entrance_line(facts(), _peering("True", "PeeringReady"), Read(FORBIDDEN, detail="no"), None)
    assert (line.status, line.reason) == ("warn", "Forbidden")
    assert "client certificate cannot be read with this role" in line.message and "administrator" in line.fix
