"""Weight files and layouts: torchvision's vit_*, timm's vit_*, and foodvit's own.

foodvit names its parameters as timm does (cls_token, pos_embed, patch_embed.proj, blocks.i.attn.qkv,
...), so a timm state dict needs no renaming; foodvit's own files are safetensors whose metadata
carries the model configuration. torchvision's names are mapped by the table below. Reading never
runs pickled code: safetensors, or torch.load(weights_only=True).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from foodvit.errors import InputError
from foodvit.files import atomic_write, parse_json
from foodvit.model.blocks import Block
from foodvit.model.positions import resample_pos_embed
from foodvit.model.vit import HEADS, VisionTransformer
from foodvit.settings.model import ViTConfig

StateDict = dict[str, torch.Tensor]

# torchvision name -> foodvit (= timm) name; "{i}" is the block index.
_TORCHVISION = [
    ("class_token", "cls_token"),
    ("conv_proj.weight", "patch_embed.proj.weight"),
    ("conv_proj.bias", "patch_embed.proj.bias"),
    ("encoder.pos_embedding", "pos_embed"),
    ("encoder.layers.encoder_layer_{i}.ln_1.weight", "blocks.{i}.norm1.weight"),
    ("encoder.layers.encoder_layer_{i}.ln_1.bias", "blocks.{i}.norm1.bias"),
    ("encoder.layers.encoder_layer_{i}.self_attention.in_proj_weight", "blocks.{i}.attn.qkv.weight"),
    ("encoder.layers.encoder_layer_{i}.self_attention.in_proj_bias", "blocks.{i}.attn.qkv.bias"),
    ("encoder.layers.encoder_layer_{i}.self_attention.out_proj.weight", "blocks.{i}.attn.proj.weight"),
    ("encoder.layers.encoder_layer_{i}.self_attention.out_proj.bias", "blocks.{i}.attn.proj.bias"),
    ("encoder.layers.encoder_layer_{i}.ln_2.weight", "blocks.{i}.norm2.weight"),
    ("encoder.layers.encoder_layer_{i}.ln_2.bias", "blocks.{i}.norm2.bias"),
    ("encoder.layers.encoder_layer_{i}.mlp.0.weight", "blocks.{i}.mlp.fc1.weight"),
    ("encoder.layers.encoder_layer_{i}.mlp.0.bias", "blocks.{i}.mlp.fc1.bias"),
    ("encoder.layers.encoder_layer_{i}.mlp.3.weight", "blocks.{i}.mlp.fc2.weight"),
    ("encoder.layers.encoder_layer_{i}.mlp.3.bias", "blocks.{i}.mlp.fc2.bias"),
    ("encoder.ln.weight", "norm.weight"),
    ("encoder.ln.bias", "norm.bias"),
    ("heads.head.weight", "head.weight"),
    ("heads.head.bias", "head.bias"),
]
# torchvision before 0.13 named the MLP's linears linear_1 / linear_2.
_TORCHVISION_OLD_MLP = {"mlp.linear_1.": "mlp.0.", "mlp.linear_2.": "mlp.3."}
# Wrappers that training code puts around names: DistributedDataParallel, torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Keys under which checkpoints nest their state dict (timm's train.py, ours, common scripts).
_NESTED = ("model", "state_dict", "model_state", "model_state_dict", "ema", "state_dict_ema")


def _compile(pairs, src: int):
    table = []
    for pair in pairs:
        pattern = re.escape(pair[src]).replace(r"\{i\}", r"(?P<i>\d+)")
        table.append((re.compile(f"^{pattern}$"), pair[1 - src]))
    return table


_FROM_TV, _TO_TV = _compile(_TORCHVISION, 0), _compile(_TORCHVISION, 1)


def _rename(state: Mapping[str, torch.Tensor], table, layout: str) -> StateDict:
    out = {}
    for key, value in state.items():
        for pattern, target in table:
            m = pattern.match(key)
            if m:
                out[target.replace("{i}", m.groupdict().get("i") or "")] = value
                break
        else:
            raise InputError(
                f"{layout} state dict has a key foodvit does not know: {key!r} (a ViT variant foodvit does not build?)"
            )
    return out


# Key parts of foodvit's deviation modules that timm's and torchvision's ViTs lack: what each is.
DEVIATION_KEYS = {
    "patch_embed.stem.": "convolutional stem (deviation 5)",
    ".mlp.conv.": "convolution in its MLP (deviation 12)",
}
ZERO_START = ".mlp.conv."  # deviation 12's filters: weights without them load, the filters at zero (their start)


def _deviation_key(state: Mapping[str, torch.Tensor]) -> tuple[str, str] | None:
    """The first key of a deviation module in `state` and what that module is, or None."""
    return next(((k, what) for k in state for part, what in DEVIATION_KEYS.items() if part in k), None)


def _refuse_deviations(state: Mapping[str, torch.Tensor], library: str) -> None:
    if found := _deviation_key(state):
        key, what = found
        raise InputError(
            f"{library}'s VisionTransformer has no {what}; cannot export {key!r} ...: "
            "export this model as 'foodvit' weights or an .onnx file"
        )


def detect_layout(state: Mapping[str, torch.Tensor]) -> str:
    """'torchvision', 'timm' or 'foodvit' (timm's names plus foodvit's deviation modules)."""
    keys = set(state)
    if "conv_proj.weight" in keys or any(k.startswith("encoder.layers.") for k in keys):
        return "torchvision"
    if "patch_embed.proj.weight" in keys or any(k.startswith("blocks.") for k in keys):
        return "foodvit" if _deviation_key(state) else "timm"
    sample = ", ".join(sorted(keys)[:5])
    raise InputError(
        "cannot tell the layout of these weights: expected torchvision's vit_* keys (conv_proj.weight, "
        f"encoder.layers...) or timm's / foodvit's (patch_embed.proj.weight, blocks.0...), found {sample} ..."
    )


def from_torchvision(state: Mapping[str, torch.Tensor]) -> StateDict:
    """torchvision vit_* state dict -> foodvit (= timm) names. Tensors are shared, not copied."""
    if any(k.startswith("heads.pre_logits") for k in state):
        raise InputError(
            "these torchvision weights have a representation layer (heads.pre_logits, representation_size); "
            "the paper drops it for fine-tuning and foodvit does not build it"
        )
    fixed = {}
    for key, value in state.items():
        for old, new in _TORCHVISION_OLD_MLP.items():
            key = key.replace(old, new)
        fixed[key] = value
    return _rename(fixed, _FROM_TV, "torchvision")


def to_torchvision(state: Mapping[str, torch.Tensor]) -> StateDict:
    """foodvit state dict -> torchvision vit_* names (paper-default models only)."""
    _refuse_deviations(state, "torchvision")
    return _rename(state, _TO_TV, "foodvit")


def to_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    """foodvit state dict -> timm vit_* names: the same names, checked."""
    _refuse_deviations(state, "timm")
    return dict(state)


def export_weights(model: nn.Module, layout: str = "timm") -> StateDict:
    """The model's weights in torchvision's or timm's layout (detached tensors, shared storage)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if layout == "torchvision":
        return to_torchvision(state)
    if layout in ("timm", "foodvit"):
        return to_timm(state) if layout == "timm" else state
    raise InputError(f"unknown layout {layout!r}; expected 'torchvision', 'timm' or 'foodvit'")


