"""Where the default recipe's training time goes: one short training under PyTorch's profiler, its time split
into phases, with the machine's matrix-product ceiling measured in the same run and the train step's MFU.

    OMP_NUM_THREADS=1 python -m bench.speed.phases --epochs 3 --threads 1
    python -m bench.speed.phases --epochs 3 --threads 2 --set train.compile=true

The run is the recipe as `foodvit train` runs it (teacher first, then the ViT), only shorter (--epochs; the
teacher trains for as many, progressive resizing keeps its share of the epochs). The phases are measured from
outside the library: `record_function` ranges opened around its functions and modules (the CNN teacher's
training, the ViT's forward pass with the teacher's forward passes and each auxiliary head inside it, the
backward pass, the optimiser step with gradient clipping, the loaders, evaluation, checkpoints), and each
instant of the profile is given to the innermost range open then, so the shares add up to the wall time.
The backward pass is one range: the auxiliary heads' backward is inside it. With --set train.compile=true
the compiled forward is one range, the teacher's forward passes and the heads inside it, and its first
steps include the compilation.

MFU = the step's model FLOPs (counted from the shapes by torch.utils.flop_counter, forward and backward,
the teacher's forward passes included) / the step's seconds (forward, backward, optimiser) / the ceiling:
the best fp32 matrix product GFLOP/s at the ViT's own shapes on the run's threads, measured before and after the
run (the better of the two; a warning when they differ, as on a machine shared with other work). On a CPU that
multiplies bf16 natively the training steps run under bf16 autocast (--amp, on by default), faster than that fp32
ceiling allows: MFU there is a fraction of the fp32 ceiling and may pass 1; --set train.amp=false measures float32.
Rows go to results/speed-phases.csv, a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from bench.results import record
from bench.speed import DATA, settings

OTHER = "other (setup, loop, resizing, logging)"
TEACHER = "teacher training"
STEP = (  # the phases of a train step, in the table's order
    "forward",
    "teacher forward (guidance)",
    "head: drloc",
    "head: masked",
    "head: guidance adapters",
    "backward",
    "optimiser (clip, step)",
)
ORDER = (
    *STEP,
    "data loading and augmentation",
    "evaluation",
    "checkpoints and metrics",
    "final test and report",
    "setup",
)

# ------------------------------------------------------------------------------------ the machine's ceiling


def matmul_gflops(m: int, k: int, n: int, threads: int, seconds: float = 0.4) -> float:
    """fp32 GFLOP/s of (m, k) @ (k, n) on `threads` threads: the best of a few timed rounds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        best = 0.0
        for _ in range(3):
            count, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds / 3:
                a @ b
                count += 1
            best = max(best, 2 * m * k * n * count / elapsed / 1e9)
        return best
    finally:
        torch.set_num_threads(previous)


