"""State primitives (keyed and operator state) and the tables that hold them."""
