"""accuracy benchmarks: run each as `python -m bench.accuracy.NAME` from the repository root."""
