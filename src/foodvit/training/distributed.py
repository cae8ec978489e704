"""The processes a run trains on: one (the plain case) or several started by torchrun.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in each process's
environment (read in foodvit/torchrun.py); Context.from_environment joins the process group (NCCL on GPUs,
gloo on CPUs) and picks this process's device from LOCAL_RANK. Everything the Trainer needs from the other
processes goes through the Context: the sum of metrics over ranks, a NaN check all ranks agree on,
gathering evaluation results, "rank 0 writes, the others wait", and turning a lost peer into one
clear line. With one process every method is the identity (no process group at all).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from foodvit.errors import ConfigError, FoodVitError
from foodvit.torchrun import DEFAULT_TIMEOUT_S, place


class PeerLost(FoodVitError, RuntimeError):
    """Another training process stopped (killed, crashed, its machine gone) or never answered."""


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """The device named in the settings; 'auto' is this process's GPU (cuda:LOCAL_RANK) if there is one."""
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda" if name == "auto" else name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but PyTorch sees no CUDA GPU here; use --device cpu or auto")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    gpus = f"{count} CUDA GPU{'s' if count > 1 else ''} here (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
    if device.type == "cuda" and device.index is None:  # this process's own GPU, by its place on the machine
        if local_rank >= count:
            raise ConfigError(
                f"process LOCAL_RANK={local_rank} takes GPU cuda:{local_rank}, and PyTorch sees {gpus}: start at "
                f"most {count} process{'es' if count > 1 else ''} a machine (torchrun --nproc-per-node {count})"
            )
        device = torch.device("cuda", local_rank)
    if device.type == "cuda" and device.index >= count:
        raise ConfigError(f"device {name!r} asked for, but PyTorch sees {gpus}; use one of them, or --device auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device {name!r} asked for, but PyTorch sees no Apple GPU (MPS) here; use --device cpu or auto"
        )
    return device


