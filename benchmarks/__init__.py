"""vase_triton benchmark suites (pytest-benchmark), their shape registry and the report generator.

    python -m pytest benchmarks --benchmark-json results.json    # run the suites
    python -m benchmarks.report results.json --out report/       # markdown + PNG report
"""
