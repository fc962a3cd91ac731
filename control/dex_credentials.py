"""The credentials of the module's Dex client, as user-authn makes them from the chart's DexClient object.

(The gateway's `gateway.exchange.DexClient` is the HTTP client that uses them.)
"""

from __future__ import annotations

import base64

from control.config import DexSettings
from control.informers import Informers
from control.kube import SECRETS

SECRET_KEY = "clientSecret"


class DexClientCredentials:
    """The ID is derived from the DexClient's name and namespace; the secret is kept current from Secret
    `dex-client-<name>`, key `clientSecret`, and read on every exchange, so that the Secret appearing late or
    rotating needs no restart."""

    def __init__(self, informers: Informers, namespace: str, settings: DexSettings) -> None:
        self.name = settings.secret_name
        self.namespace = namespace
        self.id = settings.client_id(namespace)
        self.informer = informers.get(SECRETS, namespace=namespace, field_selector=f"metadata.name={self.name}")

    def client_id(self) -> str:
        return self.id

    def client_secret(self) -> str:
        secret = self.informer.get(self.name, self.namespace) or {}
        value = (secret.get("data") or {}).get(SECRET_KEY)
        try:
            return base64.b64decode(value).decode() if isinstance(value, str) else ""
        except (ValueError, UnicodeDecodeError):
            return ""
