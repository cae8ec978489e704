"""analysis benchmarks: run each as `python -m bench.analysis.NAME` from the repository root."""
