"""Flags into settings, the JSON log line, and the handler registry's NotReady answer."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from control import cli
from control.handlers.dispatch import Handlers
from control.process import write_ports_file
from gateway.protocol import JoinCall, PeerCall
from contract.errors import Refusal
from gateway.registry import Peer


def args(*extra):
    return cli.parser().parse_args(["run", *extra])


def test_flags_build_one_settings_object():
    s = cli.settings_from(args("--public-domain-template", "%s.a.lab", "--namespace", "ns", "--bind-host",
                               "127.0.0.1", "--entrance-port", "0", "--ops-port", "0", "--resolve",
                               "api.a.lab=127.0.0.1:1234", "--resolve", "dex.a.lab=127.0.0.1:99",
                               "--identity", "me", "--workers", "3", "--log-level", "debug"))
    assert s.entrance_host == "peering-gateway.a.lab"
    assert s.kube.namespace == "ns" and s.listen.bind_host == "127.0.0.1"
    assert s.listen.entrance_port == 0 and s.listen.ops_port == 0 and s.listen.join_port == 8080
    assert s.resolve == {"api.a.lab": "127.0.0.1:1234", "dex.a.lab": "127.0.0.1:99"}
    assert s.lease.identity == "me" and s.workers == 3 and s.log_level == "DEBUG"


def test_environment_supplies_flags(monkeypatch):
    monkeypatch.setenv("PEERING_PUBLIC_DOMAIN_TEMPLATE", "%s.env.lab")
    monkeypatch.setenv("PEERING_NAMESPACE", "from-env")
    s = cli.settings_from(args())
    assert s.join_host == "peering.env.lab" and s.kube.namespace == "from-env"
    assert cli.settings_from(args("--namespace", "flag")).kube.namespace == "flag"


@pytest.mark.parametrize("flags, message", [
    ((), "--public-domain-template is required"),
    (("--public-domain-template", "example.com"), "must contain %s"),
    (("--public-domain-template", "%s.x", "--resolve", "nonsense"), "expected host=ip:port"),
    (("--public-domain-template", "%s.x", "--dex-ca-file", "/nonexistent/ca.pem"), "no such file"),
])
def test_bad_flags_say_what_is_wrong(flags, message):
    with pytest.raises(ValueError, match=message):
        cli.settings_from(args(*flags))


def test_bad_port_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        args("--entrance-port", "70000")
    assert "0 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("variable, value, message", [
    ("PEERING_LOG_LEVEL", "chatty", "'chatty' is not a log level; give one of DEBUG, INFO, WARNING, ERROR"),
    ("PEERING_PEER_SYNC_INTERVAL", "soon", "'soon' is not a number of seconds"),
    ("PEERING_SELFCHECK_INTERVAL", "0", "'0' is not a number of seconds"),
])
def test_bad_environment_gets_the_usage_error_of_the_flag(monkeypatch, capsys, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        args("--public-domain-template", "%s.x")
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_version_subcommand_prints_the_version():
    out = subprocess.run([sys.executable, "-m", "control.cli", "version"], capture_output=True, text=True,
                         check=True, timeout=30)
    assert out.stdout.strip() == cli.version() and out.stdout.strip()[0].isdigit()


def test_run_without_a_template_exits_2_with_the_reason():
    out = subprocess.run([sys.executable, "-m", "control.cli", "run"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--public-domain-template is required" in out.stderr


def test_json_log_line_carries_extras_and_redacts_credential_names():
    record = logging.LogRecord("peering.x", logging.INFO, __file__, 1, "joined %s", ("b",), None)
    record.peer = "cluster-b"
    record.token = "eyJ-secret"
    record.client_secret = "s3cr3t"
    record.key = "ns/name"
    line = json.loads(cli.JsonFormatter().format(record))
    assert line["msg"] == "joined b" and line["level"] == "info" and line["peer"] == "cluster-b"
    assert line["token"] == line["client_secret"] == "<redacted>"
    assert "eyJ-secret" not in json.dumps(line) and "s3cr3t" not in json.dumps(line)
    assert line["key"] == "ns/name", "a work-queue key is not a credential"


def test_ports_file_is_written_whole(tmp_path):
    path = tmp_path / "ports.json"
    write_ports_file(str(path), {"entrance": 1, "join": 2, "egress": 3, "ops": 4})
    assert json.loads(path.read_text()) == {"entrance": 1, "join": 2, "egress": 3, "ops": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]


PEER = Peer(name="b", uuid="u", fingerprints=frozenset(), issuer_url=None, jwks_json=None, effective=frozenset(),
            connector_id="peering-b", entrance=None, peer_ca_pem=None, client_cert_pem=None, client_key_pem=None)


async def test_ops_without_a_handler_answer_not_ready_and_registered_ones_are_called():
    handlers = Handlers()
    with pytest.raises(Refusal) as err:
        await handlers.peer_call(PeerCall(peer=PEER, op="offer", body=None))
    assert (err.value.code, err.value.reason) == (503, "NotReady")
    with pytest.raises(Refusal) as err:
        await handlers.join(JoinCall(body={}, remote="127.0.0.1"))
    assert (err.value.code, err.value.reason) == (503, "NotReady")

    async def offer(call):
        return {"peer": call.peer.name}

    async def join(call):
        return {"joined": call.remote}

    handlers.add_peer_op("offer", offer)
    handlers.set_join(join)
    assert await handlers.peer_call(PeerCall(peer=PEER, op="offer", body=None)) == {"peer": "b"}
    assert await handlers.join(JoinCall(body={}, remote="r")) == {"joined": "r"}
    with pytest.raises(ValueError, match="already registered"):
        handlers.add_peer_op("offer", offer)
    with pytest.raises(ValueError, match="unknown peer operation"):
        handlers.add_peer_op("nonsense", offer)
