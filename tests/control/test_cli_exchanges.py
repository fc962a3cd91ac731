"""The bound per peer on Dex exchanges as `peering run` takes it: flags (or PEERING_* variables) into the
gateway's Limits, and bad values refused with what to give."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from control import cli
from control.process import gateway_config
from gateway.config import Limits


def _limits(settings) -> Limits:
    kube = SimpleNamespace(credentials=lambda: SimpleNamespace(server="https://api.x.lab", ca_pem=None,
                                                               token=lambda: "t"))
    dex = SimpleNamespace(client_id=lambda: "id", client_secret=lambda: "s")
    return gateway_config(settings, kube, dex).limits


def _settings(*flags: str):
    return cli.settings_from(cli.parser().parse_args(["run", "--public-domain-template", "%s.x.lab", *flags]))


def test_the_bound_has_a_default_and_is_set_by_flag_or_environment(monkeypatch):
    limits = _limits(_settings())
    assert (limits.exchanges_per_peer_per_second, limits.exchange_burst_per_peer) == (20.0, 200.0)
    limits = _limits(_settings("--exchanges-per-peer", "2.5", "--exchange-burst-per-peer", "10"))
    assert (limits.exchanges_per_peer_per_second, limits.exchange_burst_per_peer) == (2.5, 10.0)
    monkeypatch.setenv("PEERING_EXCHANGES_PER_PEER", "0")
    assert _limits(_settings()).exchanges_per_peer_per_second == 0.0  # no bound


@pytest.mark.parametrize("flags, message", [
    (("--exchanges-per-peer", "-1"), "is not a rate; give exchanges a second"),
    (("--exchanges-per-peer", "many"), "is not a rate"),
    (("--exchange-burst-per-peer", "0.5"), "is not a burst; give 1 or more exchanges"),
])
def test_bad_values_say_what_to_give(flags, message, capsys):
    with pytest.raises(SystemExit):
        _settings(*flags)
    assert message in capsys.readouterr().err
