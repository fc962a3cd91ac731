"""Shared types between the API server emulator's core and its authentication/authorization code."""

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attributes:
    """What a request wants, as kube-apiserver's authorizer sees it."""

    verb: str  # get list watch create update patch delete deletecollection, or http verb lower-case for non-resource
    resource_request: bool
    api_group: str = ""  # "" is the core group
    resource: str = ""  # plural
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""  # for non-resource requests


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""
    missing_role: str = ""   # a binding write refused because the role it names does not exist


# The core gives the auth code read access to stored objects through this callable:
# list_objects(api_group, plural, namespace_or_None) -> iterable of object dicts (as stored, never masked).
ListObjects = Callable[[str, str, "str | None"], Iterable[dict]]
