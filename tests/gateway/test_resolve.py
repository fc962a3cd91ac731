"""How an upstream's `host[:port]` is read, the same for the raw relay and the pooled client."""

import pytest

from gateway.resolve import split_authority


@pytest.mark.parametrize("authority, expected", [
    ("api.a.lab", ("api.a.lab", 443)),
    ("api.a.lab:6443", ("api.a.lab", 6443)),
    ("127.0.0.1:8443", ("127.0.0.1", 8443)),
    ("[::1]:8443", ("::1", 8443)),
    ("[::1]", ("::1", 443)),
])
def test_split_authority(authority, expected):
    assert split_authority(authority) == expected
