"""Results kept as data: every benchmark appends its rows to a CSV file under `results/`.

Each row carries its provenance beside its figures: the command that produced it, the machine (CPU model and
cores), the torch version, the code's commit and the date. The documentation's tables are generated from
these files, never typed by hand.

    from bench.results import record
    record("speed", {"what": "train step", "value": 1.23, "unit": "s"}, command="python -m bench.speed.x")

Run benchmark scripts from the repository root as modules (`python -m bench.speed.x`) so `bench` imports.
"""

from __future__ import annotations

import csv
import datetime
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"
PROVENANCE = ("command", "machine", "torch", "commit", "date")


def cpu_name() -> str:
    """The CPU's model name, e.g. 'AMD EPYC (family 25, model 17)', as a run's model.json names the chip it trained
    on."""
    import torch

    from foodvit.training.engine import processor

    return processor(torch.device("cpu"))


def machine(device=None) -> str:
    """What ran a benchmark: the GPU's name for a CUDA `device`, else the CPU model and the cores this process may
    use, e.g. 'AMD EPYC (family 25, model 17) with native bf16, 2 cores'."""
    if device is not None and device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    from foodvit.training.engine import cpu_computes_bf16

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # a CPU with native bf16 trains about 1.5 times as fast (training under bf16 autocast, --amp) and rounds otherwise
    return f"{cpu_name()}{' with native bf16' if cpu_computes_bf16() else ''}, {cores} cores"


def commit() -> str:
    """The checked-out commit, with '+dirty' when the working tree's code differs from it (the rows a benchmark has
    just added to results/ are not a change of the code that measures)."""
    root = RESULTS.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def invocation() -> str:
    """The command line that runs this process, as typed from the repository's root: `python -m bench.x.y ...` for a
    benchmark run as a script or a module from anywhere."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parent.parent
    if script.suffix == ".py" and script.is_relative_to(root):
        module = ".".join(script.relative_to(root).with_suffix("").parts)
        return " ".join(["python", "-m", module, *sys.argv[1:]])
    return " ".join(["python", *sys.argv])


def provenance(command: str | None = None) -> dict[str, str]:
    try:
        import torch

        version = torch.__version__
    except ImportError:
        version = ""
    return {
        "command": command if command is not None else invocation(),
        "machine": machine(),
        "torch": version,
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
    }


def record(name: str, row: dict, command: str | None = None, folder: Path = RESULTS) -> Path:
    """Append `row` (its figures) with its provenance to `folder/<name>.csv`; the header is written once and a row
    whose columns differ from the file's is refused, so a file stays one table."""
    full = {**row, **{k: v for k, v in provenance(command).items() if k not in row}}
    path = folder / f"{name}.csv"
    folder.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as f:
            header = next(csv.reader(f))
        if list(full) != header:
            raise ValueError(f"{path}: columns {list(full)} differ from the file's {header}")
        with path.open("a", newline="") as f:
            csv.writer(f).writerow(full.values())
    else:
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(full)
            writer.writerow(full.values())
    return path
