"""The copies of the contract documents in docs/spec/ are the documents themselves."""

from __future__ import annotations

import pytest

from chart_paths import COPY_SPEC_DIR, ORIGINAL_SPEC_DIR

NAMES = ("000_09d32f1c8e90d8df.txt", "001_607f3d4900661884.txt")


@pytest.mark.parametrize("name", NAMES)
def test_the_copy_in_the_repository_is_the_original(name: str) -> None:
    copy = (COPY_SPEC_DIR / name).read_bytes()
    original = ORIGINAL_SPEC_DIR / name
    if not original.is_file():
        pytest.skip(f"no original beside the repository at {original}; the copy is what the tests read")
    assert copy == original.read_bytes(), f"docs/spec/{name} differs from {original}: copy the original over it"
