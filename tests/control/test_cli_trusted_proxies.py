"""The trusted proxies of the join listener as `peering run` takes them: flags (or PEERING_TRUSTED_PROXIES) into
the gateway's config, and a value that is no address refused with what to give."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from control import cli
from control.process import gateway_config


def _config(settings):
    kube = SimpleNamespace(credentials=lambda: SimpleNamespace(server="https://api.x.lab", ca_pem=None,
                                                               token=lambda: "t"))
    dex = SimpleNamespace(client_id=lambda: "id", client_secret=lambda: "s")
    return gateway_config(settings, kube, dex)


def _settings(*flags: str):
    return cli.settings_from(cli.parser().parse_args(["run", "--public-domain-template", "%s.x.lab", *flags]))


def test_none_by_default_and_set_by_flag_or_environment(monkeypatch):
    monkeypatch.delenv("PEERING_TRUSTED_PROXIES", raising=False)
    assert _config(_settings()).trusted_proxies == ()
    assert _config(_settings("--trusted-proxy", "10.111.0.0/16", "--trusted-proxy", "fd00::1")).trusted_proxies \
        == ("10.111.0.0/16", "fd00::1/128")
    monkeypatch.setenv("PEERING_TRUSTED_PROXIES", "10.111.0.0/16, 192.168.3.4")
    assert _config(_settings()).trusted_proxies == ("10.111.0.0/16", "192.168.3.4/32")
    assert _config(_settings("--trusted-proxy", "10.0.0.1")).trusted_proxies == ("10.0.0.1/32",)  # flags win


def test_a_value_that_is_no_address_says_what_to_give(capsys, monkeypatch):
    monkeypatch.delenv("PEERING_TRUSTED_PROXIES", raising=False)
    with pytest.raises(SystemExit):
        _settings("--trusted-proxy", "ingress-nginx")
    assert "'ingress-nginx' is not an IP address or CIDR" in capsys.readouterr().err


def test_a_bad_environment_value_says_which_variable(monkeypatch):
    monkeypatch.setenv("PEERING_TRUSTED_PROXIES", "10.0.0.0/8,nginx")
    with pytest.raises(SystemExit, match="PEERING_TRUSTED_PROXIES: 'nginx' is not an IP address or CIDR"):
        _settings()
