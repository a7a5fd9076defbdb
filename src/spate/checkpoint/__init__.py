"""Driver side: coordinator, metadata, shared-state registry, retention, savepoints, state assignment."""
