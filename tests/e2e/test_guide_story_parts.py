"""The pieces of the guide story that need no cluster: reading kubectl tables, the expired string, what a failed
step says, and the launcher that ties a peering process to the demo's life."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest

from control import connstring, pki
from lab.demo import LAUNCHER, StepFailed, expired_copy, join_manifest, parse_table, shorten


def test_a_table_is_cut_where_the_header_names_start_so_empty_cells_stay_empty():
    text = ("NAME        PHASE     READY   EFFECTIVE               AGE\n"
            "cluster-b   Pending           []                      1s\n"
            "cluster-c   Active    True    [\"mirror-configmaps\"]   3m\n")
    rows = parse_table(text)
    assert rows[0] == {"NAME": "cluster-b", "PHASE": "Pending", "READY": "", "EFFECTIVE": "[]", "AGE": "1s"}
    assert rows[1]["READY"] == "True" and rows[1]["EFFECTIVE"] == '["mirror-configmaps"]'
    assert parse_table("") == []


def _string(expires_in: datetime.timedelta) -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    pin = pki.spki_pin(pki.create_ca("a", now=now).cert_pem)
    return connstring.encode(connstring.Invitation(
        cluster_uuid="0b7f4f0e-4c2b-4d43-9a8e-2d6f0f6f5a11", join_url="https://peering.a.lab",
        entrance_host="peering-gateway.a.lab", ca_pin=pin, token_id="abcd1234",
        token_secret="s" * 43, expires_at=datetime.datetime.now(datetime.timezone.utc) + expires_in))


def test_the_expired_copy_is_the_same_invitation_refused_as_expired_before_anything_is_sent():
    fresh = _string(datetime.timedelta(hours=1))
    stale = expired_copy(fresh)
    now = datetime.datetime.now(datetime.timezone.utc)
    with pytest.raises(connstring.ConnectionStringError) as e:
        connstring.decode(stale, now=now)
    assert e.value.reason == "Expired"
    a = connstring.decode(fresh, now=now)
    b = connstring.decode(stale, now=now - datetime.timedelta(hours=2))
    assert (a.cluster_uuid, a.token, a.ca_pin, a.join_url) == (b.cluster_uuid, b.token, b.ca_pin, b.join_url)
    assert b.expires_at < now


def test_the_one_time_string_is_never_shown_whole():
    text = _string(datetime.timedelta(hours=1))
    shown = shorten(text)
    assert text not in shown and text.split(".")[1][:20] not in shown
    assert str(len(text)) in shown
    manifest = join_manifest("cluster-a", shown)
    assert text not in manifest


def test_a_failed_step_names_the_step_the_command_what_was_expected_and_what_came_back():
    e = StepFailed("step 2: Cluster b joins", "b$ kubectl get clusterpeers", "PHASE Active", "PHASE Pending")
    text = str(e)
    for part in ("step 2: Cluster b joins", "b$ kubectl get clusterpeers", "expected: PHASE Active",
                 "got:      PHASE Pending"):
        assert part in text


def test_the_launcher_becomes_the_command_with_the_extra_environment():
    probe = "import os; print(os.getpid(), os.environ['PEERING_PEER_SYNC_INTERVAL'], os.environ.get('KEEP'))"
    child = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(os.getpid()), "PEERING_PEER_SYNC_INTERVAL=1",
                              "--", sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, KEEP="yes"))
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    # The same process (exec, not a child): signals and PR_SET_PDEATHSIG reach the peering process itself.
    assert out.split() == [str(child.pid), "1", "yes"]


def test_the_launcher_refuses_to_start_for_a_parent_that_is_gone():
    done = subprocess.run([sys.executable, "-c", LAUNCHER, "1", "--", sys.executable, "-c", "print('ran')"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "is gone" in done.stderr
