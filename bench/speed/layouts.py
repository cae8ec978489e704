"""Channels-last against (B, C, H, W) rows for the default recipe's convolutions: the CNN teacher (ResNet-18)
and the ViT's conv stem, a training step (forward and backward) and an evaluation batch, alternating.

    OMP_NUM_THREADS=1 python -m bench.speed.layouts --threads 1 --rounds 5

The ratio is rows' seconds over channels-last's (median over rounds, the two timed in turn in each round),
the difference the largest between the two layouts' outputs (the same sums in another order: float noise).
Rows go to results/speed-layouts.csv.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from bench.results import record


def timed(step, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        step()
        out.append(time.perf_counter() - started)
    return out


def step_of(module: torch.nn.Module, images: torch.Tensor, train: bool):
    def step():
        module.train(train)
        if train:
            module(images).float().square().mean().backward()
            module.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                module(images)

    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=96, help="image side (default 96, the default recipe's)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torchvision

    from foodvit.model.stems import ConvStem

    torch.manual_seed(0)
    stem = ConvStem(3, 192, 8)
    teacher = torchvision.models.resnet18(num_classes=3)
    cases = {  # name: (rows, channels-last) modules
        "teacher (ResNet-18)": (teacher, copy.deepcopy(teacher).to(memory_format=torch.channels_last)),
        "ViT conv stem": (stem.layers, stem),  # the stem's own layers on rows; the stem converts to channels-last
    }
    print(
        "| module | pass | batch | rows s | channels-last s | ratio | max difference |\n"
        "|---|---|---:|---:|---:|---:|---:|"
    )
    for name, (rows, last) in cases.items():
        for train, batch in ((True, 32), (False, 64)):
            images = torch.randn(batch, 3, args.size, args.size)
            a, b = step_of(rows, images, train), step_of(last, images, train)
            a(), b()  # warm-up
            times_a, times_b = [], []
            for _ in range(args.rounds):
                times_a += timed(a, 1)
                times_b += timed(b, 1)
            rows.eval(), last.eval()
            with torch.no_grad():
                difference = (rows(images) - last(images)).abs().max().item()
            ta, tb = statistics.median(times_a), statistics.median(times_b)
            what = "train step" if train else "evaluation"
            print(f"| {name} | {what} | {batch} | {ta:.3f} | {tb:.3f} | {ta / tb:.2f} | {difference:.2g} |")
            if not args.no_record:
                record(
                    "speed-layouts",
                    {
                        "module": name,
                        "pass": what,
                        "batch": batch,
                        "size": args.size,
                        "threads": args.threads,
                        "rows_s": round(ta, 4),
                        "channels_last_s": round(tb, 4),
                        "ratio": round(ta / tb, 3),
                        "max_difference": f"{difference:.3g}",
                    },
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
