"""State handles and full snapshots: keyed state indexed by key group, and operator state by element."""
