"""A short cache of successful authentications, as kube-apiserver keeps one in front of its token
authenticators (10 s for a success): the same client certificate or bearer token on every request of a benchmark
must not pay for a signature check each time.

Entries never outlive the credential (certificate notAfter, token exp) and are dropped at once when a
ServiceAccount is deleted or replaced, so a revoked ServiceAccount token stops working immediately, as the
token authenticator's ServiceAccount lookup makes it do without the cache."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from cryptography import x509

from lab.apiserver.auth.authn import bearer_token
from lab.apiserver.auth.tokens import unverified_claims
from lab.apiserver.auth.types import UserInfo

SUCCESS_TTL = 10.0
MAX_ENTRIES = 4096


class AuthCache:
    def __init__(self, ttl: float = SUCCESS_TTL, max_entries: int = MAX_ENTRIES, clock=time.time) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple, tuple[UserInfo, float]] = OrderedDict()

    @staticmethod
    def key(headers, peer_cert_der: bytes | None) -> tuple:
        token = bearer_token(headers)
        digest = hashlib.sha256(token.encode()).digest() if token else b""
        return (peer_cert_der or b"", digest, token)

    def get(self, key: tuple) -> UserInfo | None:
        entry = self._entries.get(key[:2])
        if entry is None:
            return None
        user, expires = entry
        if self._clock() >= expires:
            del self._entries[key[:2]]
            return None
        return user

    def put(self, key: tuple, user: UserInfo) -> None:
        der, _digest, token = key
        expires = self._clock() + self.ttl
        if der:
            try:
                expires = min(expires, x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp())
            except ValueError:
                return
        if token:
            # Whichever credential authenticated, the entry ends no later than either of them.
            exp = (unverified_claims(token) or {}).get("exp")
            if isinstance(exp, (int, float)):
                expires = min(expires, float(exp))
        self._entries[key[:2]] = (user, expires)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

