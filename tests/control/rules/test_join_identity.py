"""Who the other side of a join says it is and where it says it is: the cluster UUID must be one (RFC 4122 text),
never this cluster's own nor one a live ClusterPeer stands for, and the entrance a host with an optional port. And
the identity grants and exchanged usernames use is the one this cluster assigned (its ClusterPeer's uid): even
two peerings that claim the same UUID never share a username prefix or a consumer."""

from __future__ import annotations

import pytest

from contract.peer_secret import PeerCredentials
from contract import reasons
from contract.names import consumer_username, peering_identity, username_prefix
from control.rules import capabilities as caps
from control.rules import join as join_rules
from control.rules.entitlements import entitlements
from control.rules.provider import desired_provider

A_UUID = "a0000000-0000-4000-8000-00000000000a"
B_UUID = "b0000000-0000-4000-8000-00000000000b"


@pytest.mark.parametrize("value", [B_UUID, B_UUID.upper(), "123e4567-e89b-12d3-a456-426614174000"])
def test_a_cluster_uuid_in_rfc_4122_text_form_is_accepted(value):
    assert join_rules.uuid_problem(value, "clusterUUID") is None


@pytest.mark.parametrize("value", ["", "b-uuid", B_UUID[:-1], B_UUID + "0", B_UUID.replace("-", ""),
                                   "{" + B_UUID + "}", "urn:uuid:" + B_UUID, B_UUID.replace("b", "g"),
                                   " " + B_UUID, "peering:" + B_UUID[8:]])
def test_anything_else_is_refused_naming_the_field(value):
    problem = join_rules.uuid_problem(value, "clusterUUID")
    assert problem is not None and problem.startswith("clusterUUID") and "RFC 4122" in problem


@pytest.mark.parametrize("value", ["peering-gateway.b.example.com", "peering-gateway.b.example.com:8443",
                                   "peering-gateway.b.example.com.", "localhost", "10.0.0.1", "10.0.0.1:443",
                                   "[2001:db8::1]", "[2001:db8::1]:8443", "a" * 63 + ".example"])
def test_an_entrance_is_a_host_or_address_with_an_optional_port(value):
    assert join_rules.host_problem(value, "entrance") is None


@pytest.mark.parametrize(("value", "why"), [
    ("https://peering-gateway.b.example.com", "scheme"),
    ("peering-gateway.b.example.com/api", "path"),
    ("peering-gateway.b.example.com?x=1", "query"),
    ("peering-gateway.b.example.com#f", "scheme"),
    ("admin@peering-gateway.b.example.com", "userinfo"),
    ("user:pw@peering-gateway.b.example.com", "userinfo"),
    ("peering-gateway.b.example.com\r\nHost: x", "whitespace"),
    ("peering gateway", "whitespace"),
    ("peering-gateway.b.example.com%2f", "scheme"),
    ("peering-gateway.b.example.com:0", "port"),
    ("peering-gateway.b.example.com:65536", "port"),
    ("peering-gateway.b.example.com:+443", "port"),
    ("peering-gateway.b.example.com:0443", "port"),
    ("peering-gateway.b.example.com:", "port"),
    ("peering-gateway.b.example.com:443:1", "IPv6"),
    ("2001:db8::1", "IPv6"),
    ("[2001:db8::zz]:443", "IPv6"),
    ("[2001:db8::1]x", "host name"),
    ("-peering.example.com", "label"),
    ("peering..example.com", "label"),
    ("a" * 64 + ".example", "label"),
    ("10.0.0.256", "IPv4"),
    ("999", "IPv4"),
    ("x" * 254, "longer"),
])
def test_an_entrance_with_anything_more_is_refused_naming_the_field(value, why):
    problem = join_rules.host_problem(value, "entrance")
    assert problem is not None and problem.startswith("entrance")
    assert why.lower() in problem.lower() or "host name or IP address" in problem


