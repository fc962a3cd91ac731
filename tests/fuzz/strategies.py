"""What the fuzz properties share: their settings (a few hundred examples, derandomized so that a run is the same
everywhere) and strategies of the inputs a peer, a client or an upstream may send."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Every property: deterministic (derandomize), a few hundred examples, no deadline (the machine is shared).
FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: JSON values as json.loads returns them, lone surrogates and deep nesting included.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def splits(draw, data: bytes) -> list[bytes]:
    """`data` cut into pieces at arbitrary points (empty pieces included)."""
    if not data:
        return [b""]
    # Cuts anywhere, and cuts inside or next to line ends, where readers keep state between pieces.
    near_ends = sorted({min(len(data), max(0, i + d)) for i in range(len(data)) if data[i:i + 1] in (b"\r", b"\n")
                        for d in (0, 1, 2)})
    anywhere = st.integers(0, len(data))
    cut = st.one_of(anywhere, st.sampled_from(near_ends)) if near_ends else anywhere
    cuts = sorted(draw(st.lists(cut, max_size=8)))
    pieces, last = [], 0
    for cut in cuts:
        pieces.append(data[last:cut])
        last = cut
    pieces.append(data[last:])
    return pieces


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))
