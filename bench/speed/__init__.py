"""speed benchmarks: run each as `python -m bench.speed.NAME` from the repository root."""

import json
import os

# the photos a speed benchmark trains on unless told otherwise: $FOODVIT_DATA, else the shared FoodVision Mini
DATA = os.environ.get("FOODVIT_DATA", "/work/shared/data/pizza_steak_sushi")


def settings(items: list[str]) -> dict:
    """The KEY=VALUE items of a benchmark's --set option as settings over a recipe, each value read as JSON where it
    parses (train.compile=true, data.workers=1) and kept as text where it does not (data.augment=medium)."""
    values: dict = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            values[key] = json.loads(value)
        except json.JSONDecodeError:
            values[key] = value
    return values
