"""Engine-agnostic runtime: the processor API, the subtask, and the in-process runner."""
