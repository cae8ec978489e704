"""The PyTorch side of the Predictor: a trained run's model as a backend. Kept apart from
predictor.py so that a Predictor on an exported .onnx never imports PyTorch (an import-linter
contract holds predictor.py to that, with this module's one import as its named exception)."""

from __future__ import annotations

import numpy as np
import torch

from foodvit.rundir.trained import read_trained


class TorchBackend:
    """A PyTorch model as a backend: NumPy batch in, NumPy logits out, under inference_mode."""

    def __init__(self, model, device=None) -> None:
        self.model = model.eval()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(torch.from_numpy(batch).to(self.device)).float().cpu().numpy()

    @property
    def has_attention(self) -> bool:
        return hasattr(self.model, "forward_intermediates") and hasattr(self.model, "config")

    def attention(self, batch: np.ndarray) -> np.ndarray | None:
        """The attention rollout maps (B, grid, grid) of a prepared batch, as `foodvit explain` draws
        them (viz.attention.pooled_rollout); None for a model that is not foodvit's ViT."""
        if not self.has_attention:
            return None
        from foodvit.viz.attention import pooled_rollout

        with torch.inference_mode():
            images = torch.from_numpy(batch).to(self.device)
            tokens, attentions = self.model.forward_intermediates(images, attention=True)  # every block's
            return pooled_rollout(self.model, tokens, attentions).float().cpu().numpy()


def open_run(run, device=None):
    """(backend, classes, preprocess, card) of a run directory or a foodvit .safetensors file."""
    model, classes, preprocess, card = read_trained(run)
    return TorchBackend(model, device or "cpu"), classes, preprocess, card
