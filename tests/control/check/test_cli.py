"""`peering check` on the command line: kubectl finds it as a plugin (`kubectl peering check`, which is what
`d8 k peering check` runs), and bad flags exit 2 saying what to give, before anything is read."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from control import cli

BIN = pathlib.Path(sys.executable).parent


def test_kubectl_runs_the_plugin():
    plugin = BIN / "kubectl-peering"
    if not plugin.exists():
        pytest.fail("the kubectl-peering console script is not installed: run `make venv` (pyproject.toml declares "
                    "it)")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    listed = subprocess.run([str(BIN / "kubectl"), "plugin", "list"], capture_output=True, text=True, env=env,
                            timeout=30)
    assert str(plugin) in listed.stdout
    done = subprocess.run([str(BIN / "kubectl"), "peering", "check", "--help"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kubectl peering check")
    assert "--consumer NS/SA" in done.stdout and "-o {text,json}" in done.stdout


@pytest.mark.parametrize(("argv", "message"), [
    (["check", "--namespace", "x"], "--namespace goes with --consumer NS/SA"),
    (["check", "--capability", "c"], "--capability, --verb, --resource and --name go with --consumer NS/SA"),
    (["check", "--consumer", "ns/sa", "--capability", "c"], "--consumer needs --peer"),
    (["check", "--peer", "p", "--consumer", "ns/sa"], "--consumer needs --capability"),
    (["check", "--resolve", "nonsense"], "expected host=ip:port"),
])
def test_bad_flags_exit_2_with_what_to_give(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_a_failing_line(tmp_path, capsys):
    assert cli.main(["check", "--kubeconfig", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("✗ kubeconfig: [NoKubeconfig] cannot use kubeconfig") and "fix: give --kubeconfig" in out