def unwrap(state: Mapping) -> StateDict:
    """Find the state dict inside a training checkpoint and strip DDP / compile prefixes."""
    for key in _NESTED:
        if (
            key in state
            and isinstance(state[key], Mapping)
            and state[key]
            and all(isinstance(v, torch.Tensor) for v in state[key].values())
        ):
            state = state[key]
            break
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        found = ", ".join(f"{k} ({type(v).__name__})" for k, v in list(state.items())[:5])
        raise InputError(
            f"expected a state dict of tensors (or a checkpoint holding one under {', '.join(_NESTED)}), found {found}"
        )
    out = {}
    for key, value in state.items():
        for prefix in _WRAPPER_PREFIXES:
            while key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def read_weights(path: str | Path) -> tuple[StateDict, dict[str, str]]:
    """(state dict, metadata) from a .safetensors, .pth, .pt, .bin or .ckpt file. Never unpickles code."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
        except (SafetensorError, OSError, ValueError) as err:
            raise InputError(f"{path} is not a readable safetensors file ({err}); was the download cut short?") from err
    if path.suffix not in (".pth", ".pt", ".bin", ".ckpt"):
        raise InputError(f"{path}: expected a .safetensors, .pth, .pt, .bin or .ckpt weights file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the pickle reader's errors vary by cause and torch version
        raise InputError(
            f"cannot read {path} as PyTorch weights ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            "foodvit loads only plain tensors (weights_only=True), never pickled code"
        ) from err
    if not isinstance(obj, Mapping):
        raise InputError(f"{path} holds a {type(obj).__name__}, not a state dict")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    return unwrap(obj), {k: str(v) for k, v in meta.items()}


def to_foodvit(state: Mapping[str, torch.Tensor]) -> tuple[StateDict, str]:
    """Any supported layout -> foodvit names; also says which layout it was."""
    state = unwrap(state)
    layout = detect_layout(state)
    return (from_torchvision(state) if layout == "torchvision" else dict(state)), layout


def load_weights(
    model: VisionTransformer,
    source: str | Path | Mapping[str, torch.Tensor],
    *,
    skip_head: bool = False,
    resample_mode: str = "bicubic",
) -> VisionTransformer:
    """Load weights in torchvision's, timm's or foodvit's layout into `model`, strictly.

    A position embedding for another grid is resampled (paper section 3.2). skip_head=True keeps
    the model's own head (transfer learning: a new head for new classes). Returns the model.
    """
    state = read_weights(source)[0] if isinstance(source, (str, Path)) else source
    state, layout = to_foodvit(state)
    if skip_head:
        state = {k: v for k, v in state.items() if not k.startswith(HEADS)}
    own = model.state_dict()
    if "pos_embed" in state and "pos_embed" in own and state["pos_embed"].shape != own["pos_embed"].shape:
        state["pos_embed"] = _resample_for(model.config, state["pos_embed"], resample_mode)
    zero_start = [k for k in own if k not in state and ZERO_START in k] if model.config.mlp_conv else []
    missing = [k for k in own if k not in state and k not in zero_start and not (skip_head and k.startswith(HEADS))]
    unexpected = [k for k in state if k not in own]
    wrong = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
        for k in state
        if k in own and state[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        raise InputError(_mismatch_message(layout, model.config, missing, unexpected, wrong))
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)
        for key in zero_start:  # weights without deviation 12: its filters start at zero, the weights' own function
            own[key].zero_()
    return model


def _resample_for(config: ViTConfig, pos_embed: torch.Tensor, mode: str) -> torch.Tensor:
    D = config.embed_dim
    if pos_embed.shape[-1] != D:
        return pos_embed  # reported as a shape mismatch by the caller
    return resample_pos_embed(pos_embed, config.grid_size, config.num_prefix_tokens, mode=mode)


def _mismatch_message(layout, config, missing, unexpected, wrong) -> str:
    lines = [
        f"these {layout}-layout weights do not fit the model (image {config.image_size}, patch {config.patch_size}, "
        f"D {config.embed_dim}, depth {config.depth}, heads {config.num_heads}, classes {config.num_classes}):"
    ]
    if wrong:
        lines.append("  shapes differ: " + "; ".join(wrong[:6]) + (" ..." if len(wrong) > 6 else ""))
    if missing:
        lines.append("  missing from the weights: " + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""))
    if unexpected:
        lines.append("  not in the model: " + ", ".join(unexpected[:6]) + (" ..." if len(unexpected) > 6 else ""))
    if any(k.startswith("head.") for k in (w.split(":")[0] for w in wrong)):
        lines.append("  the head differs: pass skip_head=True (--pretrained does) to train a new head for your classes")
    else:
        lines.append(
            "  build the model the weights were trained as (e.g. foodvit.create_model('ViT-B/16', ...)) and try again"
        )
    return "\n".join(lines)


def save_weights(model: VisionTransformer, path: str | Path, metadata: Mapping[str, object] | None = None) -> Path:
    """Write the model's state dict as safetensors (atomically) with its config in the metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    meta = {"format": "foodvit", "config": json.dumps(model.config.__dict__)}
    meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=meta))
    return path


