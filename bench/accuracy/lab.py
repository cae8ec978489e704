"""A recipe laboratory for a lent GPU: many `foodvit cv` studies at once, their fold
runs taken from one queue by N processes until a deadline, then each variant paired with the first
(the default) photo by photo over the folds both finished, seed by seed and pooled over the seeds.

    python -m bench.accuracy.lab --data DATA --out /tmp/lab --processes 14 --launch-for 380 --stop-at 520 \\
        --seeds 0 1 2 --variant default= --variant scale05='--scale-min 0.5' [--pack results.tar.gz] [-- CV OPTIONS]

Each variant is `NAME=OPTIONS` (options of `foodvit cv`, empty for the recipe as it is); its study for
seed S is OUT/NAME-sS. The queue runs seed by seed, fold by fold, variant by variant, so a deadline
leaves the same folds of every variant to pair, rather than every fold of a few. Nothing is launched
after --launch-for seconds, nor once the fold runs so far say it would not end by --stop-at; runs still
going at --stop-at are stopped (their folds are simply missing). Each fold run trains its own CNN
teacher: the variants' runs of a fold start together, before the default's teacher exists to lend.
--pack writes the studies' fold results and logs (no checkpoints) to a .tar.gz, every minute and at
the end, for the device tool's $OUT. A lease is short: one call, e.g.

    python -m bench.accuracy.lab --data .gpudata/pizza_steak_sushi --out /tmp/lab --pack $OUT/lab.tar.gz ... -- --no-amp

with the data copied into an ignored folder of the checkout and named in the call's carry. Results on a
GPU are a laboratory's: a change it finds is judged again on the CPU under the CV protocol.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from foodvit.tuning.compare import compare_line, finished_folds, paired

ROOT = Path(__file__).resolve().parents[2]


def variant(text: str) -> tuple[str, list[str]]:
    name, sep, options = text.partition("=")
    if not sep or not name.replace("-", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected NAME=OPTIONS (a name of letters, digits, - and _), got {text!r}")
    return name, shlex.split(options)


def pack(out: Path, target: Path) -> None:
    part = target.with_name(target.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if (
                path.is_file()
                and path.suffix in (".json", ".md", ".log")
                and "folds" not in path.relative_to(out).parts
            ):
                tar.add(path, arcname=str(path.relative_to(out)))
    part.replace(target)


def pairings(out: Path, names: list[str], seeds: list[int]) -> list[str]:
    """Each variant against the first over the folds both finished: seed by seed, then pooled over the seeds."""

    def folds(
        name: str,
    ) -> dict[tuple[int, int], dict[str, bool]]:  # (seed, fold) -> each held-out photo right or wrong
        studies = [out / f"{name}-s{seed}" for seed in seeds]
        return {
            key: right
            for study in studies
            if (study / "study.json").is_file()
            for key, right in finished_folds(study).items()
        }

    base, lines = folds(names[0]), []
    for name in names[1:]:
        other = folds(name)
        both = sorted(base.keys() & other.keys())
        groups = [([key for key in both if key[0] == seed], f"seed {seed}") for seed in seeds]
        for keys, label in groups + ([(both, "seeds pooled")] if len(seeds) > 1 else []):
            if not keys:
                lines.append(f"{name} - {names[0]}, {label}: no finished fold in common")
                continue
            result = paired(
                {p: r for key in keys for p, r in base[key].items()},
                {p: r for key in keys for p, r in other[key].items()},
            )
            lines.append(compare_line(result, names[0], name, f" of the {len(keys)} folds both finished, {label}"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        epilog="Options after -- go to every `foodvit cv` run (e.g. -- --no-amp).",
    )
    parser.add_argument(
        "--data", required=True, help="the photos (a folder holding train/ and test/, each with a folder per class)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="the folder of the studies (OUT/NAME-sSEED) and their logs"
    )
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        required=True,
        help="NAME=OPTIONS of `foodvit cv`, again for each; the first is the one the others are paired with",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--launch-for", type=float, default=float("inf"), help="seconds after which nothing new starts")
    parser.add_argument(
        "--stop-at", type=float, default=float("inf"), help="seconds after which running folds are stopped"
    )
    parser.add_argument("--pack", type=Path, help="a .tar.gz of the fold results and logs, rewritten every minute")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    start = time.time()
    variants = dict(args.variant)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )
    queue = [(s, v, k) for s in args.seeds for k in range(args.folds) for v in variants]
    running: dict[subprocess.Popen, tuple[str, int, float, object]] = {}
    took: list[float] = []  # seconds of each finished fold run
    failed = 0
    packed = time.time()

    def say(text: str) -> None:
        print(f"[{time.time() - start:6.0f} s] {text}", flush=True)

    while queue or running:
        elapsed = time.time() - start
        typical = statistics.median(took) if took else 0.0
        if queue and (elapsed >= min(args.launch_for, args.stop_at) or elapsed + typical > args.stop_at):
            say(f"launch window over: {len(queue)} fold runs not started")
            queue.clear()
        while queue and len(running) < args.processes:
            seed, name, fold = queue.pop(0)
            study = f"{name}-s{seed}"
            command = [
                sys.executable,
                "-m",
                "foodvit",
                "cv",
                "--seed",
                str(seed),
                "--folds",
                str(args.folds),
                "--eval-every",
                "100",
                "--data",
                args.data,
                "--out",
                str(args.out / study),
                "--quiet",
                "--fold",
                str(fold),
                *variants[name],
                *extra,
            ]
            log = open(logs / f"{study}-fold-{fold}.log", "w")
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            running[process] = (study, fold, time.time(), log)
        for process in list(running):
            if process.poll() is not None:
                study, fold, began, log = running.pop(process)
                log.close()
                ok = process.returncode == 0
                if ok:
                    took.append(time.time() - began)
                failed += not ok
                tail = "" if ok else "\n" + (logs / f"{study}-fold-{fold}.log").read_text()[-1500:]
                say(f"{study} fold {fold}: rc {process.returncode}, {time.time() - began:.0f} s{tail}")
        if failed >= 3 and not took:
            say("three fold runs failed before any finished: stopping")
            queue.clear()
            args.stop_at = 0
        if time.time() - start >= args.stop_at and running:
            say(f"stop: {len(running)} fold runs stopped unfinished")
            for process, (_, _, _, log) in running.items():
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                log.close()
            running.clear()
        if args.pack and time.time() - packed > 60:
            pack(args.out, args.pack)
            packed = time.time()
        time.sleep(0.5)
    if args.pack:
        pack(args.out, args.pack)
    say(f"{len(took)} fold runs finished, {failed} failed")
    for study in sorted(p for p in args.out.iterdir() if (p / "study.json").is_file()):
        folds = finished_folds(study)
        right = sum(sum(f.values()) for f in folds.values())
        photos = sum(len(f) for f in folds.values())
        say(f"{study.name}: {len(folds)} folds, {right} of {photos} right")
    for line in pairings(args.out, list(variants), args.seeds):
        say(line)


if __name__ == "__main__":
    main()
