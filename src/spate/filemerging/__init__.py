"""FLIP-306 file merging: logical checkpoint files are segments of few, pooled physical files."""
