"""Benchmark models and harnesses for tvm-taso (not tests; run as ``python -m benchmarks.<name>``)."""