def model_shapes(config, batch: int) -> list[tuple[int, int, int]]:
    """The ViT's matrix products at its own resolution: tokens x width times width x (3 width, 4 width), and back."""
    vit = config.vit
    width = {"Ti": 192, "S": 384, "B": 768}.get(config.model.split("-")[1].split("/")[0], 192)
    patch = int(config.model.split("/")[1]) if "/" in config.model else 16
    tokens = batch * ((vit.image_size or 224) // patch) ** 2
    return [(tokens, width, 3 * width), (tokens, width, 4 * width), (tokens, 4 * width, width)]


def ceiling(config, batch: int, threads: list[int]) -> dict[int, float]:
    """The best GFLOP/s over the model's shapes, per thread count."""
    return {t: max(matmul_gflops(*shape, threads=t) for shape in model_shapes(config, batch)) for t in threads}


# ------------------------------------------------------------------------------------ ranges from outside


class Ranges:
    """record_function ranges opened around library functions and modules for one run, undone by close()."""

    def __init__(self) -> None:
        self.undo: list = []
        self.trainer = None

    def wrap_everywhere(self, module_name: str, name: str, label: str) -> None:
        """Wrap the function `module_name.name` in a range, in every foodvit module that holds it by that name."""
        import importlib

        try:
            original = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            print(f"phases: {module_name}.{name} not found; its time counts as '{OTHER}'", file=sys.stderr)
            return

        def wrapped(*args, **kwargs):
            with record_function(label):
                return original(*args, **kwargs)

        for mod in list(sys.modules.values()):
            if (getattr(mod, "__name__", "") or "").startswith("foodvit") and getattr(mod, name, None) is original:
                setattr(mod, name, wrapped)
                self.undo.append(lambda mod=mod: setattr(mod, name, original))

    def wrap_attribute(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            with record_function(label):
                return original(*args, **kwargs)

        setattr(owner, name, wrapped)
        self.undo.append(lambda: setattr(owner, name, original))

    def built_with_range(self, module_name: str, name: str, label: str) -> None:
        """Every module the function `module_name.name` builds gets a range around its training-mode forward."""
        import importlib

        original = getattr(importlib.import_module(module_name), name, None)
        if original is None:
            print(f"phases: {module_name}.{name} not found; the modules it builds are not timed apart", file=sys.stderr)
            return

        def built(*args, **kwargs):
            module = original(*args, **kwargs)
            self.around_module(module, label, training_only=True)
            return module

        for mod in list(sys.modules.values()):
            if (getattr(mod, "__name__", "") or "").startswith("foodvit") and getattr(mod, name, None) is original:
                setattr(mod, name, built)
                self.undo.append(lambda mod=mod: setattr(mod, name, original))

    def around_module(self, module: torch.nn.Module, label: str, training_only: bool = False) -> None:
        """A range around every forward call of `module` (in training mode only, if asked)."""
        opened: list = []

        def before(mod, args):
            if not (training_only and not mod.training):
                opened.append(record_function(label).__enter__())
            else:
                opened.append(None)

        def after(mod, args, out):
            rf = opened.pop()
            if rf is not None:
                rf.__exit__(None, None, None)

        self.undo += [module.register_forward_pre_hook(before).remove, module.register_forward_hook(after).remove]

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        import foodvit.training.trainer as trainer_module
        from foodvit.training.teacher import Teacher

        ranges = self
        self._open: list = []
        self.wrap_everywhere("foodvit.training.teacher", "obtain_teacher", TEACHER)
        self.built_with_range("foodvit.training.teacher", "build_teacher", "forward")
        for forward in ("feature_maps", "logits"):  # the objectives' passes of the frozen teacher (as before)
            self.wrap_attribute(Teacher, forward, "teacher forward (guidance)")
        self.wrap_everywhere("foodvit.training.objectives.guidance", "matching_loss", "head: guidance adapters")
        self.wrap_everywhere("foodvit.training.objectives.masked", "patch_pixels", "head: masked")
        self.wrap_everywhere("foodvit.training.engine", "evaluate", "evaluation")
        self.wrap_everywhere("foodvit.rundir.directory", "save_checkpoint", "checkpoints and metrics")
        self.wrap_everywhere("foodvit.rundir.directory", "write_metrics", "checkpoints and metrics")
        self.wrap_attribute(torch.Tensor, "backward", "backward")
        self.wrap_attribute(torch.nn.utils, "clip_grad_norm_", "optimiser (clip, step)")
        self.wrap_attribute(trainer_module.Trainer, "_final_test", "final test and report")
        self.wrap_attribute(trainer_module.Trainer, "__init__", "setup")
        step_pre = register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: self._open.append(record_function("optimiser (clip, step)").__enter__())
        )
        step_post = register_optimizer_step_post_hook(
            lambda opt, args, kwargs: self._open.pop().__exit__(None, None, None)
        )
        self.undo += [step_pre.remove, step_post.remove]
        fit = trainer_module.Trainer.fit

        def fit_with_ranges(trainer):
            ranges.trainer = trainer
            if trainer.config.train.compile:  # ranges inside a compiled graph are dropped: the step's forward as one
                ranges.around_module(trainer.step_model, "forward", training_only=True)
                return fit(trainer)
            ranges.around_module(trainer.trained, "forward", training_only=True)
            for module in trainer.trained.modules():  # the objectives' heads, found by what they hold
                if type(module).__name__ == "DenseRelativeLocalization":
                    ranges.around_module(module, "head: drloc")
                elif hasattr(module, "mask_token") and hasattr(module, "decoder"):
                    ranges.around_module(module.decoder, "head: masked")
                elif isinstance(getattr(module, "adapters", None), torch.nn.ModuleList):
                    for adapter in module.adapters:
                        ranges.around_module(adapter, "head: guidance adapters")
            return fit(trainer)

        trainer_module.Trainer.fit = fit_with_ranges
        self.undo.append(lambda: setattr(trainer_module.Trainer, "fit", fit))

    def close(self) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


# ------------------------------------------------------------------------------------ the profile's phases


def phase_of(name: str) -> str | None:
    """The phase a profiled range stands for (the loaders' own ranges are PyTorch's), or None for an operator."""
    if name.startswith("enumerate(DataLoader)"):
        return "data loading and augmentation"
    if name in ORDER or name == TEACHER:
        return name
    return None


def exclusive_seconds(intervals: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Seconds per label, each instant of [start, end] given to the innermost interval open then (intervals nest:
    one thread), a label inside the teacher's training prefixed 'teacher: '; the rest to OTHER. Times in µs."""
    totals: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, str]] = []
    now = start

    def label() -> str:
        if not stack:
            return OTHER
        inner = stack[-1][1]
        in_teacher = any(name == TEACHER for _, name in stack)
        if inner == TEACHER:
            return "teacher: " + OTHER
        return ("teacher: " if in_teacher else "") + inner

    def advance(to: float) -> None:
        nonlocal now
        if to > now:
            totals[label()] += to - now
            now = to

    for s, e, name in sorted(intervals, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][0] <= s:
            advance(stack[-1][0])
            stack.pop()
        advance(s)
        stack.append((min(e, stack[-1][0]) if stack else e, name))
    while stack:
        advance(stack[-1][0])
        stack.pop()
    advance(end)
    return {k: v / 1e6 for k, v in totals.items()}


