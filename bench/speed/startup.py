"""Wall time of the command line as a user meets it: help, listings, and predicting one photo.

    python -m bench.speed.startup --run runs/demo-... --photo ../shared/data/custom/04-pizza-dad.jpeg
    python -m bench.speed.startup --rounds 5            # without --run: help and listings only

Each command is a fresh process (what a user waits for, interpreter start included), run
`--rounds` times after one untimed warm-up (so the disk cache is warm); the table gives the median
and the range, and the modules each command loaded. Goals: help and listings under 1 s, predict of
one photo under 3 s on the project's 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROBE = (
    "import sys, runpy; sys.argv = ['foodvit'] + {argv!r}\n"
    "try:\n    runpy.run_module('foodvit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "print('LOADED ' + ','.join(m for m in ('torch', 'torchvision', 'matplotlib', 'timm') if m in sys.modules), "
    "file=sys.stderr)"
)


def timed(argv: list[str], rounds: int) -> dict:
    command = [sys.executable, "-m", "foodvit", *argv]
    subprocess.run(command, capture_output=True, check=False)  # warm-up
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if done.returncode not in (0,):
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    probe = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True)
    loaded = next((line[7:] for line in probe.stderr.splitlines() if line.startswith("LOADED ")), "?")
    return {
        "command": "foodvit " + " ".join(argv),
        "median": statistics.median(seconds),
        "min": min(seconds),
        "max": max(seconds),
        "loaded": loaded or "none of them",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a trained run directory, for the predict row")
    parser.add_argument("--photo", help="the photo to predict")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    commands = [["--help"], ["models"], ["recipes"], ["train", "--help"]]
    if args.run and args.photo:
        commands.append(["predict", args.run, args.photo])
    rows = [timed(argv, args.rounds) for argv in commands]
    width = max(len(r["command"]) for r in rows)
    print(f"{'command':<{width}}  median s  range s       heavy modules loaded")
    for r in rows:
        print(f"{r['command']:<{width}}  {r['median']:8.2f}  {r['min']:.2f}-{r['max']:.2f}     {r['loaded']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
