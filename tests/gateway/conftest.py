"""The gateway's fixtures live in `gw_support` (a uniquely named module, so that tests import its helpers without
the ambiguity of several conftest.py files on one path); this file only makes them visible to pytest."""

from gw_support import dex, gateway, handlers, issuer_key, pki, session_for, upstream  # noqa: F401
