"""Images per second of foodvit's ViT against timm and torchvision, in one process, same inputs.

    python -m bench.speed.throughput                                   # ViT-B/16 and ViT-Ti/16, CPU, fp32
    python -m bench.speed.throughput --models ViT-B/16 --batch-sizes 16 --rounds 5
    python -m bench.speed.throughput --device cuda --dtype bf16 --batch-sizes 64 256 --compile
    python -m bench.speed.throughput --memory                          # also peak training memory per image
    python -m bench.speed.throughput --device cuda --dtype bf16 --compile foodvit --check --profile
                                      # ours compiled against the peers eager; equality check; where the time goes

Rounds are interleaved (ours, timm, torchvision, ours, ...) so that drift in clock speed or load
hits every implementation alike; each figure is the median over rounds, and the range of the
per-round ratio (ours over the fastest peer in the same round) shows how much of a gap is noise. A training step is
forward, backward and an AdamW step. On a GPU the table adds MFU: model FLOPs from the config
(ViT-B/16 at 224: 35.1 GFLOP forward, three times that per training step) over --peak-tflops;
for foodvit the FLOPs it executes (32.9 GFLOP: its last block computes only the class token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import foodvit
from foodvit.model.variants import count_macs, get_variant

PEERS = {  # paper name -> (timm name, torchvision builder or None)
    "ViT-Ti/16": ("vit_tiny_patch16_224", None),
    "ViT-S/16": ("vit_small_patch16_224", None),
    "ViT-B/16": ("vit_base_patch16_224", "vit_b_16"),
    "ViT-B/32": ("vit_base_patch32_224", "vit_b_32"),
    "ViT-L/16": ("vit_large_patch16_224", "vit_l_16"),
}


def build(impl: str, name: str, num_classes: int = 1000) -> torch.nn.Module:
    if impl == "foodvit":
        return foodvit.create_model(name, num_classes=num_classes)
    timm_name, tv_name = PEERS[name]
    if impl == "timm":
        import timm

        return timm.create_model(timm_name, pretrained=False, num_classes=num_classes)
    import torchvision

    return getattr(torchvision.models, tv_name)(num_classes=num_classes)


def implementations(name: str) -> list[str]:
    return ["foodvit", "timm"] + (["torchvision"] if PEERS[name][1] else [])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model, mode: str, batch: int, device, dtype: str, channels_last: bool):
    """A closure running one inference batch or one training step on fixed random inputs."""
    x = torch.randn(batch, 3, 224, 224, device=device)
    if dtype == "bf16-pure":  # weights and activations in bf16: inference only (AdamW needs fp32 master weights)
        if mode != "infer":
            raise SystemExit(
                "--dtype bf16-pure is for inference (--modes infer); train under bf16 autocast (--dtype bf16)"
            )
        model.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    amp = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if dtype == "bf16"
        else torch.autocast(device.type, enabled=False)
    )
    if mode == "infer":
        model.eval()

        def step():
            with torch.inference_mode(), amp:
                model(x)

        return step
    model.train()
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)

    def step():
        with amp:
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_step(step, iters: int, device) -> float:
    sync(device)
    started = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return time.perf_counter() - started


def measure(name: str, mode: str, batch: int, args) -> tuple[dict[str, float], list[float]]:
    """Median images/s of each implementation over interleaved rounds, and ours / fastest peer in each round."""
    device = torch.device(args.device)
    steps = {}
    for impl in implementations(name):
        torch.manual_seed(0)
        model = build(impl, name).to(device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if impl in args.compiled:
            model = torch.compile(model, mode=args.compile_mode)
        steps[impl] = make_step(model, mode, batch, device, args.dtype, args.channels_last)
        for _ in range(args.warmup):
            steps[impl]()
    rates = {impl: [] for impl in steps}
    iters = max(args.iters, -(-args.min_images // batch))  # small batches: enough steps for a steady timing
    for _ in range(args.rounds):
        for impl, step in steps.items():
            rates[impl].append(batch * iters / time_step(step, iters, device))
    peers = [i for i in rates if i != "foodvit"]
    paired = [
        rates["foodvit"][k] / max(rates[i][k] for i in peers) for k in range(args.rounds)
    ]  # ours / best peer, per round
    if args.profile:
        for impl, step in steps.items():
            print(f"  where the time goes, {impl}: " + where_time_goes(step, device), flush=True)
    return {impl: statistics.median(r) for impl, r in rates.items()}, paired


KERNEL_KINDS = (  # (kind, substrings of the kernel name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn")),  # flash kernels first: their names also say sm90
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "addmm", "aten::mm", "bmm")),
    ("norm", ("layer_norm", "layernorm")),
    ("optimizer", ("adam", "multi_tensor")),
    ("compiled fusion", ("triton",)),
    ("copy", ("copy", "transpose", "cat_", "catarray")),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in lowered for k in keys)), "other elementwise")


def where_time_goes(step, device: torch.device, steps: int = 3) -> str:
    """Profile a few steps: the share of device time by kind of kernel, and on a GPU how busy it was
    between its first kernel's start and its last kernel's end (well under 100% means gaps between
    kernels: the host, not the GPU, sets the pace)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    kinds: dict[str, float] = {}
    first, last = float("inf"), 0.0
    for event in prof.events():  # on a GPU its kernels (as torch's own table sums them), else CPU ops
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA or event.is_user_annotation:
                continue
            own = event.self_device_time_total
            first, last = min(first, event.time_range.start), max(last, event.time_range.end)
        else:
            own = event.self_cpu_time_total
        kinds[kernel_kind(event.name)] = kinds.get(kernel_kind(event.name), 0.0) + own
    busy = sum(kinds.values())
    shares = ", ".join(
        f"{k} {v / busy:.0%}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v / busy >= 0.005
    )
    return shares + (
        f"; kernels cover {busy / (last - first):.0%} of the span from first to last (profiler on)" if cuda else ""
    )


