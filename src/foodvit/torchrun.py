"""This process's place among the processes torchrun started, read from the environment here alone, and the
cores it may run on.

torchrun sets RANK (this process among all), LOCAL_RANK (among this machine's) and WORLD_SIZE (how many) in each
process it starts, and MASTER_ADDR and MASTER_PORT (where they meet), which PyTorch's process group reads itself
(`init_process_group`'s env:// rendezvous). A process started without torchrun is rank 0 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from foodvit.errors import ConfigError


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


DEFAULT_TIMEOUT_S = 600  # how long a process waits for the others (a collective, their parts) before it stops


@dataclass(frozen=True)
class Place:
    """This process among the others: rank 0 of 1 when torchrun did not start it."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes, prints and merges for all."""
        return self.rank == 0


START = "start the processes with torchrun (e.g. torchrun --nproc-per-node 2 -m foodvit COMMAND ...), or unset them"


def place() -> Place:
    """This process's place, as torchrun's environment says (rank 0 of 1 without it); a ConfigError in one line
    when the variables cannot be torchrun's (not whole numbers, a rank outside the world, a world without the
    place where its processes meet: predict --out's ranks waited 10 minutes for others that were never started)."""
    values = {}
    for name, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        text = os.environ.get(name, default)
        try:
            values[name] = int(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} in the environment is not a whole number; {START}") from None
    here = Place(rank=values["RANK"], local_rank=values["LOCAL_RANK"], world_size=values["WORLD_SIZE"])
    if here.world_size < 1 or not 0 <= here.rank < here.world_size or here.local_rank < 0:
        raise ConfigError(
            f"RANK={here.rank}, LOCAL_RANK={here.local_rank} and WORLD_SIZE={here.world_size} in the environment are "
            f"no process among the others (0 <= RANK < WORLD_SIZE, LOCAL_RANK >= 0); {START}"
        )
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if here.world_size > 1 and missing:  # torchrun sets both: a WORLD_SIZE left over from another session
        raise ConfigError(
            f"WORLD_SIZE={here.world_size} in the environment, but not {' and '.join(missing)}, where the processes "
            f"meet; {START}"
        )
    return here
