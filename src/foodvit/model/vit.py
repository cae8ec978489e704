"""The Vision Transformer of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021).

Read it beside the paper: section 3.1 and Figure 1 give Eq. 1-4 (Eq. 2-3's block, its attention
(Appendix A) and its MLP are in model/blocks.py), Appendix B.1 where dropout goes, section 3.2 the
position-embedding interpolation.

Shape legend, used in every shape comment below:
    B batch, C channels, H x W image, P patch size, N = HW / P^2 patches,
    T tokens (N + the prefix tokens: the class token, and the distillation token of deviation 9),
    D embed_dim, h num_heads,
    d = D / h head_dim, M mlp_dim.

Deviations from the paper. A model built with the defaults has none of them; each is an
option, named here once and cited:
  1. pool="gap": global average pooling of the encoder's output tokens instead of the class
     token (the paper compares both in App. D.3; Beyer et al. 2022, "Better plain ViT baselines").
  2. pos_embed="sincos2d": fixed 2D sine-cosine position embeddings instead of learned 1D ones,
     in the convention of MoCo v3 (Chen, Xie & He 2021; its build_2d_sincos_position_embedding):
     row channels first, frequencies 1 / 10000^(k / (D/4)), a zero embedding for the class
     token. Beyer et al. 2022 (big_vision's posemb_sincos_2d) use the same idea with column
     channels first and frequencies reaching 1/10000 exactly; the two are not interchangeable
     for pre-trained weights (the table: model/positions.py, beside section 3.2's resampling).
     pos_embed="none": no position embedding (the paper's Table 8 ablation).
  3. class_token=False: no class token; needs pool="gap" (Beyer et al. 2022). With pool="gap" or
     "seq" and the class token kept (the default recipe), the token is not pooled but still attends
     and is attended to: an extra global token, as in MoCo v3's ViTs; the recipe was chosen
     on validation with it, and foodvit keeps it there deliberately.
  4. drop_path > 0: stochastic depth on each residual branch, rate growing linearly with depth
     (Huang et al. 2016, as used by DeiT, Touvron et al. 2021).
  5. stem="conv": a convolutional tokeniser (conv 3x3, BatchNorm, ReLU, max-pool, repeated) in place
     of the single patchify Conv2d, from Compact Convolutional Transformers (Hassani et al. 2021) and
     "Early convolutions help transformers see better" (Xiao et al. 2021, whose stem has the
     BatchNorm). The patch size P is then the tokeniser's total stride. Its batch norms are the
     model's only ones: they keep running statistics, which a training pass that must not count them
     (sharpness-aware minimisation's second pass, a second view of a photo) leaves untouched
     (training/batchnorm.py).
  6. pool="seq": sequence pooling, an attention-weighted mean of the output tokens with weights
     from a learned Linear(D, 1) (Hassani et al. 2021, CCT).
  7. locality=True: locality self-attention (Lee et al. 2021, "Vision Transformer for Small-Size
     Datasets"): a token may not attend to itself (the diagonal of q k^T is masked) and the
     softmax temperature is learned, starting at sqrt(d). locality_mask=False keeps the learned
     temperature alone, for inits whose start has each token attend to itself (deviation 8),
     which the mask would hide.
  8. init="mimetic": mimetic initialisation of the attention (Trockman & Kolter 2023, "Mimetic
     initialization of self-attention layers"). Pre-trained ViTs have W_q W_k^T close to a
     multiple of the identity in each head and W_v W_o close to a negative one; this init starts
     there: W_q,h W_k,h^T is the rank-d part of a Z + b I and W_v W_o = a Z - b I exactly (Z a
     random D x D matrix with N(0, 1/D) entries), so at step 0 a token attends most to tokens
     like itself (with sin-cos positions: its neighbours). The init changes nothing else.
  9. distill_token=True: DeiT's distillation token (Touvron et al. 2021, "Training data-efficient
     image transformers & distillation through attention", section 4). A second learned token
     follows the class token; its output state feeds its own linear head (head_dist), which
     learns the teacher's classes while Eq. 4's head learns the true ones (training/objectives/distill.py). Both
     tokens attend and are attended to in every block; prediction is the mean of the two heads'
     logits, as in DeiT.
 10. stem="spt": shifted patch tokenisation (Lee et al. 2021, "Vision Transformer for Small-Size
     Datasets"): the image and four copies shifted by half a patch diagonally (zeros shifted in)
     are stacked on the channels, each 5C x P x P patch is flattened, layer-normalised and
     projected to D by E (a Linear): every token also sees its neighbours' borders.
 11. init="impulse": impulse (structured) initialisation of the attention (Zheng et al. 2024,
     "Structured initialization for attention in vision transformers", arXiv 2404.01139; model/init.py).
     Each head of each block draws one offset of a 3 x 3 neighbourhood; W_q,h W_k,h^T is solved,
     through the layer-normalised sin-cos position embedding, so that at step 0 a patch's query
     meets the key of the patch at that offset most: the attention starts as the taps of a 3 x 3
     convolution. Needs pos_embed="sincos2d". Zheng et al. fit the softmax map to a 0/1 impulse
     (edges zero) by gradient steps and may reuse one solution in every block; here the logits
     target is additive (the offset's row plus its column, which sin-cos positions can express
     exactly), solved in closed form (ridge), edges clamped, new taps in each block; with
     locality=True and its mask (deviation 7) no head draws the (0, 0) tap the mask would hide.
 12. mlp_conv=True: locality in the MLP of Eq. 3 (LocalViT, Li et al. 2021, arXiv 2104.05707): after the
     first layer and its GELU, h + GELU(DWConv3x3(h)) on the patch tokens' grid, the filters starting at
     zero so that at step 0 the model computes the paper's function (model/gridconv.py says the rest).

Notes (not deviations from the paper's text):
  - The head is always the single linear layer the paper uses at fine-tuning (section 3.1); its
    pre-training head, an MLP with one hidden layer (tanh, the authors' pre_logits), is not built,
    from scratch either, as torchvision's and timm's ViTs by default.
  - attn_dropout > 0 drops attention weights, as the authors' JAX code can (attention_dropout_rate,
    0 in their configs); the paper's text names no such dropout, and the default 0 leaves it out.
  - GELU is the exact (erf) form, as torchvision and timm use; the authors' JAX code uses the
    tanh approximation (they differ by under 1e-3 per activation).
  - LayerNorm epsilon is 1e-6, the JAX reference's value (torchvision and timm agree).
  - With the class token pooled (Eq. 4), forward() computes the last block for the class token
    only (all tokens still serve as its keys and values): the same logits and gradients, 6% fewer
    FLOPs for ViT-B/16. forward_features() returns every token; forward_intermediates() the taken
    blocks' patch tokens too, or their attention weights (attention=True), as timm's does.
  - The model keeps one input size (its config's). forward(images, pos_embed=...) embeds a batch of
    another patch grid with that grid's E_pos (pos_embed_for_grid: with fixed sin-cos or no position
    embeddings any grid has one), for progressive resizing's smaller first epochs; the training side
    (training/resizing.py) chooses and keeps them, as it keeps a frozen backbone (training/freezing.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

import torch
from torch import nn

from foodvit.errors import ConfigError, InputError
from foodvit.model.blocks import Block
from foodvit.model.init import init_head, init_weights
from foodvit.model.positions import sincos_2d_pos_embed
from foodvit.model.stems import ConvStem, ShiftedPatches
from foodvit.settings.model import ViTConfig

# ---------------------------------------------------------------------------------------------
# Eq. 1: patch embedding, class token, position embedding
# ---------------------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    """x_p^i E of Eq. 1: cut the image into N patches of P x P and project each to D.

    One Conv2d with kernel = stride = P is exactly a shared Linear applied to every flattened
    patch, computed without materialising the patches.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        C, D, P = config.in_channels, config.embed_dim, config.patch_size
        self.stem: nn.Module | None
        self.proj: nn.Module
        if config.stem == "conv":  # deviation 5: the stem does the striding, E is a 1x1 projection
            self.stem = ConvStem(C, D, P)
            self.proj = nn.Conv2d(D, D, kernel_size=1)
        elif config.stem == "spt":  # deviation 10: E reads the normalised shifted patches
            self.stem = ShiftedPatches(C, P, config.layer_norm_eps)
            self.proj = nn.Linear(ShiftedPatches.COPIES * C * P * P, D)
        else:
            self.stem = None
            self.proj = nn.Conv2d(C, D, kernel_size=P, stride=P)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if isinstance(self.stem, ShiftedPatches):
            return self.proj(self.stem(images))  # (B, N, 5CP^2) -> (B, N, D)
        if self.stem is None:
            x = self.proj(images)  # E: (B, C, H, W) -> (B, D, H/P, W/P)
        else:
            x = self.proj(self.stem(images))  # conv stem: (B, C, H, W) -> (B, D, H/P, W/P); E 1x1: D -> D
        return x.flatten(2).transpose(1, 2)  # (B, D, H/P, W/P) -> (B, N, D)


