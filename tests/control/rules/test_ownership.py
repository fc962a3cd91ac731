"""Labels, owner references and bounded names shared by everything the module writes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.rules import ownership

LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@pytest.mark.parametrize("text", ["cluster-b", "a", "a.b_c-d", "x" * 63])
def test_valid_label_values_pass_unchanged(text):
    assert ownership.label_value(text) == text


@settings(deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_any_text_becomes_a_valid_label_value(text):
    v = ownership.label_value(text)
    assert len(v) <= 63 and LABEL_VALUE.match(v)


def test_long_values_stay_distinct():
    assert ownership.label_value("a" * 64 + "1") != ownership.label_value("a" * 64 + "2")


def test_bounded_name():
    assert ownership.bounded_name("short") == "short"
    long = ownership.bounded_name("n" * 300)
    assert len(long) == 253 and long != ownership.bounded_name("n" * 301)


def test_owner_reference_and_selector():
    cp = {"metadata": {"name": "cluster-b", "uid": "u1"}}
    assert ownership.owner_reference(cp)["uid"] == "u1"
    with pytest.raises(ValueError, match="uid"):
        ownership.owner_reference({"metadata": {"name": "x"}})
    assert ownership.selector("cluster-b") == (
        "app.kubernetes.io/managed-by=peering,peering.deckhouse.io/clusterpeer=cluster-b"
    )
    obj = {"metadata": {"labels": ownership.labels("cluster-b", "cap")}}
    assert ownership.belongs_to(obj, "cluster-b") and not ownership.belongs_to(obj, "cluster-c")
