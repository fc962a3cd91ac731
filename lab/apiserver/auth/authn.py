"""Who is calling: x509 client certificates, ServiceAccount tokens and OIDC tokens, as kube-apiserver tells them.

The TLS layer has already checked the client certificate's chain (the listener trusts client_ca_pem); the check is
repeated here so that this module's answer never depends on how the listener was configured. Bearer tokens go to
the authenticator whose issuer they claim (the unverified `iss` only picks the verifier, it is never trusted).
ServiceAccount tokens are valid only while their ServiceAccount, and the object they are bound to, still exist
with the uid the token names: deleting a ServiceAccount revokes its tokens at once, as in kube-apiserver.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.apiserver.auth.oidc import OIDCAuthenticator
from lab.apiserver.auth.tokens import (
    ServiceAccountIssuer,
    TokenInvalid,
    audiences_of,
    intersect,
    sa_username,
    unverified_claims,
)
from lab.apiserver.auth.types import ListObjects, UserInfo

log = logging.getLogger(__name__)

AUTHENTICATED = "system:authenticated"
ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class TokenResult:
    """The outcome of authenticating one bearer token.

    audiences: those of the token that the caller asked for (TokenReview's status.audiences); error: why the token
    was refused, in words fit for a TokenReview answer or a log, never containing the token.
    """

    user: UserInfo | None
    audiences: tuple[str, ...] = ()
    error: str = ""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (any case of the header and the scheme)."""
    value = headers.get("Authorization")
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    if not value:
        return None
    parts = value.split(" ")
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def refused(why: str = "") -> str:
    """A refused token as kube-apiserver's union of authenticators says it: the generic error alone when no
    authenticator took the token (not a JWT, an issuer nobody trusts), else both, aggregated."""
    return f"[invalid bearer token, {why}]" if why else "invalid bearer token"


def with_authenticated(user: UserInfo) -> UserInfo:
    if AUTHENTICATED in user.groups:
        return user
    return replace(user, groups=tuple(user.groups) + (AUTHENTICATED,))


def _uid(obj: Mapping) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def _find(objects: Iterable[dict], name: str) -> dict | None:
    return next((o for o in objects if (o.get("metadata") or {}).get("name") == name), None)


class Authenticator:
    """Turns a request's client certificate or bearer token into a user, or None when neither authenticates.

    oidc may be extended after construction (`add_oidc`), as the lab's Dex starts after the API server; the list
    passed in is used as is, so a caller that appends to it is seen too.
    """

    def __init__(self, client_ca_pem: bytes, sa_issuer: ServiceAccountIssuer, oidc: list[OIDCAuthenticator],
                 list_objects: ListObjects, *, clock: Callable[[], datetime] = _utcnow) -> None:
        self._cas = x509.load_pem_x509_certificates(client_ca_pem) if client_ca_pem else []
        self.sa_issuer = sa_issuer
        self.oidc = oidc if isinstance(oidc, list) else list(oidc)
        self._list = list_objects
        self._clock = clock

    def add_oidc(self, authenticator: OIDCAuthenticator) -> None:
        self.oidc.append(authenticator)

    async def authenticate(self, headers: Mapping[str, str], peer_cert_der: bytes | None) -> UserInfo | None:
        """The user of a request: its client certificate first, then its bearer token (for the API audiences)."""
        if peer_cert_der:
            user = self.authenticate_certificate(peer_cert_der)
            if user is not None:
                return user
        token = bearer_token(headers)
        if token is None:
            return None
        result = await self.authenticate_token(token)
        if result.user is None:
            log.debug("bearer token refused: %s", result.error)
        return result.user

    # --- x509 ---------------------------------------------------------------------------------------------------

    def authenticate_certificate(self, der: bytes) -> UserInfo | None:
        """CN is the user, each O a group, if the certificate was issued by a client CA and is valid now."""
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return None
        if not self._issued_by_client_ca(cert):
            return None
        now = self._clock()
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return None
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = None
        if usages is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usages \
                and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in usages:
            return None
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        username = str(names[0].value) if names else ""
        if not username:
            return None
        groups = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
        # kube-apiserver names the credential: the SHA-256 of the certificate.
        extra = {"authentication.kubernetes.io/credential-id": (f"X509SHA256={hashlib.sha256(der).hexdigest()}",)}
        return with_authenticated(UserInfo(username=username, groups=groups, extra=extra))

    def _issued_by_client_ca(self, cert: x509.Certificate) -> bool:
        for ca in self._cas:
            if cert.issuer != ca.subject:
                continue
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return True
        return False

    # --- bearer tokens ------------------------------------------------------------------------------------------

    async def authenticate_token(self, token: str, audiences: list[str] | None = None) -> TokenResult:
        """Authenticate a bearer token for audiences (None or empty: the API audiences), as TokenReview does."""
        wanted = list(audiences) if audiences else self.sa_issuer.api_audiences
        claims = unverified_claims(token)
        if claims is None:
            return TokenResult(None, error=refused())
        issuer = claims.get("iss")
        if issuer == self.sa_issuer.issuer_url:
            return self._service_account(token, wanted)
        for oidc in list(self.oidc):
            if oidc.issuer_url != issuer:
                continue
            # OIDC tokens are for the client ID, not for audiences: like kube-apiserver, they authenticate only
            # requests meant for the API itself.
            matched = intersect(self.sa_issuer.api_audiences, wanted)
            if not matched:
                return TokenResult(None, error=refused(f"an OIDC token is valid only for the API audiences "
                                                       f"{self.sa_issuer.api_audiences}"))
            try:
                user = await oidc.verify(token)
            except TokenInvalid as exc:
                return TokenResult(None, error=refused(exc.reason))
            return TokenResult(with_authenticated(user), tuple(matched))
        return TokenResult(None, error=refused())

    def _service_account(self, token: str, wanted: list[str]) -> TokenResult:
        try:
            claims = self.sa_issuer.verify(token, wanted)
        except TokenInvalid as exc:
            return TokenResult(None, error=refused(exc.reason))
        k8s = claims["kubernetes.io"]
        namespace = k8s["namespace"]
        sa_ref = k8s["serviceaccount"]
        sa = _find(self._list("", "serviceaccounts", namespace), sa_ref.get("name", ""))
        problem = self._missing("service account", namespace, sa_ref, sa)
        extra: dict[str, tuple[str, ...]] = {}
        for kind, plural, scoped in (("pod", "pods", True), ("secret", "secrets", True), ("node", "nodes", False)):
            if problem or kind not in k8s:
                continue
            ref = k8s[kind] if isinstance(k8s[kind], dict) else {}
            found = _find(self._list("", plural, namespace if scoped else None), ref.get("name", ""))
            problem = self._missing(kind, namespace if scoped else "", ref, found)
            if kind in ("pod", "node"):
                extra[f"authentication.kubernetes.io/{kind}-name"] = (ref.get("name", ""),)
                extra[f"authentication.kubernetes.io/{kind}-uid"] = (ref.get("uid", ""),)
        if problem:
            return TokenResult(None, error=refused(problem))
        if claims.get("jti"):
            extra["authentication.kubernetes.io/credential-id"] = (f"JTI={claims['jti']}",)
        user = UserInfo(
            username=sa_username(namespace, sa_ref["name"]),
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
            uid=sa_ref.get("uid", ""),
            extra=extra,
        )
        return TokenResult(user, tuple(intersect(audiences_of(claims), wanted)))

    @staticmethod
    def _missing(what: str, namespace: str, ref: Mapping, found: Mapping | None) -> str:
        """Why the object a token names is gone or replaced ("" when it is there), in kube-apiserver's words."""
        where = f"{namespace}/{ref.get('name', '')}" if namespace else ref.get("name", "")
        if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
            return f"{what} {where} has been deleted"
        if ref.get("uid") and _uid(found) != ref["uid"]:
            return f"{what} UID ({_uid(found)}) does not match claim ({ref['uid']})"
        return ""
