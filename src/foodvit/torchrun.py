"""This process's place among the processes torchrun started, read from the environment here alone.

torchrun sets RANK (this process among all), LOCAL_RANK (among this machine's) and WORLD_SIZE (how many) in each
process it starts, and MASTER_ADDR and MASTER_PORT (where they meet), which PyTorch's process group reads itself
(`init_process_group`'s env:// rendezvous). A process started without torchrun is rank 0 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def place() -> Place:
    """This process's place, as torchrun's environment says (rank 0 of 1 without it)."""
    return Place(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
