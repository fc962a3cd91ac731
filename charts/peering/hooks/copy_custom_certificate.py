#!/usr/bin/env python3
"""CustomCertificate as Deckhouse does it: the Secret that `https.customCertificate.secretName` names (the
module's setting, else `global.modules.https.customCertificate.secretName`) lives in `d8-system`. Before every
render this hook reads it from its snapshot into `peering.internal.customCertificateData`, and
templates/custom-certificate.yaml serves it from `d8-peering` as `ingress-tls-customcertificate`.

In any other https mode, or while the Secret does not exist, the copy is dropped; the template then refuses to
render in CustomCertificate mode with a message naming the missing Secret. The certificate's data is only ever
put into values: it never reaches a log, a metric or an error.
"""

from __future__ import annotations

from deckhouse import hook

MODULE = "peering"
SOURCE_NAMESPACE = "d8-system"
SNAPSHOT = "custom_certificates"
KEYS = ("tls.crt", "tls.key", "ca.crt")

CONFIG = f"""
configVersion: v1
beforeHelm: 10
kubernetes:
  - name: {SNAPSHOT}
    apiVersion: v1
    kind: Secret
    namespace:
      nameSelector:
        matchNames: ["{SOURCE_NAMESPACE}"]
    fieldSelector:
      matchExpressions:
        - field: type
          operator: Equals
          value: kubernetes.io/tls
    # Only the name and the certificate's keys reach the snapshot, never the rest of the object.
    jqFilter: '{{"name": .metadata.name, "data": (.data // {{}} | with_entries(select(.key == "tls.crt" or .key == "tls.key" or .key == "ca.crt")))}}'
    executeHookOnSynchronization: false
"""


def _get(values: dict, *path: str):
    for key in path:
        if not isinstance(values, dict):
            return None
        values = values.get(key)
    return values


def wanted_secret(values: dict) -> str | None:
    """The name of the d8-system Secret to copy, or None when the module's https mode is not CustomCertificate."""
    mode = _get(values, MODULE, "https", "mode") or _get(values, "global", "modules", "https", "mode")
    if mode != "CustomCertificate":
        return None
    name = (_get(values, MODULE, "https", "customCertificate", "secretName")
            or _get(values, "global", "modules", "https", "customCertificate", "secretName"))
    # Deckhouse's global default for the name is the string "false": no Secret named.
    return name if name and name != "false" else None


def certificate_data(snapshot: list[dict], name: str) -> dict | None:
    """The certificate's keys of Secret `name` from the snapshot, or None when it is absent or incomplete."""
    for item in snapshot or []:
        found = item.get("filterResult") or {}
        if found.get("name") == name:
            data = {k: v for k, v in (found.get("data") or {}).items() if k in KEYS and v}
            return data if "tls.crt" in data and "tls.key" in data else None
    return None


def main(ctx: hook.Context) -> None:
    values = ctx.values
    module = values.setdefault(MODULE, {})
    internal = module.setdefault("internal", {})
    name = wanted_secret(values)
    data = certificate_data(ctx.snapshots.get(SNAPSHOT, []), name) if name else None
    if data is None:
        internal.pop("customCertificateData", None)
    else:
        internal["customCertificateData"] = data


if __name__ == "__main__":
    hook.run(main, config=CONFIG)
