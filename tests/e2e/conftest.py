"""Fixtures of the two-cluster tests. The guide scenario's live in guide_helpers.py; they are registered here so
that its tests can ask for them by name."""

from __future__ import annotations

from guide_helpers import demo_apiserver, guide_lab, guide_story, transitions  # noqa: F401  (fixtures)
