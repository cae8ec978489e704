"""The numbers behind the pictures of a ViT: attention rollout read out as the model pools, mean attention
distance, position-embedding similarity, patch-embedding filters (the paper's Figure 6 and 7).

Plain functions of tensors, so they can be tested and reused; viz/figures.py draws them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foodvit.errors import ConfigError


def attention_rollout(attentions: list[torch.Tensor], residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020), as the paper uses for Figure 6 / App. D.8.

    Each layer's attention is averaged over heads, mixed with the identity for the residual
    connection (A' = residual * I + (1 - residual) * A), rows renormalised, and the layers
    multiplied from the first to the last. Input: L tensors (B, h, T, T). Output: (B, T, T), each
    row a distribution over the tokens the information came from.
    """
    if not attentions:
        raise ValueError("attention_rollout needs the attention weights of at least one layer")
    rollout: torch.Tensor | None = None
    for weights in attentions:
        a = weights.float().mean(dim=1)  # (B, h, T, T) -> (B, T, T)
        eye = torch.eye(a.shape[-1], device=a.device)
        a = residual * eye + (1 - residual) * a
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout  # later layers act on what earlier ones mixed
    assert rollout is not None  # at least one layer, checked above
    return rollout


def rollout_map(
    rollout: torch.Tensor, num_prefix_tokens: int, grid: int, readout: torch.Tensor | None = None
) -> torch.Tensor:
    """Where the prediction looks: (B, T, T) -> (B, grid, grid), summing to 1 over the patches.

    readout (B, T): how much the pooling reads each token's row (pool_readout); by default the
    class token's row when there is one, else the mean of the patch rows. The prefix columns are
    dropped and the rest renormalised.
    """
    if readout is None:
        readout = torch.zeros(rollout.shape[:2], dtype=rollout.dtype, device=rollout.device)
        if num_prefix_tokens:
            readout[:, 0] = 1
        else:
            readout[:] = 1 / rollout.shape[1]
    rows = torch.einsum("bt,bts->bs", readout.to(rollout.dtype), rollout)  # (B, T)
    patches = rows[:, num_prefix_tokens:]
    patches = patches / patches.sum(dim=-1, keepdim=True)
    return patches.reshape(-1, grid, grid)


@torch.no_grad()
def pool_readout(model, tokens: torch.Tensor) -> torch.Tensor:
    """The weight the prediction gives each output token, (B, T, D) -> (B, T). Eq. 4's pooling: one-hot
    on the class token (pool='cls'), uniform over the patch tokens (pool='gap'), or the learned
    sequence-pooling weights (pool='seq'); with the distillation token (deviation 9), whose head the
    prediction averages with Eq. 4's, half on that token and half on the pooling. Attention maps read
    through it show what the predicted logits see."""
    c = model.config
    B, T, _ = tokens.shape
    readout = torch.zeros(B, T, device=tokens.device)
    if c.pool == "cls":
        readout[:, 0] = 1
    elif c.pool == "gap":
        readout[:, c.num_prefix_tokens :] = 1 / (T - c.num_prefix_tokens)
    else:
        readout[:, c.num_prefix_tokens :] = (
            model.attn_pool(tokens[:, c.num_prefix_tokens :]).float().softmax(dim=1)[..., 0]
        )
    if c.distill_token:  # prediction = (Eq. 4's logits + the distillation head's) / 2 (Heads.prediction)
        readout /= 2
        readout[:, c.num_prefix_tokens - 1] = 0.5  # the distillation token follows the class token
    return readout


def pooled_rollout(model, tokens: torch.Tensor, attentions: list[torch.Tensor]) -> torch.Tensor:
    """The rollout map (B, grid, grid) as `explain` draws it: the attention rollout of every layer,
    read out as the prediction reads the tokens (pool_readout). tokens and attentions: the final tokens and
    every block's attention weights, forward_intermediates(images, attention=True). The demo page's overlay,
    and the .onnx file's "attention" output (foodvit export --with-attention), are this map."""
    c = model.config
    return rollout_map(attention_rollout(attentions), c.num_prefix_tokens, c.grid_size, pool_readout(model, tokens))


POOL_WORDS = {
    "cls": "the class token",
    "gap": "the mean of the patch tokens",
    "seq": "the sequence-pooled patch tokens",
}


def read_by(config) -> str:
    """What pool_readout reads, in words, for a figure's title."""
    return POOL_WORDS[config.pool] + (" and the distillation token" if config.distill_token else "")


