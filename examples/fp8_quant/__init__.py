"""A user's fp8 (e4m3fn) per-block quantise/dequantise pair checked against its own op definitions."""