def config_from_metadata(metadata: Mapping[str, str]) -> ViTConfig | None:
    """The ViTConfig a foodvit safetensors file was saved with, if any."""
    if "config" not in metadata:
        return None
    return ViTConfig(**parse_json(metadata["config"]))


def resize_model(model: VisionTransformer, image_size: int, mode: str = "bicubic") -> VisionTransformer:
    """A copy of `model` rebuilt for another image size, position embeddings resampled (section 3.2)."""
    new = VisionTransformer(model.config.replace(image_size=image_size))
    new.to(next(model.parameters()).device)
    return load_weights(new, model.state_dict(), resample_mode=mode)


def to_torch_encoder(model: VisionTransformer) -> nn.Sequential:
    """The course's exercise: the same encoder as a stack of torch.nn.TransformerEncoderLayer.

    norm_first=True is Eq. 2-3's pre-norm, activation='gelu' the MLP's GELU, batch_first=True
    our (B, T, D) layout. Our weights are copied in; outputs agree with our blocks (tests) in eval
    mode or with dropout 0: in training PyTorch's layer also drops attention weights at `dropout`.
    """
    c = model.config
    if c.mlp_conv or c.locality:
        raise InputError(
            "torch.nn.TransformerEncoderLayer has no place for locality self-attention (--locality) or the "
            "MLP's convolution (--mlp-conv): build the model without them for this exercise"
        )
    layers = []
    for block in model.blocks:
        assert isinstance(block, Block)  # nn.ModuleList yields its items as plain Modules
        layer = nn.TransformerEncoderLayer(
            c.embed_dim,
            c.num_heads,
            dim_feedforward=c.mlp_dim,
            dropout=c.dropout,
            activation="gelu",
            layer_norm_eps=c.layer_norm_eps,
            batch_first=True,
            norm_first=True,
        )
        pairs = [
            (layer.self_attn.in_proj_weight, block.attn.qkv.weight),
            (layer.self_attn.in_proj_bias, block.attn.qkv.bias),
            (layer.self_attn.out_proj.weight, block.attn.proj.weight),
            (layer.self_attn.out_proj.bias, block.attn.proj.bias),
            (layer.linear1.weight, block.mlp.fc1.weight),
            (layer.linear1.bias, block.mlp.fc1.bias),
            (layer.linear2.weight, block.mlp.fc2.weight),
            (layer.linear2.bias, block.mlp.fc2.bias),
            (layer.norm1.weight, block.norm1.weight),
            (layer.norm1.bias, block.norm1.bias),
            (layer.norm2.weight, block.norm2.weight),
            (layer.norm2.bias, block.norm2.bias),
        ]
        with torch.no_grad():
            for theirs, ours in pairs:
                theirs.copy_(ours)
        layers.append(layer)
    return nn.Sequential(*layers).to(next(model.parameters()).device)
