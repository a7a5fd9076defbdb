"""The cache of verified checkpoint-file spans is bounded and owned by the worker's services."""

from __future__ import annotations

from spate.runtime.services import WorkerServices
from spate.snapshot.verify import VerifiedSpans


def test_verified_spans_are_bounded_least_recently_used_first():
    spans = VerifiedSpans(capacity=2)
    a, b, c = ("a", 0, 0, 1), ("b", 0, 0, 1), ("c", 0, 0, 1)
    spans.add(a)
    spans.add(b)
    assert a in spans  # a is now the most recently used
    spans.add(c)
    assert len(spans) == 2 and a in spans and c in spans and b not in spans


def test_verified_spans_belong_to_one_owner_of_one_root(tmp_path):
    root, savepoint = str(tmp_path / "root"), str(tmp_path / "savepoint")
    first, second = WorkerServices(root), WorkerServices(root)
    first.verified_spans(root).add(("p", 0, 0, 1))
    assert ("p", 0, 0, 1) in first.verified_spans(root)
    assert ("p", 0, 0, 1) not in first.verified_spans(savepoint), "the same path in another root is another file"
    assert ("p", 0, 0, 1) not in second.verified_spans(root), "a later owner of the root starts afresh"
    first.close()
    second.close()
