"""The peer Secret `peer-<clusterpeer>` (docs/internals.md): its keys and the typed value both sides read.

The control loop writes it (`control/peer_secret.py`) and reads it for every phase; the gateway's registry reads
it for the live peer (`gateway/registry.py`). Both go through `PeerCredentials`, so a key is named once.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Mapping

#: The peer's peering CA: what this cluster trusts of the peer's entrance and of the certificates it issues to us.
PEER_CA = "peer-ca.crt"
#: Our private key toward the peer (made before the join's request leaves the cluster, kept across renewals).
CLIENT_KEY = "client.key"
#: Our client certificate, issued by the peer for CLIENT_KEY.
CLIENT_CERT = "client.crt"
#: The client certificate(s) this cluster issued to the peer (the newest first): the entrance admits them.
ISSUED_CERT = "issued.crt"
#: The peer's cluster UUID, as the exchange established it.
PEER_UUID = "peer-uuid"
#: The peer's entrance host (and port), where this cluster calls it.
PEER_ENTRANCE = "peer-entrance"

KEYS = (PEER_CA, CLIENT_KEY, CLIENT_CERT, ISSUED_CERT, PEER_UUID, PEER_ENTRANCE)
"""Every key of a peer Secret; a Secret carries no other."""

_FIELDS = {PEER_CA: "peer_ca", CLIENT_KEY: "client_key", CLIENT_CERT: "client_cert", ISSUED_CERT: "issued",
           PEER_UUID: "peer_uuid", PEER_ENTRANCE: "peer_entrance"}


@dataclasses.dataclass(frozen=True)
class PeerCredentials:
    """The text values of a peer Secret; "" for a key it does not hold (or holds unreadable)."""

    peer_ca: str = ""
    client_key: str = ""
    client_cert: str = ""
    issued: str = ""
    peer_uuid: str = ""
    peer_entrance: str = ""

    def __repr__(self) -> str:  # a private key never reaches a log through repr
        held = ", ".join(key for key in KEYS if getattr(self, _FIELDS[key]))
        return f"PeerCredentials(<{held or 'empty'}>)"

    @classmethod
    def from_values(cls, values: Mapping[str, str]) -> "PeerCredentials":
        """From text values by key; a key that is not a peer Secret's is refused, naming it."""
        unknown = set(values) - set(KEYS)
        if unknown:
            raise ValueError(f"unknown keys for a peer Secret: {', '.join(sorted(unknown))}; "
                             f"a peer Secret holds {', '.join(KEYS)}")
        return cls(**{_FIELDS[key]: value for key, value in values.items() if isinstance(value, str)})

    @classmethod
    def from_secret(cls, secret: Mapping | None) -> "PeerCredentials":
        """From the Secret as the API returns it (base64 `data`): keys of no peer Secret, and values that are not
        base64 of UTF-8 text, are left out (an absent or foreign Secret reads as empty)."""
        data = (secret or {}).get("data")
        out = {}
        for key in KEYS:
            value = data.get(key) if isinstance(data, Mapping) else None
            if not isinstance(value, str):
                continue
            try:
                out[_FIELDS[key]] = base64.b64decode(value, validate=True).decode()
            except (ValueError, TypeError):
                continue
        return cls(**out)

    def values(self) -> dict[str, str]:
        """The held values by key (empty ones left out)."""
        return {key: getattr(self, _FIELDS[key]) for key in KEYS if getattr(self, _FIELDS[key])}

    def to_data(self) -> dict[str, str]:
        """The Secret's `data`: each held value base64-encoded, by key."""
        return {key: base64.b64encode(value.encode()).decode() for key, value in sorted(self.values().items())}

    def replace(self, **changes: str) -> "PeerCredentials":
        return dataclasses.replace(self, **changes)
