"""A batch that failed on an executor, told first: Spark's error carries the Python worker's traceback at the end
of kilobytes of JVM stack and Py4J text. :func:`worker_error` finds the worker's own exception (its type, message
and notes: spate's processor errors name the key, batch and subtask), and :class:`BatchFailedError` puts it in
front, with Spark's error after it."""

from __future__ import annotations

from spate.errors import SpateError

_TRACEBACK = "Traceback (most recent call last):"


class BatchFailedError(SpateError):
    """A micro-batch's subtask failed on an executor: the worker's exception first, then Spark's error."""


def worker_error(text: str) -> str | None:
    """The last Python exception in ``text`` (``Type: message`` and the lines that follow it, such as its
    notes) without its stack, or None if ``text`` holds no Python traceback."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    found: list[str] = []
    for line in text[start + len(_TRACEBACK):].splitlines():
        if not found:
            if line.strip() and not line.startswith((" ", "\t")):  # past the frames: the exception line
                found.append(line)
        elif not line.strip() or line.lstrip().startswith("at "):  # the end, or the JVM's stack
            break
        else:
            found.append(line)
    return "\n".join(found) or None


def batch_failed(batch_id: int, error: Exception) -> BatchFailedError | None:
    """The error to raise for batch ``batch_id``'s job failing with ``error``, None if it holds no worker
    exception (e.g. the driver's own)."""
    text = str(error)
    summary = worker_error(text)
    if summary is None:
        return None
    return BatchFailedError(f"batch {batch_id} failed on an executor: {summary}\n\nSpark's error:\n{text}")