def check_images(images: torch.Tensor, image_size: int, in_channels: int) -> None:
    """Refuse inputs the model was not built for, saying what to do about it."""
    if not isinstance(images, torch.Tensor):  # a NumPy array, a PIL image: PyTorch's own errors name neither
        raise InputError(
            f"expected a torch tensor of images, got {type(images).__name__}; a NumPy array converts with "
            "torch.from_numpy(array), and a photo is classified with foodvit.load_predictor(RUN).classify(photo), "
            "which prepares it as the model was trained"
        )
    if not images.is_floating_point():  # torchvision.io.read_image's uint8
        raise InputError(
            f"expected float images, got {images.dtype}; scale and normalise them as the model's preprocessing does "
            "(images.float() / 255, then the mean and std of its model.json)"
        )
    if images.ndim != 4:
        raise InputError(
            f"expected a batch of images shaped (B, {in_channels}, {image_size}, {image_size}), got a tensor of "
            f"shape {tuple(images.shape)}; add a batch dimension with images.unsqueeze(0)"
        )
    _, C, H, W = images.shape
    if C != in_channels:
        raise InputError(
            f"expected {in_channels} channels, got {C} (shape {tuple(images.shape)}); convert images to RGB, "
            f"e.g. PIL's image.convert('RGB'), or build the model with in_channels={C}"
        )
    if (H, W) != (image_size, image_size):
        raise InputError(
            f"expected {image_size} x {image_size} images, got {H} x {W}; resize them to {image_size} "
            f"(the model's preprocessing does this) or rebuild the model for {H} px with "
            f"foodvit.resize_model(model, {H})"
        )


