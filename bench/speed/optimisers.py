"""The optimiser step with fused kernels against foreach ones on the CPU, at the default recipe's parameter shapes
(the ViT's and the ResNet-18 teacher's), alternating; the two end at the same weights to float noise.

    OMP_NUM_THREADS=1 python -m bench.speed.optimisers --threads 1

Rows go to results/speed-optimisers.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench.results import record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torchvision

    from foodvit.model.build import build_model
    from foodvit.recipes import load_recipe

    torch.manual_seed(0)
    models = {
        "ViT (default recipe)": build_model(load_recipe("default"), 3)[0],
        "teacher (ResNet-18)": torchvision.models.resnet18(num_classes=3),
    }
    print("| parameters | optimiser | foreach ms | fused ms | ratio | max difference |\n|---|---|---:|---:|---:|---:|")
    for name, model in models.items():
        base = [p.detach() for p in model.parameters()]
        for cls, options in (
            (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.05}),
            (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
        ):
            params = {kind: [b.clone().requires_grad_(True) for b in base] for kind in ("foreach", "fused")}
            optimisers = {kind: cls(params[kind], **options, **{kind: True}) for kind in params}
            seconds: dict[str, list[float]] = {kind: [] for kind in params}
            for _ in range(args.steps):
                grads = [torch.randn_like(b) for b in base]
                for kind in params:
                    for p, g in zip(params[kind], grads, strict=True):
                        p.grad = g.clone()
                    started = time.perf_counter()
                    optimisers[kind].step()
                    seconds[kind].append(time.perf_counter() - started)
            a, b = (statistics.median(seconds[k]) * 1000 for k in ("foreach", "fused"))
            difference = max(
                (x - y).abs().max().item() for x, y in zip(params["foreach"], params["fused"], strict=True)
            )
            print(f"| {name} | {cls.__name__} | {a:.1f} | {b:.1f} | {a / b:.2f} | {difference:.2g} |")
            if not args.no_record:
                record(
                    "speed-optimisers",
                    {
                        "parameters": name,
                        "optimiser": cls.__name__,
                        "threads": args.threads,
                        "foreach_ms": round(a, 2),
                        "fused_ms": round(b, 2),
                        "ratio": round(a / b, 3),
                        "max_difference": f"{difference:.3g}",
                    },
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