# ------------------------------------------------------------------------------------ FLOPs of a step


def step_flops(module: torch.nn.Module, size: int, batch: int, num_classes: int) -> float:
    """FLOPs of one training step's forward and backward of `module` (training mode) on a batch at `size` px."""
    from torch.utils.flop_counter import FlopCounterMode

    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(num_classes, (batch,))
    was = module.training
    module.train()
    try:
        with FlopCounterMode(display=False) as counter, torch.random.fork_rng():
            out = module(images)
            logits, extra = out if isinstance(out, tuple) else (out, None)
            loss = torch.nn.functional.cross_entropy(logits, labels) + (extra if extra is not None else 0)
            loss.backward()
        module.zero_grad(set_to_none=True)
    finally:
        module.train(was)
    return float(counter.get_total_flops())


def run_flops(trainer, history_sizes: list[int], n_images: int) -> tuple[float, float]:
    """FLOPs of the ViT's steps over the run (each epoch at its size) and of the teacher's (at the model's size)."""
    import copy

    batch, classes = trainer.config.train.batch_size, len(trainer.classes)
    per_image = {s: step_flops(trainer.trained, s, batch, classes) / batch for s in set(history_sizes)}
    vit = sum(per_image[s] * n_images for s in history_sizes)
    teacher = 0.0
    held = getattr(trainer.trained, "teacher", None)  # the objectives' CNN teacher, when one reads it
    if held is not None:
        from foodvit.training.teacher import teacher_epochs, teacher_size

        cnn = copy.deepcopy(held).requires_grad_(True)
        size, epochs = teacher_size(trainer.config), teacher_epochs(trainer.config)
        teacher = step_flops(cnn, size, batch, classes) / batch * n_images * epochs
    return vit, teacher


# ------------------------------------------------------------------------------------ the run


def profiled_run(config, threads: int) -> tuple[dict[str, float], float, object]:
    from foodvit.training.run import train

    torch.set_num_threads(threads)
    ranges = Ranges()
    ranges.install()
    try:
        with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            with record_function("run"):
                train(config, Path(tmp) / "run", quiet=True)
            wall = time.perf_counter() - started
    finally:
        ranges.close()
    events = prof.events()
    run = next(e for e in events if e.name == "run")
    intervals = [
        (e.time_range.start, e.time_range.end, phase_of(e.name))
        for e in events
        if phase_of(e.name) is not None and e.time_range.start >= run.time_range.start
    ]
    seconds = exclusive_seconds(intervals, run.time_range.start, run.time_range.end)
    return seconds, wall, ranges.trainer


