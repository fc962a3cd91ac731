"""The gateway's fixtures live in `tests.gateway.support`, so that tests import its helpers by name; this file
only makes them visible to pytest."""

from tests.gateway.support import dex, gateway, handlers, issuer_key, pki, session_for, upstream  # noqa: F401


def pytest_asyncio_loop_factories(config, item):
    """The TLS layer's own tests run on both event loops the gateway can run on; the rest on asyncio's."""
    import asyncio

    if item.module is not None and item.module.__name__.endswith(".test_tlsstream"):
        import uvloop
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
