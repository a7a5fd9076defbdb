"""FLIP-158: changelog-based incremental checkpoints (DSTL, materialization, restore, truncation)."""
