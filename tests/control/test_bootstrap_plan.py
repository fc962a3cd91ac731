"""What the leader decides to issue for the cluster's own certificates (no server needed)."""

from __future__ import annotations

import base64
import datetime

from control import bootstrap, pki

NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
TEMPLATE = "%s.a.lab"


def as_secret(name, material, ca_pem=None):
    return bootstrap.tls_secret(name, "d8-peering", material, ca_pem)


def fresh_world():
    ca = pki.create_ca("u-1", now=NOW)
    entrance = pki.issue_server_cert(ca, [pki.entrance_host(TEMPLATE)], now=NOW)
    egress = pki.issue_server_cert(ca, list(pki.EGRESS_HOSTS), now=NOW)
    return ca, as_secret("peering-ca", ca), as_secret("peering-gateway-tls", entrance, ca.cert_pem), \
        as_secret("peering-egress-tls", egress, ca.cert_pem)


def run_plan(ca_secret, entrance, egress, now=NOW, template=TEMPLATE):
    return bootstrap.plan(ca_secret=ca_secret, entrance_secret=entrance, egress_secret=egress,
                          public_domain_template=template, cluster_name="u-1", now=now)


def test_nothing_at_all_creates_the_ca_and_both_server_certs_from_it():
    p = run_plan(None, None, None)
    assert p.ca is not None and p.entrance is not None and p.egress is not None
    assert pki.issued_by(p.entrance.cert_pem, p.ca.cert_pem)
    assert pki.dns_names(p.entrance.cert_pem) == ["peering-gateway.a.lab"]
    assert sorted(pki.dns_names(p.egress.cert_pem)) == sorted(pki.EGRESS_HOSTS)
    assert p.recheck_at is not None and p.recheck_at > NOW


def test_a_healthy_set_writes_nothing_and_rechecks_at_renewal_time():
    _, ca_s, ent_s, egr_s = fresh_world()
    p = run_plan(ca_s, ent_s, egr_s)
    assert (p.ca, p.entrance, p.egress, p.why) == (None, None, None, ())
    assert p.recheck_at == pki.renewal_time(base64.b64decode(ent_s["data"]["tls.crt"]).decode())


def test_server_certs_are_renewed_when_due_but_the_ca_is_kept():
    _, ca_s, ent_s, egr_s = fresh_world()
    later = NOW + datetime.timedelta(days=25)
    p = run_plan(ca_s, ent_s, egr_s, now=later)
    assert p.ca is None and p.entrance is not None and p.egress is not None
    assert any("renewal" in w for w in p.why)


def test_a_server_cert_of_another_ca_or_other_hosts_is_reissued():
    _, ca_s, ent_s, egr_s = fresh_world()
    _, _, foreign_ent, _ = fresh_world()
    p = run_plan(ca_s, foreign_ent, egr_s)
    assert p.entrance is not None and p.egress is None and p.ca is None
    p = run_plan(ca_s, ent_s, egr_s, template="%s.b.lab")
    assert p.entrance is not None and pki.dns_names(p.entrance.cert_pem) == ["peering-gateway.b.lab"]


def test_an_unreadable_ca_is_replaced_and_everything_reissued():
    _, ca_s, ent_s, egr_s = fresh_world()
    broken = {**ca_s, "data": {"tls.crt": base64.b64encode(b"garbage").decode(), "tls.key": ""}}
    p = run_plan(broken, ent_s, egr_s)
    assert p.ca is not None and p.entrance is not None and p.egress is not None
