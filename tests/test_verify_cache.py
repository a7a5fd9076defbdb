"""The cache of verified checkpoint-file spans is bounded and owned by whoever holds the storage."""

from __future__ import annotations

from spate.fs import CheckpointStorage
from spate.snapshot.verify import VerifiedSpans


def test_verified_spans_are_bounded_least_recently_used_first():
    spans = VerifiedSpans(capacity=2)
    a, b, c = ("a", 0, 0, 1), ("b", 0, 0, 1), ("c", 0, 0, 1)
    spans.add(a)
    spans.add(b)
    assert a in spans  # a is now the most recently used
    spans.add(c)
    assert len(spans) == 2 and a in spans and c in spans and b not in spans


def test_verified_spans_belong_to_one_storage_object(tmp_path):
    first, second = CheckpointStorage(str(tmp_path)), CheckpointStorage(str(tmp_path))
    VerifiedSpans.of(first).add(("p", 0, 0, 1))
    assert ("p", 0, 0, 1) in VerifiedSpans.of(first)
    assert ("p", 0, 0, 1) not in VerifiedSpans.of(second), "a later owner of the root starts afresh"