def table(seconds: dict[str, float], total: float) -> list[tuple[str, float, float]]:
    rows = []
    for prefix in ("teacher: ", ""):
        for name in (*ORDER, OTHER):
            if prefix + name in seconds:
                rows.append((prefix + name, seconds[prefix + name], seconds[prefix + name] / total))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="default")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs of the ViT, and of the teacher unless it has its own (default 3)"
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=0.0,
        help="this share of each stage's own epochs, the ViT's and the teacher's (0.1: a tenth), in place of --epochs "
        "and of any train.epochs given with --set, which it scales",
    )
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="PyTorch threads (default: as set now)"
    )
    parser.add_argument("--data", default=DATA, help="the photos (default $FOODVIT_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting over the recipe, as JSON where it parses (train.compile=true, data.workers=1)",
    )
    parser.add_argument("--no-record", action="store_true", help="print the table only, append no row to results/")
    args = parser.parse_args(argv)
    if not 0 <= args.scale <= 1:
        parser.error(f"--scale is a share of the recipe's epochs, between 0 and 1, got {args.scale}")

    from foodvit.recipes import load_recipe
    from foodvit.settings.overrides import with_settings
    from foodvit.training.teacher import teacher_epochs, teacher_size

    values = {
        "data.source": args.data,
        "train.seed": args.seed,
        **({} if args.scale else {"train.epochs": args.epochs}),
        **settings(args.set),
    }
    config = with_settings(load_recipe(args.recipe), values)
    if args.scale:
        whole = config  # the recipe with --set, each stage at its own epochs
        scaled = {"train.epochs": max(1, round(whole.train.epochs * args.scale))}
        if whole.teacher.epochs:
            scaled["teacher.epochs"] = max(1, round(teacher_epochs(whole) * args.scale))
        config = with_settings(whole, scaled)
        args.epochs = config.train.epochs

    threads = sorted({1, 2, args.threads})
    before = ceiling(config, config.train.batch_size, threads)
    seconds, wall, trainer = profiled_run(config, args.threads)
    after = ceiling(config, config.train.batch_size, threads)
    # the best of the two: a machine shared with other work is slower for a while, never faster than it can be
    gflops = {t: max(before[t], after[t]) for t in threads}
    if min(before[args.threads], after[args.threads]) < 0.8 * gflops[args.threads]:
        print(
            f"phases: the ceiling moved during the run ({before[args.threads]:.1f} GFLOP/s before, "
            f"{after[args.threads]:.1f} after): the machine is shared, the shares and MFU are rough",
            file=sys.stderr,
        )
    total = sum(seconds.values())
    rows = table(seconds, total)

    sizes = [trainer.input_size(e) for e in range(config.train.epochs)]
    n_images = len(trainer.data.train)
    torch.set_num_threads(args.threads)
    vit_flops, teacher_flops = run_flops(trainer, sizes, n_images)
    vit_step = sum(seconds.get(name, 0.0) for name in STEP)
    teacher_step = sum(
        seconds.get("teacher: " + name, 0.0) for name in ("forward", "backward", "optimiser (clip, step)")
    )
    peak = gflops[args.threads]
    vit_mfu = vit_flops / max(vit_step, 1e-9) / (peak * 1e9)
    teacher_mfu = teacher_flops / max(teacher_step, 1e-9) / (peak * 1e9)

    print(
        f"## Where the time goes: {config.recipe} recipe, {args.epochs} epochs, {args.threads} thread(s), "
        f"{n_images} training photos\n"
    )
    print(
        f"wall {wall:.1f} s (profiled {total:.1f} s); ceiling (fp32 matmul at the ViT's shapes): "
        + ", ".join(f"{g:.1f} GFLOP/s on {t} thread(s)" for t, g in gflops.items())
        + "\n"
    )
    print("| phase | seconds | share |\n|---|---:|---:|")
    for name, s, share in rows:
        print(f"| {name} | {s:.2f} | {share:.1%} |")
    print(
        f"\nViT train step: {vit_flops / 1e9:.1f} GFLOP over {vit_step:.2f} s = "
        f"{vit_flops / max(vit_step, 1e-9) / 1e9:.1f} GFLOP/s, MFU {vit_mfu:.1%} of {peak:.1f} GFLOP/s"
    )
    if teacher_flops:
        print(
            f"teacher train step: {teacher_flops / 1e9:.1f} GFLOP over {teacher_step:.2f} s = "
            f"{teacher_flops / max(teacher_step, 1e-9) / 1e9:.1f} GFLOP/s, MFU {teacher_mfu:.1%}"
        )

    if not args.no_record:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        common = {
            "run": stamp,
            "recipe": config.recipe,
            "epochs": args.epochs,
            "threads": args.threads,
            "settings": "; ".join(
                [*args.set, *([f"--scale {args.scale:g}"] if args.scale else [])]
                + [f"teacher {teacher_epochs(config)} epochs at {teacher_size(config)} px"]
            ),
        }
        for name, s, share in rows:
            record(
                "speed-phases",
                {**common, "phase": name, "seconds": round(s, 3), "share": round(share, 4), "value": "", "unit": ""},
            )
        for t, g in gflops.items():
            record(
                "speed-phases",
                {
                    **common,
                    "phase": f"ceiling, {t} thread(s)",
                    "seconds": "",
                    "share": "",
                    "value": round(g, 2),
                    "unit": "GFLOP/s",
                },
            )
        record(
            "speed-phases",
            {
                **common,
                "phase": "ViT train step MFU",
                "seconds": round(vit_step, 3),
                "share": "",
                "value": round(vit_mfu, 4),
                "unit": "fraction of the ceiling",
            },
        )
        record(
            "speed-phases",
            {
                **common,
                "phase": "teacher train step MFU",
                "seconds": round(teacher_step, 3),
                "share": "",
                "value": round(teacher_mfu, 4),
                "unit": "fraction of the ceiling",
            },
        )
        record(
            "speed-phases", {**common, "phase": "wall", "seconds": round(wall, 3), "share": "", "value": "", "unit": ""}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