# ---------------------------------------------------------------------------------------------
# The whole model, Eq. 1 -> Eq. 4
# ---------------------------------------------------------------------------------------------


HEADS = ("head.", "head_dist.")  # parameter-name prefixes of the classifier heads (the head, and deviation 9's)


@dataclass(frozen=True)
class Heads:
    """What the classifier heads read from the final tokens, by name (forward_head(x, heads=True))."""

    pooled: torch.Tensor  # (B, D): Eq. 4's pooled state, which the head reads
    logits: torch.Tensor  # (B, num_classes): Eq. 4, the head on the pooled state
    distilled: torch.Tensor | None  # (B, num_classes): deviation 9, the distillation token's head; None without it

    def prediction(self) -> torch.Tensor:
        """The model's logits: Eq. 4's, or with the distillation token the mean of the two heads' (DeiT)."""
        return self.logits if self.distilled is None else (self.logits + self.distilled) / 2


class VisionTransformer(nn.Module):
    """ViT: Eq. 1 (embed), L blocks of Eq. 2-3, Eq. 4 (normalise, pool, classify).

    Its doors are timm's: forward(images (B, C, H, W)) -> logits (B, num_classes) is
    forward_head(forward_features(images)); forward_intermediates gives what the blocks compute on
    the way (their tokens, or their attention weights). Whatever training or a picture needs from
    inside the model, it asks through these.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        D, T = config.embed_dim, config.num_tokens
        self.patch_embed = PatchEmbed(config)
        if config.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))  # x_class
        if config.distill_token:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, D))  # deviation 9: DeiT's x_distillation
        if config.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, T, D))  # E_pos, 1D, learnable
        elif config.pos_embed == "sincos2d":  # fixed; the class token's position is zero
            fixed = sincos_2d_pos_embed(config.grid_size, D, prefix=config.num_prefix_tokens)
            self.register_buffer("pos_embed", fixed[None], persistent=False)  # (1, T, D)
        self.pos_drop = nn.Dropout(config.dropout)  # App. B.1: "directly after adding positional- to patch embeddings"
        L = config.depth
        rates = [
            config.drop_path * i / (L - 1) if L > 1 else config.drop_path for i in range(L)
        ]  # linear in depth, as DeiT
        self.blocks = nn.ModuleList(Block(config, rate) for rate in rates)
        self.norm = nn.LayerNorm(D, eps=config.layer_norm_eps)
        if config.pool == "seq":
            self.attn_pool = nn.Linear(D, 1)  # deviation 6: one score per token
        self.head = nn.Linear(D, config.num_classes) if config.num_classes > 0 else nn.Identity()
        if config.distill_token:
            self.head_dist = nn.Linear(D, config.num_classes) if config.num_classes > 0 else nn.Identity()
        init_weights(self)

    def _embed(
        self,
        images: torch.Tensor,
        pos_embed: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        mask_token: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos, then dropout. (B, C, H, W) -> (B, T, D).
        pos_embed, mask, mask_token: see forward and forward_features."""
        c = self.config
        side = (
            c.image_size if pos_embed is None else math.isqrt(pos_embed.shape[1] - c.num_prefix_tokens) * c.patch_size
        )
        check_images(images, side, c.in_channels)
        x = self.patch_embed(images)  # (B, C, H, W) -> (B, N, D)
        if mask is not None:
            if mask_token is None or mask.shape != x.shape[:2]:
                raise ValueError(f"a mask needs a mask token and one boolean a patch, {tuple(x.shape[:2])}")
            x = torch.where(mask[..., None], mask_token.reshape(1, 1, -1).to(x.dtype), x)
        prefix = [token for name in ("cls_token", "dist_token") if (token := getattr(self, name, None)) is not None]
        if prefix:  # [x_class; x_distillation; patches] (DeiT's order): (B, N, D) -> (B, T, D)
            x = torch.cat([token.expand(x.shape[0], -1, -1) for token in prefix] + [x], dim=1)
        if pos_embed is not None:
            x = x + pos_embed  # (B, T', D) + (1, T', D)
        elif c.pos_embed != "none":
            x = x + self.pos_embed  # (B, T, D) + (1, T, D)
        return self.pos_drop(x)

    def pos_embed_for_grid(self, grid: int) -> torch.Tensor:
        """E_pos for a grid x grid patches other than the model's own, (1, prefix + grid^2, D), on the
        model's device: the fixed sin-cos embedding of that grid after the prefix tokens' positions
        (deviation 2), or zeros without position embeddings. Computed anew at every call; a caller
        that embeds many batches at one grid keeps it (training/resizing.py)."""
        c = self.config
        if c.pos_embed == "learned":
            raise ConfigError(
                "training at another input size needs fixed position embeddings: use --pos-embed sincos2d "
                "(or none); learned ones exist for one grid"
            )
        like = self.norm.weight  # the model's device and dtype
        if c.pos_embed == "none":
            return like.new_zeros(1, c.num_prefix_tokens + grid * grid, c.embed_dim)  # adds nothing; names the grid
        return sincos_2d_pos_embed(grid, c.embed_dim, prefix=c.num_prefix_tokens).to(self.pos_embed)[None]  # (1, T', D)

    def _encode(
        self,
        images: torch.Tensor,
        take: set[int],
        stop: int,
        attention: bool,
        mask: torch.Tensor | None,
        mask_token: torch.Tensor | None,
        class_only: bool,
        pos_embed: torch.Tensor | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eq. 1, then Eq. 2-3 in blocks 0..stop: the last computed block's output (B, T, D), before the final
        norm, and for each block in `take` its output (B, T, D) or, with `attention`, its weights (B, h, T, T)."""
        last = len(self.blocks) - 1
        if class_only and not self.config.class_token:
            raise ValueError("class_only=True needs a model with a class token")
        if class_only and stop == last and last in take:
            raise ValueError(f"block {last} computes the prefix tokens alone with class_only=True: it cannot be taken")
        x = self._embed(images, pos_embed, mask, mask_token)
        taken = []
        for i, block in enumerate(self.blocks[: stop + 1]):
            queries = self.config.num_prefix_tokens if class_only and i == last else None
            x, weights = block(x, return_attention=attention and i in take, queries=queries)  # Eq. 2 and 3
            if i in take:
                taken.append(weights if attention else x)
        return x, taken

    def forward_intermediates(
        self,
        images: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        *,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        attention: bool = False,
        mask: torch.Tensor | None = None,
        mask_token: torch.Tensor | None = None,
        class_only: bool = False,
        pos_embed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]] | list[torch.Tensor]:
        """What the blocks compute on the way, as timm's forward_intermediates gives it: (final, intermediates),
        the final tokens (B, T, D) of forward_features and one tensor for each block taken, in the blocks'
        order; or the intermediates alone with intermediates_only=True.

        indices: the blocks taken: an int n, the last n; a list, those blocks (0-based, negative from the
        end); None, every block. Each block's output is its patch tokens, the prefix tokens left out:
        (B, D, H/P, W/P) with output_fmt="NCHW", (B, N, D) with "NLC"; norm=True passes them through the
        final LayerNorm first. stop_early=True computes no block after the last one taken (the final
        tokens are then that block's, normalised). attention=True takes the blocks' attention weights
        instead, (B, h, T, T) each, computed on the plain attention path (the attention pictures read them).
        mask, mask_token, class_only, pos_embed: as forward_features (class_only cannot take the last block).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = self._take_indices(indices)
        stop = max(take) if stop_early else len(self.blocks) - 1
        x, taken = self._encode(images, set(take), stop, attention, mask, mask_token, class_only, pos_embed)
        if not attention:
            taken = [self._patch_tokens(self.norm(y) if norm else y, output_fmt) for y in taken]
        return taken if intermediates_only else (self.norm(x), taken)

    def _take_indices(self, indices: int | Sequence[int] | None) -> list[int]:
        """The blocks forward_intermediates takes, in order (timm's feature_take_indices): an int n, the last n;
        a list, those (negative from the end); None, all."""
        L = len(self.blocks)
        if indices is None:
            return list(range(L))
        if isinstance(indices, int):
            if not 0 < indices <= L:
                raise ValueError(f"the last {indices} blocks of a model of {L}: give 1 to {L}")
            return list(range(L - indices, L))
        take = sorted({L + i if i < 0 else i for i in indices})
        if not take or not all(0 <= i < L for i in take):
            raise ValueError(f"blocks {list(indices)}: give one or more of a model's {L} (0 to {L - 1}, or -1 to -{L})")
        return take

    def _patch_tokens(self, tokens: torch.Tensor, output_fmt: str) -> torch.Tensor:
        """A block's output (B, T, D) -> its patch tokens, (B, N, D) (NLC) or on their grid (B, D, g, g) (NCHW)."""
        patches = tokens[:, self.config.num_prefix_tokens :]  # (B, T, D) -> (B, N, D)
        if output_fmt == "NLC":
            return patches
        B, N, D = patches.shape
        g = math.isqrt(N)
        # (B, N, D) -> (B, D, N) -> (B, D, g, g): the same numbers as timm's, but a view of the tokens rather than a
        # copy in (B, D, g, g)'s own memory order. It matters to a convolution that reads it (locality guidance's
        # adapters): PyTorch picks the convolution's kernel from the input's strides, and another layout sums in
        # another order (a batch of one photo, bias gradients), so the trained numbers would drift from these
        return patches.transpose(1, 2).reshape(B, D, g, g)

    def forward_features(
        self,
        images: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        mask_token: torch.Tensor | None = None,
        class_only: bool = False,
        pos_embed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eq. 1-3 and the final LayerNorm of Eq. 4: (B, C, H, W) -> the final tokens (B, T, D).

        mask: (B, N) booleans, True for the patches whose embedding x_p^i E is replaced by mask_token
        (D,) or (1, 1, D) before the position embedding is added (masked-patch training): the position
        stays known, the content does not. The caller owns the token (training/objectives/masked.py).
        class_only=True returns only the prefix tokens' final states, (B, 1, D) (the class token;
        (B, 2, D) with the distillation token), and the last block computes nothing else: Eq. 4 reads
        z_L^0 alone, and no other token's output of the last block reaches it. Every token still
        serves as a key and value there, so z_L^0 is unchanged while that block's U_msa and MLP run
        on 1 token instead of T (ViT-B/16: 1/16 fewer FLOPs). pos_embed: another grid's E_pos (see forward).
        """
        x, _ = self._encode(images, set(), len(self.blocks) - 1, False, mask, mask_token, class_only, pos_embed)
        return self.norm(x)  # LN of Eq. 4

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 4's z_L^0: the class token's state (B, T, D) -> (B, D); or the patch-token mean
        (deviation 1); or their attention-weighted mean (deviation 6)."""
        if self.config.pool == "cls":
            return x[:, 0]
        patches = x[:, self.config.num_prefix_tokens :]  # (B, N, D)
        if self.config.pool == "gap":
            return patches.mean(dim=1)
        weights = self.attn_pool(patches).softmax(dim=1)  # (B, N, D) -> (B, N, 1)
        return (weights * patches).sum(dim=1)  # (B, N, D) -> (B, D)

    @overload
    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor: ...
    @overload
    def forward_head(self, x: torch.Tensor, pre_logits: Literal[False] = False, *, heads: Literal[True]) -> Heads: ...
    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, *, heads: bool = False) -> torch.Tensor | Heads:
        """The final tokens (B, T, D) -> the model's logits (B, num_classes): Eq. 4; with the distillation
        token, the mean of its head's logits and Eq. 4's (DeiT's prediction).
        pre_logits=True: the pooled state (B, D) the head reads (timm's convention).
        heads=True: every head's logits by name, and the pooled state, as Heads (training reads them apart:
        the classes' cross-entropy reads Eq. 4's head, distillation the distillation token's)."""
        pooled = self._pool(x)
        if pre_logits:
            return pooled
        logits = self.head(pooled)  # Eq. 4: y = LN(z_L^0), then the linear head
        # the distillation token follows x_class: the last prefix token
        distilled = self.head_dist(x[:, self.config.num_prefix_tokens - 1]) if self.config.distill_token else None
        both = Heads(pooled, logits, distilled)
        return both if heads else both.prediction()

    def forward(self, images: torch.Tensor, pos_embed: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) -> logits (B, num_classes): Eq. 1-4. pos_embed: E_pos of another patch grid, (1, T', D),
        for images of that grid's side (progressive resizing trains at a smaller one; pos_embed_for_grid builds
        it); by default the model's own, for images of its own side."""
        x = self.forward_features(images, class_only=self.config.class_only_last_block, pos_embed=pos_embed)
        return self.forward_head(x)

    def set_fused_attention(self, fused: bool) -> VisionTransformer:
        """Choose scaled_dot_product_attention (True) or the plain math path (False) in every block."""
        for block in self.blocks:
            assert isinstance(block, Block)
            block.attn.fused = fused
        return self

    def reset_head(self, num_classes: int) -> None:
        """A new zero-initialised head, as the paper fine-tunes (section 3.2)."""
        self.config = self.config.replace(num_classes=num_classes)
        for name in ("head", "head_dist") if self.config.distill_token else ("head",):
            head = nn.Linear(self.config.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
            setattr(self, name, head.to(device=self.norm.weight.device, dtype=self.norm.weight.dtype))
            init_head(head)

    def no_weight_decay(self) -> set[str]:
        """Parameters an optimiser should not decay: the class and distillation tokens and the position embedding."""
        return {name for name in ("cls_token", "dist_token", "pos_embed") if name in dict(self.named_parameters())}
