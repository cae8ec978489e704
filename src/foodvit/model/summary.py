"""A torchinfo-style table of a model: layer, input shape, output shape, parameters, trainable.

Shapes come from one forward pass on the model's own device; `foodvit summary` builds the model on
the meta device, so even ViT-H/14 costs no memory or time there. A module's own parameters (the class
token, E_pos) have rows of their own beside its children's, so each level's rows add up to the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Row:
    depth: int
    name: str
    kind: str
    input_shape: str = "--"
    output_shape: str = "--"
    params: int = 0
    trainable: bool | None = None


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return str(list(value.shape))
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return _shape(value[0])
    return "--"


def summarize(model: nn.Module, input_size: tuple[int, ...], max_depth: int = 3) -> list[Row]:
    """Rows for every module down to max_depth, in forward order where the module ran."""
    rows: dict[str, Row] = {}
    hooks = []
    for name, module in model.named_modules():
        depth = name.count(".") + 1 if name else 0
        if depth > max_depth:
            continue
        params = list(module.parameters())
        row = Row(
            depth,
            name.rsplit(".", 1)[-1] or type(model).__name__,
            type(module).__name__,
            params=sum(p.numel() for p in params),
            trainable=None if not params else all(p.requires_grad for p in params),
        )
        rows[name] = row
        if depth < max_depth and next(module.children(), None) is not None:
            for key, p in module.named_parameters(recurse=False):  # x_class, E_pos: in no child's row
                rows[f"{name}.{key}" if name else key] = Row(
                    depth + 1,
                    key,
                    "Parameter",
                    output_shape=str(list(p.shape)),
                    params=p.numel(),
                    trainable=p.requires_grad,
                )

        def hook(mod, args, output, row=row):
            row.input_shape, row.output_shape = _shape(args), _shape(output)

        hooks.append(module.register_forward_hook(hook))
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model(torch.zeros(input_size, device=device))
    finally:
        for h in hooks:
            h.remove()
    return list(rows.values())


def format_summary(model: nn.Module, input_size: tuple[int, ...], max_depth: int = 3) -> str:
    rows = summarize(model, input_size, max_depth)
    header = ("Layer (type)", "Input shape", "Output shape", "Param #", "Trainable")
    cells = [header] + [
        (
            "  " * r.depth + f"{r.name} ({r.kind})",
            r.input_shape,
            r.output_shape,
            f"{r.params:,}",
            "--" if r.trainable is None else str(r.trainable),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    line = "=" * (sum(widths) + 2 * (len(widths) - 1))

    def fmt(c: tuple[str, ...]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths, strict=True)))

    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    notes = []
    config: Any = getattr(model, "config", None)  # a ViTConfig, or None for a model that is not ours
    if getattr(config, "class_only_last_block", False):
        notes = [
            f"Block {config.depth - 1} outputs the class token only: Eq. 4 reads z_L^0 alone, so forward() "
            "computes no other token there (forward_features() returns all of them).",
            line,
        ]
    out = [
        line,
        fmt(header),
        line,
        *(fmt(c) for c in cells[1:]),
        line,
        *notes,
        f"Trainable params: {trainable:,}",
        f"Non-trainable params: {total - trainable:,}",
        f"Params size (MB): {size_mb:,.2f}",
        f"Total params: {total:,}",
    ]
    return "\n".join(out)
