"""The CustomCertificate hook (hooks/copy_custom_certificate.py) run with the deckhouse package's test runner on
the binding contexts Deckhouse gives it: the d8-system Secret named by the settings lands in
peering.internal.customCertificateData, which the template serves as d8-peering/ingress-tls-customcertificate."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import helm_python as helm
import yaml
from deckhouse import hook

from chart_paths import CHART_DIR
from module_values import CUSTOM_CERTIFICATE, objects, one, values

HOOK = CHART_DIR / "hooks" / "copy_custom_certificate.py"
CRT, KEY, CA = "Y2VydGlmaWNhdGU=", "a2V5", "Y2E="


def load_hook():
    spec = importlib.util.spec_from_file_location("copy_custom_certificate", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def secret_item(name: str, data: dict) -> dict:
    """A snapshot item as the binding's jqFilter leaves it."""
    return {"filterResult": {"name": name, "data": data}}


def context(*items: dict) -> list[dict]:
    return [{"binding": "beforeHelm", "type": "Synchronization", "snapshots": {"custom_certificates": list(items)}}]


def initial(https_global: dict, module: dict | None = None) -> dict:
    return {"global": {"modules": {"https": https_global}}, "peering": {"internal": {}, **(module or {})}}


def test_the_named_secret_is_copied_into_values() -> None:
    h = load_hook()
    out = hook.testrun(h.main, context(secret_item("other-tls", {"tls.crt": "eA==", "tls.key": "eQ=="}),
                                       secret_item("example-com-tls", {"tls.crt": CRT, "tls.key": KEY, "ca.crt": CA})),
                       initial_values=initial(CUSTOM_CERTIFICATE))
    assert out.values["peering"]["internal"]["customCertificateData"] == {"tls.crt": CRT, "tls.key": KEY, "ca.crt": CA}
    [patch] = out.values_patches.data
    assert patch["path"] == "/peering/internal/customCertificateData" and patch["op"] == "add"


def test_the_module_setting_names_the_secret_before_the_global_one() -> None:
    h = load_hook()
    out = hook.testrun(h.main, context(secret_item("example-com-tls", {"tls.crt": "eA==", "tls.key": "eQ=="}),
                                       secret_item("own-tls", {"tls.crt": CRT, "tls.key": KEY})),
                       initial_values=initial({"mode": "CertManager"}, {"https": {
                           "mode": "CustomCertificate", "customCertificate": {"secretName": "own-tls"}}}))
    assert out.values["peering"]["internal"]["customCertificateData"] == {"tls.crt": CRT, "tls.key": KEY}


def test_no_copy_in_another_mode_or_without_the_secret() -> None:
    h = load_hook()
    stale = {"internal": {"customCertificateData": {"tls.crt": CRT, "tls.key": KEY}}}
    for https, items in (({"mode": "CertManager"}, [secret_item("example-com-tls", {"tls.crt": CRT, "tls.key": KEY})]),
                         (CUSTOM_CERTIFICATE, []),
                         (CUSTOM_CERTIFICATE, [secret_item("example-com-tls", {"tls.crt": CRT})])):
        vals = initial(https)
        vals["peering"].update(stale)
        out = hook.testrun(h.main, context(*items), initial_values=vals)
        assert "customCertificateData" not in out.values["peering"]["internal"], (https, items)


def test_the_hook_copy_renders_as_the_served_secret() -> None:
    h = load_hook()
    out = hook.testrun(h.main, context(secret_item("example-com-tls", {"tls.crt": CRT, "tls.key": KEY})),
                       initial_values=initial(CUSTOM_CERTIFICATE))
    with helm.Chart.load(CHART_DIR) as chart:
        objs = objects(chart, values(https=CUSTOM_CERTIFICATE, internal=out.values["peering"]["internal"]))
    assert one(objs, "Secret", "ingress-tls-customcertificate")["data"] == {"tls.crt": CRT, "tls.key": KEY}


def test_the_hook_prints_its_binding_config_for_deckhouse() -> None:
    """Deckhouse runs a hook with --config to learn its bindings: d8-system Secrets of type kubernetes.io/tls,
    reduced by the jqFilter to the name and the certificate's keys, before every render."""
    proc = subprocess.run([sys.executable, str(HOOK), "--config"], capture_output=True, text=True, check=True)
    config = yaml.safe_load(proc.stdout)
    assert config["configVersion"] == "v1" and config["beforeHelm"] > 0
    [binding] = config["kubernetes"]
    assert (binding["kind"], binding["namespace"]["nameSelector"]["matchNames"]) == ("Secret", ["d8-system"])
    assert binding["name"] == "custom_certificates"
    assert '"tls.key"' in binding["jqFilter"] and ".metadata.name" in binding["jqFilter"]