def check(name: str, args) -> str:
    """Before timing: ours, given timm's weights, computes timm's function on this device. fp32 (TF32
    off) against timm, and under the benchmark's dtype each against a float64 CPU reference."""
    from foodvit.model.weights import load_weights

    device = torch.device(args.device)
    torch.manual_seed(0)
    theirs = build("timm", name).eval()
    ours = load_weights(build("foodvit", name), theirs.state_dict()).eval()
    x = torch.randn(8, 3, 224, 224)
    with torch.no_grad():
        reference = theirs.double()(x.double())
        theirs.float()
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        a, b = ours.to(device)(x.to(device)), theirs.to(device)(x.to(device))
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        fp32 = ((a - b).norm() / b.norm()).item()
        low = torch.bfloat16 if args.dtype == "bf16-pure" else torch.float32
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            errors = {
                impl: ((m.to(low)(x.to(device, low)).double().cpu() - reference).norm() / reference.norm()).item()
                for impl, m in (("foodvit", ours), ("timm", theirs))
            }
    if not fp32 < 1e-4 or any(not e < 5e-2 for e in errors.values()):
        raise SystemExit(
            f"{name}: foodvit and timm disagree on {device} (fp32 {fp32:.1e}, {args.dtype} {errors}); not timing"
        )
    return (
        f"{name} on {device}: foodvit vs timm, same weights, fp32: rel. error {fp32:.1e}; {args.dtype} vs float64: "
        + ", ".join(f"{i} {e:.1e}" for i, e in errors.items())
    )


def peak_memory(name: str, impl: str, batch: int, args) -> float:
    """Peak memory of three training steps over what the process held before them, per image
    (MiB), in a fresh subprocess: the CUDA allocator's peak, or on the CPU the peak resident set
    (Linux: writing 5 to /proc/self/clear_refs resets the high-water mark VmHWM)."""
    code = (
        "import sys, torch; import bench.speed.throughput as t\n"
        f"d = torch.device('{args.device}'); m = t.build('{impl}', '{name}').to(d)\n"
        f"s = t.make_step(m, 'train', {batch}, d, '{args.dtype}', False)\n"
        "print(t.peak_during(lambda: [s() for _ in range(3)], d))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent
    )
    return float(out.stdout.strip().splitlines()[-1]) / batch


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_during(work, device: torch.device) -> float:
    """MiB of memory at the peak of work() above what was held before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        work()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    work()
    return (_status_kib("VmHWM") - before) / 1024


def matmul_peak_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float:
    """The bf16 matrix-product ceiling measured here: median TFLOP/s of an n x n x n product on random
    data (not zeros, which run faster), timed with CUDA events after a warm-up."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def machine(device: torch.device) -> str:
    """bench.results.machine with the threads (on the CPU) and the torch version."""
    from bench.results import machine as where

    threads = "" if device.type == "cuda" else f", {torch.get_num_threads()} threads"
    return f"{where(device)}{threads}, torch {torch.__version__}"


