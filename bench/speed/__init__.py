"""speed benchmarks: run each as `python -m bench.speed.NAME` from the repository root."""