def _cp(name, uid, *, peer=None, redeemer=None, deleting=False):
    meta = {"name": name, "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    status = {}
    if peer:
        status["peer"] = {"clusterUUID": peer}
    if redeemer:
        status["invite"] = {"used": True, "redeemer": {"clusterUUID": redeemer, "keyFingerprint": "f" * 64}}
    return {"metadata": meta, "status": status}


def test_the_uuids_in_use_are_those_of_the_other_live_clusterpeers():
    c_uuid, d_uuid, e_uuid = (f"{c}0000000-0000-4000-8000-000000000000" for c in "cde")
    peers = [
        ("to-b", _cp("to-b", "u1", peer=B_UUID), PeerCredentials()),
        ("to-c", _cp("to-c", "u2", redeemer=c_uuid), PeerCredentials()),  # redeemed, exchange under way
        ("to-d", _cp("to-d", "u3"), PeerCredentials(peer_uuid=d_uuid.upper())),  # the Secret before the status
        ("gone", _cp("gone", "u4", peer=e_uuid, deleting=True), PeerCredentials()),  # deleting frees it
        ("self", _cp("self", "u5", peer=A_UUID), PeerCredentials()),  # the one asking
    ]
    assert join_rules.uuids_in_use(peers, exclude="self") == {B_UUID: "to-b", c_uuid: "to-c", d_uuid: "to-d"}


def test_a_claim_of_our_own_or_a_live_peers_uuid_is_refused_whatever_its_case():
    in_use = {B_UUID: "to-b"}
    own = join_rules.claimed_uuid_problem(A_UUID.upper(), own_uuid=A_UUID, in_use=in_use, side="the joining cluster")
    assert own is not None and "this cluster's own" in own and own.startswith("the joining cluster")
    taken = join_rules.claimed_uuid_problem(B_UUID.upper(), own_uuid=A_UUID, in_use=in_use, side="the joining cluster")
    assert taken is not None and "to-b" in taken and "delete ClusterPeer to-b" in taken
    assert join_rules.claimed_uuid_problem("c0000000-0000-4000-8000-00000000000c", own_uuid=A_UUID, in_use=in_use,
                                           side="the joining cluster") is None
    assert reasons.CODES[reasons.CLUSTER_UUID_IN_USE] == 409
    assert reasons.CLUSTER_UUID_IN_USE in reasons.JOIN_REFUSALS


def test_the_identity_is_the_clusterpeers_uid_and_never_its_absence():
    assert peering_identity({"metadata": {"name": "to-b", "uid": "u-1"}}) == "u-1"
    with pytest.raises(ValueError, match="metadata.uid"):
        peering_identity({"metadata": {"name": "to-b"}})
    assert username_prefix("u-1") == "peering:u-1:"
    assert consumer_username("u-1", "ns", "sa") == "peering:u-1:system:serviceaccount:ns:sa"


def _capability(name):
    return {"metadata": {"name": name}, "spec": {
        "version": "v1", "consumers": [{"namespace": "d8-mod", "name": "ctl"}],
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}}


def test_two_peerings_claiming_one_uuid_never_share_a_prefix_or_a_consumer():
    """The original attack, should a UUID ever collide: a second invited cluster claims the first peer's UUID.
    Its provider's prefix and its grants' subjects are still its own, so its consumers' exchanged usernames never
    match a binding of the first peering."""
    local = caps.validated_capabilities([_capability("cm")], lambda group, resource: True)
    offer = {"clusterUUID": B_UUID, "capabilities": [{"name": "cm", "version": "v1", "scope": ["project"]}],
             "projects": [{"name": "shop", "namespaces": ["shop"]}]}
    first = {"metadata": {"name": "to-b", "uid": "11111111-1111-4111-8111-111111111111"},
             "spec": {"capabilities": ["cm"]}}
    second = {"metadata": {"name": "to-evil", "uid": "22222222-2222-4222-8222-222222222222"},
              "spec": {"capabilities": ["cm"]}}
    prefixes, subjects = [], []
    for cp in (first, second):
        provider = desired_provider(cp, local_uuid=A_UUID, issuer_url="https://i", jwks="{}", effective=["cm"])
        prefixes.append(provider["spec"]["usernamePrefix"])
        got = entitlements(cp, peer=offer, local_capabilities=local, local_projects={"shop": ["shop"]})
        subjects.append({s["name"] for o in got.grants.objects if o["kind"] == "RoleBinding" for s in o["subjects"]})
    assert prefixes == [f"peering:{first['metadata']['uid']}:", f"peering:{second['metadata']['uid']}:"]
    assert all(B_UUID not in p for p in prefixes)
    assert subjects[0] and subjects[1] and not subjects[0] & subjects[1]
    # Neither prefix starts the other: user-authn's PrefixConflict can never pair them either.
    assert not prefixes[0].startswith(prefixes[1]) and not prefixes[1].startswith(prefixes[0])
    # The exchanged username of the second peering's consumer binds nothing of the first.
    evil = prefixes[1] + "system:serviceaccount:d8-mod:ctl"
    assert evil not in subjects[0]


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _body(**changes) -> dict:
    from datetime import datetime, timezone

    from control import pki

    now = datetime.now(timezone.utc)
    body = {"token": "abcd1234." + "s" * 43, "clusterUUID": B_UUID, "alias": "to-a",
            "entrance": "peering-gateway.b.lab", "caBundle": pki.create_ca(B_UUID, now=now).cert_pem,
            "csr": pki.make_key_and_csr(B_UUID).cert_pem, "offer": {}}
    return {**body, **changes}


def test_a_join_request_with_a_well_formed_uuid_and_entrance_parses():
    assert join_rules.parse_join_request(_body(entrance="peering-gateway.b.lab:8443"), now=_now()).entrance == \
        "peering-gateway.b.lab:8443"


@pytest.mark.parametrize(("key", "value"), [("clusterUUID", "b-uuid"), ("clusterUUID", "../../" + B_UUID[6:]),
                                            ("entrance", "peering-gateway.b.lab/evil"),
                                            ("entrance", "u@peering-gateway.b.lab"),
                                            ("entrance", "https://peering-gateway.b.lab")])
def test_a_join_request_with_a_bad_uuid_or_entrance_is_malformed_naming_the_field(key, value):
    with pytest.raises(join_rules.JoinError) as err:
        join_rules.parse_join_request(_body(**{key: value}), now=_now())
    assert err.value.reason == reasons.MALFORMED and err.value.code == 400
    assert f"the join request's {key}" in err.value.message
    assert "s" * 43 not in err.value.message


@pytest.mark.parametrize("entrance", ["peering-gateway.a.lab/x", "https://peering-gateway.a.lab", "a@b", ""])
def test_an_answer_naming_an_entrance_that_is_more_than_a_host_is_refused(entrance):
    from datetime import datetime, timedelta, timezone

    from control import connstring, pki

    now = datetime.now(timezone.utc)
    a_ca = pki.create_ca(A_UUID, now=now)
    inv = connstring.Invitation(A_UUID, "https://peering.a.lab", "peering-gateway.a.lab", pki.spki_pin(a_ca.cert_pem),
                                "abcd1234", "s" * 43, now + timedelta(hours=1))
    b_key = pki.make_key_and_csr(B_UUID)
    answer = join_rules.join_answer(
        cluster_uuid=A_UUID, alias="to-b", entrance=entrance, ca_pem=a_ca.cert_pem,
        certificate_pem=pki.issue_client_cert(a_ca, b_key.cert_pem, B_UUID, now=now),
        csr_pem=pki.make_key_and_csr(A_UUID).cert_pem, offer={})
    with pytest.raises(join_rules.JoinError) as err:
        join_rules.check_join_answer(answer, inv, own_uuid=B_UUID,
                                     own_key_fingerprint=pki.public_key_fingerprint(b_key.cert_pem), now=now)
    assert err.value.reason == join_rules.INVALID_ANSWER and "entrance" in err.value.message
    good = join_rules.check_join_answer({**answer, "entrance": "peering-gateway.a.lab:8443"}, inv, own_uuid=B_UUID,
                                        own_key_fingerprint=pki.public_key_fingerprint(b_key.cert_pem), now=now)
    assert good.entrance == "peering-gateway.a.lab:8443"
