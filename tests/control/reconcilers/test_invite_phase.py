"""The Invite phase of a pass (reconcilers/clusterpeer/invite.py) with a redemption under way: kept while it may
complete, and once the string's TTL after the redemption passed without the joiner's half, the Secret of that
exchange is dropped (the next pass then issues a fresh string, `rules.invite.decide_invite`)."""

from __future__ import annotations

import base64
import datetime

import pytest

from control import pki
from control.reconcilers.clusterpeer import invite as invite_phase
from control.reconcilers.clusterpeer.observe import observe
from control.rules import invite as invite_rules

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)
A_UUID, B_UUID = "a0000000-0000-4000-8000-00000000000a", "b0000000-0000-4000-8000-00000000000b"
CA = pki.create_ca(A_UUID, now=NOW)
B_CA = pki.create_ca(B_UUID, now=NOW)


def _observed(*, now, secret_values):
    token = invite_rules.Token("abcd1234", "s" * 43)
    used = invite_rules.mark_used(invite_rules.invite_status(token, "d8peer1.x", NOW + datetime.timedelta(hours=1)),
                                  invite_rules.Redeemer(B_UUID, "f" * 64), NOW)
    cp = {"metadata": {"name": "to-b", "uid": "u1", "generation": 1},
          "spec": {"type": "Invite", "invite": {"tokenTTL": "1h"}}, "status": {"invite": used}}
    secret = None
    if secret_values is not None:
        secret = {"metadata": {"name": "peer-to-b", "namespace": "d8-peering", "uid": "s1", "resourceVersion": "7"},
                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret_values.items()}}
    return observe(cp, now=now, own_uuid=A_UUID, ca=CA, issuer=("https://i", '{"keys": []}'), peer_secret=secret,
                   local_capabilities={}, local_projects={}, projects_absent=None, peering_version="0")


def _answered() -> dict:
    """What a's join handler stored: b's CA, our key, the certificate for b; b's certificate for our key not yet."""
    b_key = pki.make_key_and_csr(B_UUID)
    ours = pki.make_key_and_csr(A_UUID)
    return {"peer-ca.crt": B_CA.cert_pem, "client.key": ours.key_pem, "peer-uuid": B_UUID,
            "issued.crt": pki.issue_client_cert(CA, b_key.cert_pem, B_UUID, now=NOW)}


def _call(obs):
    return invite_phase.invite(obs, join_host="peering.a.lab", entrance_host="peering-gateway.a.lab",
                               join_ca=lambda: None)


def test_an_answered_join_is_waited_for_until_the_ttl_after_its_redemption():
    got = _call(_observed(now=NOW + datetime.timedelta(minutes=59), secret_values=_answered()))
    assert not got.drop_secret and got.invite["used"] is True
    assert got.wait == pytest.approx(60.5)


def test_then_the_secret_of_that_exchange_is_dropped():
    got = _call(_observed(now=NOW + datetime.timedelta(hours=1), secret_values=_answered()))
    assert got.drop_secret and got.invite["used"] is True


def test_without_a_secret_the_string_is_issued_anew_with_its_reason():
    got = _call(_observed(now=NOW + datetime.timedelta(hours=1), secret_values=None))
    assert not got.drop_secret and got.invite["used"] is False and got.invite["tokenID"] != "abcd1234"
    assert got.invite["reissue"]["reason"] == "JoinAbandoned"


def test_a_complete_exchange_is_never_dropped():
    answered = _answered()
    b_cert = pki.issue_client_cert(B_CA, pki.csr_for_key(answered["client.key"], A_UUID), A_UUID, now=NOW)
    got = _call(_observed(now=NOW + datetime.timedelta(days=1), secret_values={**answered, "client.crt": b_cert}))
    assert not got.drop_secret and got.invite["used"] is True
