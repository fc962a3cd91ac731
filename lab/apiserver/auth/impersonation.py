"""User impersonation (`Impersonate-*` headers), as kube-apiserver applies it after authentication.

The gateway refuses every request that carries an `Impersonate-*` header. The emulator honours them like
kube-apiserver does, so that a test proves the refusal against a server where impersonation would work, rather
than one that would ignore the headers anyway.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import unquote

from lab.apiserver.auth.rbac import Authorizer, forbidden
from lab.apiserver.auth.tokens import parse_sa_username
from lab.apiserver.auth.types import Attributes, UserInfo
from lab.apiserver.errors import bad_request

USER = "impersonate-user"
GROUP = "impersonate-group"
UID = "impersonate-uid"
EXTRA_PREFIX = "impersonate-extra-"
AUTHENTICATION = "authentication.k8s.io"


def _pairs(headers: Any) -> list[tuple[str, str]]:
    """Every (lower-case name, value) pair, keeping repeated headers (aiohttp's multidict, or a plain mapping)."""
    return [(k.lower(), v) for k, v in headers.items()]


def impersonation_headers(headers: Mapping[str, str]) -> bool:
    """Whether a request asks to impersonate (any header starting with `Impersonate-`)."""
    return any(name.startswith("impersonate-") for name, _ in _pairs(headers))


def impersonate(user: UserInfo, headers: Mapping[str, str], authorizer: Authorizer) -> UserInfo:
    """The user the request acts as: the authenticated user, or whom it impersonates if it may.

    Each impersonated attribute needs the `impersonate` verb on it: users, groups and serviceaccounts in the core
    group, uids and userextras/<key> in authentication.k8s.io. A denial is the 403 kube-apiserver answers; asking for
    groups, extras or a uid without a user is a 400. The caller removes the headers before going on.
    """
    pairs = _pairs(headers)
    users = [v for k, v in pairs if k == USER]
    groups = [v for k, v in pairs if k == GROUP]
    uids = [v for k, v in pairs if k == UID]
    extras: dict[str, list[str]] = {}
    for name, value in pairs:
        if name.startswith(EXTRA_PREFIX) and len(name) > len(EXTRA_PREFIX):
            extras.setdefault(unquote(name[len(EXTRA_PREFIX):]), []).append(value)
    if not users:
        if groups or uids or extras:
            raise bad_request("Impersonate-Group, Impersonate-Uid and Impersonate-Extra-* need an Impersonate-User "
                              "naming the user to act as")
        return user
    if len(users) > 1 or len(uids) > 1:
        raise bad_request("Impersonate-User and Impersonate-Uid may each be given once")
    username = users[0]

    checks: list[Attributes] = []
    sa = parse_sa_username(username)
    if sa is not None:
        checks.append(Attributes(verb="impersonate", resource_request=True, resource="serviceaccounts",
                                 namespace=sa[0], name=sa[1]))
    else:
        checks.append(Attributes(verb="impersonate", resource_request=True, resource="users", name=username))
    checks += [Attributes(verb="impersonate", resource_request=True, resource="groups", name=g) for g in groups]
    checks += [Attributes(verb="impersonate", resource_request=True, api_group=AUTHENTICATION, resource="uids",
                          name=u) for u in uids]
    checks += [Attributes(verb="impersonate", resource_request=True, api_group=AUTHENTICATION,
                          resource="userextras", subresource=key, name=value)
               for key, values in extras.items() for value in values]
    for attrs in checks:
        decision = authorizer.authorize(user, attrs)
        if not decision.allowed:
            raise forbidden(user, attrs, decision.reason)

    out_groups = list(groups)
    if sa is not None:
        out_groups = ["system:serviceaccounts", f"system:serviceaccounts:{sa[0]}"] + out_groups
    if username == "system:anonymous":
        if "system:unauthenticated" not in out_groups:
            out_groups.append("system:unauthenticated")
    elif "system:authenticated" not in out_groups and "system:unauthenticated" not in out_groups:
        # Asking for system:unauthenticated explicitly is honoured: then the user is not also authenticated.
        out_groups.append("system:authenticated")
    return UserInfo(username=username, groups=tuple(dict.fromkeys(out_groups)), uid=uids[0] if uids else "",
                    extra={k: tuple(v) for k, v in extras.items()})
