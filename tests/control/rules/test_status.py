"""The ClusterPeer and PeeringCapability status composed in one place; unchanged input gives an equal status."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control.rules import capabilities as caps
from control.rules import conditions as c
from control.rules.status import KEEP, capability_status, clusterpeer_status

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_steady_state_is_equal():
    ready = c.readiness(c.PeeringState("Join", credentials="complete", has_peer_offer=True), NOW)
    te = c.Cond("True", "ProviderReady", "ok")
    first = clusterpeer_status(None, generation=3, now=NOW, readiness=ready, token_exchange=te,
                               effectiveCapabilities=["a"], pairedProjectsCount=2, peer=None)
    assert first["phase"] == "Active" and first["observedGeneration"] == 3
    assert [x["type"] for x in first["conditions"]] == ["Ready", "TokenExchangeReady"]
    assert "peer" not in first and first["pairedProjectsCount"] == 2
    again = clusterpeer_status(first, generation=3, now=NOW + timedelta(hours=1), readiness=ready,
                               token_exchange=te, effectiveCapabilities=["a"], pairedProjectsCount=2)
    assert again == first


def test_keep_keeps_the_stored_field_and_none_leaves_it_out():
    ready = c.readiness(c.PeeringState("Join", credentials="complete", has_peer_offer=True,
                                       sync_error=("OfferInvalid", "bad")), NOW)
    got = clusterpeer_status({"peer": {"alias": "kept"}}, generation=1, now=NOW, readiness=ready, peer=KEEP)
    assert got["peer"] == {"alias": "kept"} and got["conditions"][0]["reason"] == "OfferInvalid"
    # What is not given is kept too; None is "there is none".
    assert clusterpeer_status({"peer": {"alias": "kept"}}, generation=1, now=NOW, readiness=ready)["peer"] == \
        {"alias": "kept"}
    assert "peer" not in clusterpeer_status({"peer": {"alias": "kept"}}, generation=1, now=NOW, readiness=ready,
                                            peer=None)


def test_conditions_given_as_none_go_and_kept_ones_stay():
    ready = c.readiness(c.PeeringState("Join", credentials="complete", has_peer_offer=True), NOW)
    te = c.Cond("True", "ProviderReady", "ok")
    probe = c.Cond("True", "ClientCertRequired", "m")
    first = clusterpeer_status(None, generation=1, now=NOW, readiness=ready, token_exchange=te, client_cert=probe,
                               server_cert=c.Cond("True", "PeeringRootCert", "m"))
    assert [x["type"] for x in first["conditions"]] == ["Ready", "TokenExchangeReady", "ClientCertEnforced",
                                                        "ServerCertOurs"]
    later = clusterpeer_status(first, generation=1, now=NOW, readiness=ready, token_exchange=None)
    assert [x["type"] for x in later["conditions"]] == ["Ready", "ClientCertEnforced", "ServerCertOurs"]


def test_unknown_field_is_an_error():
    ready = c.readiness(c.PeeringState("Join"), NOW)
    with pytest.raises(TypeError, match="bogus"):
        clusterpeer_status(None, generation=1, now=NOW, readiness=ready, bogus=1)


def test_capability_status():
    v = caps.validate({"version": "v1", "rules": [], "consumers": []})
    st = capability_status(None, generation=2, now=NOW, accepted=c.Cond(v.status, v.reason, v.message))
    assert st["observedGeneration"] == 2
    assert st["conditions"][0]["type"] == "Accepted" and st["conditions"][0]["reason"] == "EmptyRules"
