"""A user's tiled matmul (and its split-K variant) checked against its own op definition."""
