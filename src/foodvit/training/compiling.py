"""torch.compile of the train step (--compile), and its fallback where it cannot run.

On a GPU the step compiles to Triton kernels; on the CPU, inductor writes C++ and needs a C++ compiler
(g++, c++ or clang++, or the one $CXX names). Without one, the step runs uncompiled, said once per process:
the run computes the same, only slower. The compiled step draws its random numbers as eager PyTorch does
(inductor's fallback_random), so compiling changes how a step is computed, never what.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import cast

import torch
from torch import nn

logger = logging.getLogger(__name__)
_said: set[str] = set()


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would find on this machine's PATH, or None."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def compile_step(module: nn.Module, device: torch.device) -> nn.Module:
    """`module` compiled by torch.compile (inductor), or `module` itself on a CPU without a C++ compiler."""
    if device.type == "cpu" and cpp_compiler() is None:
        if "no compiler" not in _said:
            _said.add("no compiler")
            logger.warning(
                "--compile: no C++ compiler (g++, c++, clang++ or $CXX) for torch.compile on the CPU; the step runs "
                "uncompiled (the same results, slower). Install g++ to compile it"
            )
        return module
    # the random draws of eager PyTorch (the localization loss's pairs, the masks, dropout), not inductor's own:
    # the compiled step then learns what the eager one does, to float noise
    return cast(nn.Module, torch.compile(module, options={"fallback_random": True}))  # an OptimizedModule