@dataclass
class Context:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory, prints and shows progress."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> Context:
        """One process, or, under torchrun (WORLD_SIZE > 1), this rank of the process group."""
        here = place()
        local_rank = here.local_rank
        chosen = pick_device(device, local_rank)
        if here.world_size <= 1:
            return cls(device=chosen)
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        if not dist.is_initialized():  # place() has checked that torchrun said where the processes meet
            backend = "nccl" if chosen.type == "cuda" else "gloo"
            timeout = datetime.timedelta(seconds=timeout_s)
            try:
                if chosen.type == "cuda":  # bound to its GPU at once: NCCL's communicators start eagerly
                    dist.init_process_group(backend, timeout=timeout, device_id=chosen)
                else:
                    dist.init_process_group(backend, timeout=timeout)
            except (RuntimeError, ValueError, dist.DistError) as err:
                raise PeerLost(
                    f"rank {here.rank}: could not meet the other training processes at "
                    f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} ({backend_reason(err).rstrip('.')}); "
                    "are they running, and within --dist-timeout?"
                ) from None
        context = cls(dist.get_rank(), dist.get_world_size(), local_rank, chosen)
        context._stop_cleanly_on_sigterm()
        return context

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (a new tensor; the argument is left as it was)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone()
        with self.collective():
            dist.all_reduce(total)
        return total

    def gather(self, value) -> list:
        """Every rank's value (any picklable object), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        out = [None] * self.world_size
        with self.collective():
            dist.all_gather_object(out, value)
        return out

    def broadcast(self, value):
        """Rank 0's value (any picklable object) on every rank."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        with self.collective():
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            with self.collective():
                dist.barrier()

    @contextlib.contextmanager
    def main_first(self):
        """The block runs on the first process of each machine, then on the others (downloads and
        unzips happen once per machine; the rest find them cached). An error on the first process
        is raised on all of them."""
        if self.local_rank != 0:
            self.share_error(None)
            yield
            return
        try:
            yield
        except FoodVitError as err:
            self.share_error(str(err), err)
            raise
        self.share_error(None)

    def on_main(self, action, *args, **kwargs):
        """action(...) on rank 0 alone; its FoodVitError, if any, is raised on every rank (others
        would otherwise wait for rank 0 forever). Returns rank 0's result there, None elsewhere."""
        result, error = None, None
        if self.is_main:
            try:
                result = action(*args, **kwargs)
            except FoodVitError as err:
                if not self.distributed:
                    raise
                error = err
        self.share_error(str(error) if error is not None else None, error)
        return result

    def share_error(self, message: str | None, original: BaseException | None = None) -> None:
        """Raise on every rank if any rank has a message (each rank passes its own, or None)."""
        if not self.distributed:
            if original is not None:
                raise original
            return
        messages = [m for m in self.gather(message) if m]
        if messages:
            self.stopping()  # every rank raises: the first to exit brings torchrun's SIGTERM to the others
            if original is not None:
                raise original
            raise FoodVitError(messages[0])

    @contextlib.contextmanager
    def collective(self):
        """Turn the backend's error when a peer is gone (closed connection, timeout) into PeerLost."""
        try:
            yield
        except (RuntimeError, dist.DistError) as err:
            if isinstance(err, FoodVitError):
                raise
            raise self.peer_lost(err) from None

    def peer_lost(self, err: BaseException) -> PeerLost:
        """The error for a collective's failure, taken to mean a peer is gone (this rank is stopping)."""
        self.stopping()
        return PeerLost(f"rank {self.rank}: lost contact with the other training processes ({backend_reason(err)})")

    def stopping(self) -> None:
        """This rank is stopping with an error that says why (a peer lost, or one raised on every rank
        at once). torchrun's SIGTERM, which follows as soon as any process exits, is ignored from here on
        rather than allowed to replace that message or end the process before it is printed; if the
        rank hangs, torchrun's SIGKILL follows after its --shutdown-timeout (30 s)."""
        self.__dict__["_stopping"] = True

    # ------------------------------------------------------------------ the model

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """DistributedDataParallel around the module when there are several processes: gradients
        are averaged over ranks during backward."""
        if not self.distributed:
            return module
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def close(self) -> None:
        """Leave the process group (several processes), then give SIGTERM its previous handler back;
        with one process, nothing to do. In that order: leaving the group after a peer is lost can
        take a while, the very time torchrun's SIGTERM arrives, and the previous handler (the
        default's: end the process) would cut off the message this process is about to print. The
        run is over either way, so a SIGTERM meanwhile is ignored."""
        self.stopping()
        try:
            if self.distributed and dist.is_initialized():
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
        finally:
            previous = self.__dict__.pop("_previous_sigterm", None)
            if previous is not None:
                with contextlib.suppress(ValueError):
                    signal.signal(signal.SIGTERM, previous)

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stop_cleanly_on_sigterm(self) -> None:
        """torchrun ends every process with SIGTERM when one of them fails: say why, in one line,
        and unwind (the run lock is released, the last checkpoint stays); once this rank is already
        stopping with its own message (`stopping`), the signal is ignored."""

        def stop(signum, frame):
            if self.__dict__.get("_stopping"):  # already stopping, with the message that says why
                return
            self.stopping()
            raise PeerLost(f"rank {self.rank}: stopped by the launcher (torchrun ends every process when one fails)")

        with contextlib.suppress(ValueError):  # not in the main thread: leave the handler as it is
            self.__dict__["_previous_sigterm"] = signal.signal(signal.SIGTERM, stop)


def backend_reason(err: BaseException) -> str:
    """The gist of a process group error: 'Connection closed by peer [127.0.0.1]:44450', without the
    source location and the advice that follows."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". ")[0][:160]


def is_backend_error(err: RuntimeError) -> bool:
    """Whether a RuntimeError comes from the process group's transport (a peer gone, a timeout)."""
    text = str(err).lower()
    return isinstance(err, dist.DistError) or any(
        w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer")
    )


class OnMain:
    """A context manager entered and left by rank 0 alone; an error entering it stops every rank."""

    def __init__(self, manager, ctx: Context) -> None:
        self.manager, self.ctx = manager, ctx

    def __enter__(self):
        return self.ctx.on_main(self.manager.__enter__)

    def __exit__(self, *exc):
        return self.manager.__exit__(*exc) if self.ctx.is_main else None
