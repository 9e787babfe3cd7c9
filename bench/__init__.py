"""Benchmark harness for the conversation memory service (``python -m bench --help``).

Not part of the test suite; a tiny run of it is (tests/integration/test_bench_smoke.py).
"""