def position_similarity(pos_embed: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Cosine similarity between the position embeddings of every pair of patches: (N, N)."""
    patches = F.normalize(pos_embed.detach().float()[0, num_prefix_tokens:], dim=-1)  # (N, D)
    return patches @ patches.T


def patch_distances(grid: int, patch_size: int) -> torch.Tensor:
    """Distance in pixels between the centres of every pair of patches: (N, N)."""
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1).float() * patch_size  # (N, 2)
    return torch.cdist(centres, centres)


def mean_attention_distance(
    attentions: list[torch.Tensor], num_prefix_tokens: int, grid: int, patch_size: int
) -> torch.Tensor:
    """Figure 7 (right): for each layer and head, the attention-weighted distance in pixels between
    a patch and the patches it attends to, averaged over patches and images. (L, h).

    Attention among patches only; each query's weights over the patch keys are renormalised.
    """
    distance = patch_distances(grid, patch_size)
    out = []
    for weights in attentions:
        w = weights.float()[:, :, num_prefix_tokens:, num_prefix_tokens:]  # (B, h, N, N)
        w = w / w.sum(dim=-1, keepdim=True)
        out.append((w * distance.to(w.device)).sum(dim=-1).mean(dim=(0, 2)))  # (h,)
    return torch.stack(out)


def filter_components(patch_weight: torch.Tensor, k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Figure 7 (left): principal components of the patch-embedding filters E.

    patch_weight (D, C, P, P): D filters, each a C*P*P vector. Returns the first k components as
    (k, C, P, P), orthonormal as vectors, and the share of variance each explains.
    """
    D, C, P, _ = patch_weight.shape
    x = patch_weight.detach().float().reshape(D, C * P * P)
    x = x - x.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    k = min(k, vh.shape[0])
    explained = (s**2 / (s**2).sum())[:k]
    return vh[:k].reshape(k, C, P, P), explained


@torch.no_grad()
def feature_maps(model, x: torch.Tensor, n: int = 5) -> torch.Tensor:
    """The patch embedding's output for one image, as n of its D channels on the patch grid: (n, g, g)."""
    tokens = model.patch_embed(x)  # (1, C, H, W) -> (1, N, D)
    g = model.config.grid_size
    return tokens[0, :, :n].T.reshape(n, g, g).cpu()  # (N, n) -> (n, g, g)


@torch.no_grad()
def explain(predictor, photo, top_k: int = 3) -> dict:
    """Probabilities, the attention rollout map and, per head, the last layer's attention, both read
    out as the prediction reads the tokens (pool_readout): the class token's row for pool='cls', the
    mean of the patch tokens' rows for pool='gap', the learned weights for pool='seq'; with the
    distillation token, the mean of that and the token's own row.
    predictor: a Predictor with a PyTorch model; photo: a PIL image."""
    model = _torch_model(predictor)
    x = torch.from_numpy(predictor.prepare(photo))[None].to(next(model.parameters()).device)
    tokens, attentions = model.forward_intermediates(x, attention=True)  # every block's attention weights
    probs = model.forward_head(tokens).float().softmax(-1)[0].cpu()
    c, g = model.config, model.config.grid_size
    readout = pool_readout(model, tokens)  # (1, T)
    last = torch.einsum("t,hts->hs", readout[0], attentions[-1][0].float())[:, c.num_prefix_tokens :].cpu()  # (h, N)
    heads = (last / last.sum(-1, keepdim=True)).reshape(-1, g, g)
    top = probs.topk(min(top_k, probs.numel()))
    return {
        "top_k": [(predictor.classes[i], p) for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)],
        "rollout": pooled_rollout(model, tokens, attentions)[0].cpu(),
        "heads": heads,
        "input": x[0].cpu(),
        "read_by": read_by(c),
    }


def _torch_model(predictor):
    if predictor.model is None:
        raise ConfigError(
            "attention maps need the PyTorch model: open the run directory (foodvit.Predictor.from_run), "
            "not an exported file"
        )
    return predictor.model


@torch.no_grad()
def attention_distances_over(model, images: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """Mean attention distance (L, h) averaged over a batch of preprocessed images."""
    c = model.config
    sums = []  # each batch's distances times its number of images
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size].to(next(model.parameters()).device)
        attentions = model.forward_intermediates(x, attention=True, intermediates_only=True)
        sums.append(mean_attention_distance(attentions, c.num_prefix_tokens, c.grid_size, c.patch_size).cpu() * len(x))
    return sum(sums[1:], sums[0]) / len(images)
