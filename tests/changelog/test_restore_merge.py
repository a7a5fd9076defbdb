"""Merging a key group's log into its materialized frame on restore (``changelog.restore._merged``): against a
dict model, for sorted frames (an lmdb table's: the merged one stays in key order) and unsorted ones (a heap
table's), with keys the log replaces and keys it adds; the digest equals the merged key group's own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spate.changelog.restore import MaterializedFrame, _merged
from spate.state.layout import U16
from spate.state.lmdb_digest import key_group_digest

flat_keys = st.binary(min_size=3, max_size=6).map(lambda b: b"\x00\x01" + b)
values = st.binary(max_size=6)


@settings(max_examples=300, deadline=None)
@given(frame=st.dictionaries(flat_keys, values, max_size=30), puts=st.dictionaries(flat_keys, values, max_size=12),
       existing=st.lists(st.tuples(st.integers(0, 29), values), max_size=8), ordered=st.booleans(),
       kg=st.integers(0, 127))
def test_the_merged_frame_is_the_frame_updated_by_the_log_in_key_order(frame, puts, existing, ordered, kg):
    keys = sorted(frame) if ordered else list(frame)
    for i, value in existing:  # puts of keys the frame holds
        if keys:
            puts[keys[i % len(keys)]] = value
    flat = [part for key in keys for part in (key, frame[key])]
    prefix = U16.pack(kg)
    digest = key_group_digest(prefix, keys, [frame[k] for k in keys])
    merged = _merged(kg, MaterializedFrame(flat, frozenset(), digest), dict(puts))
    expected = sorted({**frame, **puts}.items())
    if ordered:  # in key order, to be appended
        assert merged.flat == [part for entry in expected for part in entry]
    else:
        assert sorted(zip(merged.flat[0::2], merged.flat[1::2], strict=True)) == expected
    assert merged.digest == key_group_digest(prefix, [k for k, _ in expected], [v for _, v in expected])
    assert flat == [part for key in keys for part in (key, frame[key])]  # the frame itself is left as it was


def test_without_a_carried_digest_none_is_passed_on():
    merged = _merged(3, MaterializedFrame([b"\x00\x01a", b"1"], frozenset(), None), {b"\x00\x01b": b"2"})
    assert merged.digest is None
    assert merged.flat == [b"\x00\x01a", b"1", b"\x00\x01b", b"2"]
