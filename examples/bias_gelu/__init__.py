"""A user's fused bias + GELU epilogue checked against its own op definition."""
