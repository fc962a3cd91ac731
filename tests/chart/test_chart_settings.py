"""The ModuleConfig's settings (openapi/config-values.yaml) as Deckhouse checks them: defaults filled in for an
empty ModuleConfig, and a bad value refused with a message that names the setting."""

from __future__ import annotations

import pytest

from control.config import ControlSettings
from lab import deckhouse_module


def test_an_empty_module_config_gets_every_default() -> None:
    values = deckhouse_module.settings_values({})
    assert values["entrance"]["mode"] == "LoadBalancer"
    assert values["peerSyncIntervalSeconds"] == 30
    # As the process's own defaults (control/config.py): 24 hours for peers' client certificates, 12 for servers.
    assert (values["clientCertificateLifetimeSeconds"], values["serverCertificateLifetimeSeconds"]) == (
        ControlSettings.client_cert_lifetime, ControlSettings.server_cert_lifetime)
    assert values["logLevel"] == "Info"
    assert values["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                   "limits": {"cpu": "1", "memory": "512Mi"}}
    # No default: the cluster's own high availability mode applies (dmt's high-availability rule).
    assert "highAvailability" not in values and "https" not in values


@pytest.mark.parametrize(("settings", "named"), [
    ({"https": {"mode": "Letsencrypt"}}, "settings.https.mode"),
    ({"https": {"customCertificate": {"secretName": "Bad_Name"}}}, "settings.https.customCertificate.secretName"),
    ({"entrance": {"mode": "NodePort"}}, "settings.entrance.mode"),
    ({"entrance": {"loadBalancer": {"sourceRange": []}}}, "settings.entrance.loadBalancer"),
    ({"entrance": {"loadBalancer": {"sourceRanges": ["everyone"]}}}, "settings.entrance.loadBalancer.sourceRanges.0"),
    ({"entrance": {"ingressNginx": {"ingressClass": "Not A Class"}}}, "settings.entrance.ingressNginx.ingressClass"),
    ({"highAvailability": "yes"}, "settings.highAvailability"),
    ({"peerSyncIntervalSeconds": 1}, "settings.peerSyncIntervalSeconds"),
    ({"peerSyncIntervalSeconds": "30s"}, "settings.peerSyncIntervalSeconds"),
    ({"clientCertificateLifetimeSeconds": 60}, "settings.clientCertificateLifetimeSeconds"),
    ({"clientCertificateLifetimeSeconds": 30 * 86400}, "settings.clientCertificateLifetimeSeconds"),
    ({"serverCertificateLifetimeSeconds": "12h"}, "settings.serverCertificateLifetimeSeconds"),
    ({"resources": {"limits": {"memory": "lots"}}}, "settings.resources.limits.memory"),
    ({"logLevel": "debug"}, "settings.logLevel"),
    ({"nodeSelector": {"pool": 1}}, "settings.nodeSelector.pool"),
    ({"replicas": 3}, "settings"),
])
def test_a_bad_setting_is_refused_naming_it(settings: dict, named: str) -> None:
    with pytest.raises(deckhouse_module.SettingsError) as failure:
        deckhouse_module.settings_values(settings)
    message = str(failure.value)
    assert message.startswith(f"{named}: "), message


def test_the_values_schema_extends_the_settings_with_internal() -> None:
    schema = deckhouse_module.values_schema()
    # internal: what the hooks compute; registry: what Deckhouse sets for a module from a ModuleSource.
    assert set(schema["properties"]) == set(deckhouse_module.config_schema()["properties"]) | {"internal", "registry"}
    with pytest.raises(deckhouse_module.SettingsError, match=r"^peering\.internal\.customCertificateData"):
        deckhouse_module.settings_values({}, {"customCertificateData": {"tls.crt": "not base64!"}})
