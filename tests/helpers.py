"""Helpers shared by the tests."""

import torch


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values (reference libraries zero some, e.g. the head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_norm_scale = p.ndim == 1 and ("ln" in name or "norm" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_norm_scale else 0.05 * noise)
    return module


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()