def record_row(row: dict, device: torch.device, args) -> None:
    """One row of results/throughput.csv: images/s of each implementation and the ratio to the fastest peer."""
    from bench.results import record

    record(
        "throughput",
        {
            "device": "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device),
            "model": row["model"],
            "step": "inference" if row["mode"] == "infer" else "training",
            "batch": row["batch"],
            "precision": args.dtype,
            "compiled": ", ".join(args.compiled) or "no",
            **{i: f"{row[i]:.4g}" if i in row else "" for i in ("foodvit", "timm", "torchvision")},
            "ratio_to_fastest_peer": f"{row['ratio']:.2f}x",
            "mfu": f"{row['mfu']['foodvit']:.1%}" if "mfu" in row else "",
        },
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT-B/16", "ViT-Ti/16"], choices=list(PEERS))
    parser.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16", "bf16-pure"],
        help="bf16: autocast (fp32 weights and residual stream); bf16-pure: the model in bf16 (inference)",
    )
    parser.add_argument(
        "--compile",
        nargs="*",
        metavar="IMPL",
        help="torch.compile these implementations "
        "(no names: all); e.g. --compile foodvit times ours compiled against the peers eager",
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
        help="torch.compile mode (reduce-overhead: CUDA graphs)",
    )
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3, help="steps per timed round")
    parser.add_argument(
        "--min-images",
        type=int,
        default=16,
        help="each timed round runs at least this many images (more steps at small batches)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory", action="store_true", help="also peak training memory per image (subprocesses)")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="bf16 matrix peak for MFU (default: measured here, an 8192^3 product; REFERENCE: ~800 on the lent H100)",
    )
    parser.add_argument(
        "--check", action="store_true", help="first check on the device that ours equals timm (same weights)"
    )
    parser.add_argument("--profile", action="store_true", help="also print the share of device time by kind of kernel")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--record", action="store_true", help="append each row to results/throughput.csv")
    args = parser.parse_args(argv)
    args.compiled = ["foodvit", "timm", "torchvision"] if args.compile == [] else (args.compile or [])
    device = torch.device(args.device)
    rows = []
    header = (
        f"{'model':<10} {'mode':<6} {'batch':>5}  "
        + "  ".join(f"{i:>12}" for i in ("foodvit", "timm", "torchvision"))
        + "   ours/best peer"
    )
    compiled = f" | compiled ({args.compile_mode or 'default'}): {', '.join(args.compiled)}" if args.compiled else ""
    print(f"{machine(device)} | {args.dtype}{compiled} | {time.strftime('%Y-%m-%d')}")
    if device.type == "cuda" and args.peak_tflops is None:
        args.peak_tflops = matmul_peak_tflops(device)
        print(
            f"bf16 matrix-product ceiling measured here (8192^3, random data): {args.peak_tflops:.0f} TFLOP/s; "
            "MFU is against it"
        )
    if args.check:
        for name in args.models:
            print(check(name, args), flush=True)
    print(header)
    for name in args.models:
        config = get_variant(name).config()  # foodvit skips the last block's unused tokens (count_macs' executed)
        flops = {i: 2 * count_macs(config, executed=i == "foodvit") for i in implementations(name)}
        for mode in args.modes:
            for batch in args.batch_sizes:
                r, paired = measure(name, mode, batch, args)
                peers = [r[i] for i in ("timm", "torchvision") if i in r]
                row = {
                    "model": name,
                    "mode": mode,
                    "batch": batch,
                    **r,
                    "ratio": r["foodvit"] / max(peers),
                    "round_ratios": paired,
                }
                if device.type == "cuda":
                    row["mfu"] = {
                        i: r[i] * flops[i] * (3 if mode == "train" else 1) / (args.peak_tflops * 1e12)
                        for i in implementations(name)
                    }
                if args.memory and mode == "train":
                    row["mem_mib_per_image"] = {i: peak_memory(name, i, batch, args) for i in implementations(name)}
                rows.append(row)
                if args.record:
                    record_row(row, device, args)
                cells = "  ".join(
                    f"{r[i]:>12.2f}" if i in r else f"{'--':>12}" for i in ("foodvit", "timm", "torchvision")
                )
                line = (
                    f"{name:<10} {mode:<6} {batch:>5}  {cells}   {row['ratio']:.3f}x  "
                    f"per round {statistics.median(paired):.3f}x ({min(paired):.2f}-{max(paired):.2f})"
                )
                if "mfu" in row:
                    line += "  MFU " + " ".join(f"{i} {v:.1%}" for i, v in row["mfu"].items())
                if "mem_mib_per_image" in row:
                    line += "  MiB/img " + " ".join(f"{i} {v:.0f}" for i, v in row["mem_mib_per_image"].items())
                print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(device), "args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
