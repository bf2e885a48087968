"""The `bytemtp` command line: a thin click adapter over the `bytemtp` library."""
