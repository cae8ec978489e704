"""Pre-trained weights for transfer learning: `--pretrained SPEC`.

SPEC is
  torchvision:WEIGHTS   torchvision's weights API (hash-checked, cached in $TORCH_HOME), e.g.
                        torchvision:IMAGENET1K_V1, torchvision:DEFAULT, torchvision:IMAGENET1K_SWAG_E2E_V1,
                        or with the model named: torchvision:vit_b_32.IMAGENET1K_V1
  timm:NAME             timm / the Hugging Face hub, e.g. timm:vit_base_patch16_224.augreg2_in21k_ft_in1k
                        (the timm extra: pip install 'foodvit[timm]')
  a path                a .safetensors / .pth / .pt / .bin file in torchvision's, timm's or foodvit's layout

The variant (size, patch, resolution) comes from the weights where they say it; the preprocessing
(resize, crop, mean, std, interpolation) too. As the paper fine-tunes (section 3.2), the head is
replaced by a zero-initialised one for the new classes, and a new resolution interpolates the
position embeddings.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from foodvit.data.preprocess import Preprocess, make_preprocess
from foodvit.errors import FoodVitError
from foodvit.model.variants import (
    DEFAULT_MEAN,
    DEFAULT_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    SIZES,
    create_model,
    get_variant,
)
from foodvit.model.vit import VisionTransformer
from foodvit.settings.model import ViTConfig, VitSettings
from foodvit.settings.run import RunConfig

# torchvision's ViT builders and the paper names they build
TORCHVISION_MODELS = {
    "vit_b_16": "ViT-B/16",
    "vit_b_32": "ViT-B/32",
    "vit_l_16": "ViT-L/16",
    "vit_l_32": "ViT-L/32",
    "vit_h_14": "ViT-H/14",
}
_TIMM_NAME = re.compile(r"^vit_(tiny|small|base|large|huge)_patch(\d+)_(\d+)")
_TIMM_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}
# Settings of the model that the weights fix; a recipe's values for these are not applied.
ARCHITECTURE = (
    "patch_size",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_dim",
    "pool",
    "pos_embed",
    "class_token",
    "stem",
    "layer_norm_eps",
)
DOWNLOAD_TIMEOUT = 20.0


class PretrainedError(FoodVitError, ValueError):
    """Weights that cannot be had or used; the message says what to do."""


@dataclass(frozen=True)
class Pretrained:
    spec: str
    kind: str  # torchvision, timm, file
    variant: str | None  # "ViT-B/16", None where the spec alone does not say
    image_size: int | None
    preprocess: Preprocess | None
    model_config: ViTConfig | None = None  # foodvit files carry their exact architecture

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights (downloading them if needed; every connection times out by itself, nothing
        process-wide is changed)."""
        if self.kind == "file":
            from foodvit.model.weights import read_weights

            return read_weights(self.spec)[0]
        try:
            if self.kind == "torchvision":
                return _torchvision_state_dict(_torchvision_weights(self.spec, self.variant))
            return _timm_state_dict(self.spec.split(":", 1)[1])
        except PretrainedError:
            raise
        except (OSError, RuntimeError, ValueError, ImportError, TimeoutError) as err:
            raise PretrainedError(
                f"could not download the weights {self.spec} ({type(err).__name__}: {str(err).splitlines()[0][:200]}). "
                "Without internet, pass a local weights file instead: --pretrained /path/to/weights.pth "
                "(torchvision, timm or foodvit layout)"
            ) from err


def _torchvision_state_dict(weights) -> dict[str, torch.Tensor]:
    """torchvision's weights file, downloaded once into torch.hub's cache ($TORCH_HOME) as
    torchvision does, its SHA-256 checked against the prefix in the file name."""
    import urllib.parse

    from torch.hub import HASH_REGEX, get_dir

    from foodvit.files import download

    name = Path(urllib.parse.urlparse(weights.url).path).name
    target = Path(get_dir()) / "checkpoints" / name
    if not target.is_file():
        expected = HASH_REGEX.search(name)
        download(weights.url, target, timeout=DOWNLOAD_TIMEOUT, sha256_prefix=expected.group(1) if expected else None)
    return torch.load(target, map_location="cpu", weights_only=True)


def _torchvision_weights(spec: str, variant: str | None):
    from torchvision.models import get_model_weights

    name = spec.split(":", 1)[1]
    builder, _, member = name.rpartition(".")
    builder = builder.lower().removesuffix("_weights")
    if not builder:
        builder = next((k for k, v in TORCHVISION_MODELS.items() if v == variant), "vit_b_16")
    if builder not in TORCHVISION_MODELS:
        raise PretrainedError(
            f"torchvision has no ViT called {builder!r}; expected one of {', '.join(TORCHVISION_MODELS)}"
        )
    enum = get_model_weights(builder)
    if member not in enum.__members__:
        raise PretrainedError(
            f"torchvision's {builder} has no weights {member!r}; expected one of {', '.join(enum.__members__)}"
        )
    return enum[member]


def _timm_state_dict(name: str) -> dict[str, torch.Tensor]:
    """timm's weights for a name, from the Hugging Face hub cache or a download.

    The hub client retries an unreachable server for about a minute; one short probe first makes
    an offline machine fail within seconds instead.
    """
    get_pretrained_cfg = _timm_configs()
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError

    from foodvit.model.weights import read_weights

    cfg = get_pretrained_cfg(name)
    repo = cfg.hf_hub_id if cfg is not None else None
    if not repo:
        raise PretrainedError(
            f"timm's weights {name!r} are not on the Hugging Face hub; download them and pass the file"
        )
    for filename in ("model.safetensors", "pytorch_model.bin"):
        cached = try_to_load_from_cache(repo, filename)
        if isinstance(cached, str):
            return read_weights(cached)[0]  # snapshots/<revision>/<filename>
    _probe("https://huggingface.co")
    try:
        path = hf_hub_download(repo, "model.safetensors")
    except EntryNotFoundError:  # older uploads carry a .bin only (a network error is not that: it propagates)
        path = hf_hub_download(repo, "pytorch_model.bin")
    return read_weights(path)[0]


def _probe(url: str) -> None:
    import urllib.request

    from foodvit.files import open_url

    try:
        open_url(urllib.request.Request(url, method="HEAD"), timeout=DOWNLOAD_TIMEOUT).close()
    except OSError as err:  # URLError, timeouts and refused connections are all OSErrors
        raise OSError(f"{url} is unreachable: {getattr(err, 'reason', err)}") from err


def _preprocess_from_torchvision(weights) -> Preprocess:
    t = weights.transforms()  # resize the shorter side, centre-crop (SWAG E2E: 384 and 384)
    return Preprocess(t.crop_size[0], t.resize_size[0], "crop", tuple(t.mean), tuple(t.std), t.interpolation.value)


def _timm_configs():
    """timm's get_pretrained_cfg, or a one-line error naming the extra that brings timm (and the hub's client)."""
    try:
        from timm.models import get_pretrained_cfg
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] != "timm":  # timm there, but something it needs missing: its own error
            raise
        raise PretrainedError(
            "--pretrained timm:NAME needs timm, which comes with the timm extra: pip install 'foodvit[timm]'"
        ) from None
    return get_pretrained_cfg


def _preprocess_from_timm(name: str) -> tuple[str, int, Preprocess]:
    get_pretrained_cfg = _timm_configs()
    cfg = get_pretrained_cfg(name)
    arch = name.split(".")[0]
    match = _TIMM_NAME.match(arch)
    if match is None:
        raise PretrainedError(
            f"timm model {name!r} is not a plain ViT foodvit builds; "
            "expected vit_<tiny|small|base|large|huge>_patch<P>_<size>[.tag]"
        )
    variant = f"ViT-{_TIMM_SIZES[match[1]]}/{match[2]}"
    if cfg is None:
        raise PretrainedError(f"timm knows no pre-trained weights {name!r}; see timm.list_pretrained('vit_*')")
    size = cfg.input_size[-1]
    interpolation = cfg.interpolation if cfg.interpolation in ("bilinear", "bicubic") else "bicubic"
    return variant, size, make_preprocess(size, tuple(cfg.mean), tuple(cfg.std), "crop", cfg.crop_pct, interpolation)


def infer_variant(state: dict[str, torch.Tensor]) -> tuple[str, int]:
    """(paper name, image size) of a state dict in any layout, from its tensor shapes and Table 1."""
    from foodvit.model.weights import to_foodvit

    state, _ = to_foodvit(state)
    D, _, P, _ = state["patch_embed.proj.weight"].shape
    depth = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    M = state["blocks.0.mlp.fc1.weight"].shape[0]
    size = next((key for key, s in SIZES.items() if (s.depth, s.embed_dim, s.mlp_dim) == (depth, D, M)), None)
    if size is None:
        raise PretrainedError(
            f"these weights (depth {depth}, width {D}, MLP {M}) match no row of Table 1; "
            "foodvit cannot tell their heads"
        )
    tokens = state["pos_embed"].shape[1] if "pos_embed" in state else None
    grid = math.isqrt(tokens - 1) if tokens else 224 // P
    return f"ViT-{size}/{P}", grid * P


def resolve(spec: str, model_hint: str | None = None) -> Pretrained:
    """What a SPEC names, without downloading anything."""
    if spec.startswith("torchvision:"):
        weights = _torchvision_weights(spec, model_hint)
        builder = weights.__class__.__name__.removesuffix("_Weights").lower()
        pre = _preprocess_from_torchvision(weights)
        return Pretrained(spec, "torchvision", TORCHVISION_MODELS[builder], pre.image_size, pre)
    if spec.startswith("timm:"):
        variant, size, pre = _preprocess_from_timm(spec.split(":", 1)[1])
        return Pretrained(spec, "timm", variant, size, pre)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PretrainedError(
            f"--pretrained {spec!r}: expected torchvision:WEIGHTS, timm:NAME or an existing weights file"
        )
    from foodvit.model.weights import config_from_metadata, detect_layout, read_weights, unwrap

    state, meta = read_weights(path)
    config = config_from_metadata(meta)
    if config is not None:  # a foodvit file knows everything
        saved = Preprocess.from_dict(_json(meta["preprocess"])) if "preprocess" in meta else None
        return Pretrained(str(path), "file", _name_of(config), config.image_size, saved, config)
    variant, size = infer_variant(state)
    layout = detect_layout(unwrap(state))
    # torchvision's weights use ImageNet statistics (resize 256, crop 224); timm's ViTs mostly [-1, 1]
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if layout == "torchvision" else (DEFAULT_MEAN, DEFAULT_STD)
    return Pretrained(
        str(path), "file", variant, size, Preprocess(size, int(math.floor(size / 0.875)), "crop", mean, std)
    )


def _json(text: str):
    from foodvit.files import parse_json

    return parse_json(text)


def _name_of(config) -> str | None:
    for key, s in SIZES.items():
        if (s.depth, s.embed_dim, s.mlp_dim, s.num_heads) == (
            config.depth,
            config.embed_dim,
            config.mlp_dim,
            config.num_heads,
        ):
            return f"ViT-{key}/{config.patch_size}"
    return None


def adapt_config(config: RunConfig, explicit_model: str | None = None) -> RunConfig:
    """The run's config with the model the weights dictate. A --model that disagrees stops the run;
    architecture settings give way to the weights' (resolution and regularisation settings stay)."""
    hint = explicit_model or (config.model if config.model in TORCHVISION_MODELS.values() else None)
    source = resolve(config.train.pretrained, hint)
    variant = source.variant or hint
    if explicit_model and variant and get_variant(explicit_model).name != get_variant(variant).name:
        raise PretrainedError(
            f"--model {explicit_model} does not match the weights {config.train.pretrained}, which are {variant}; "
            f"drop --model or choose weights for {explicit_model}"
        )
    vit = {k: v for k, v in config.vit.given().items() if k not in ARCHITECTURE}
    return replace(config, model=variant or "ViT-B/16", vit=VitSettings(**vit))


def pretrained_model(config: RunConfig, num_classes: int) -> tuple[VisionTransformer, Preprocess]:
    """A model initialised from the weights, with a new zero head, and its preprocessing."""
    from foodvit.model.weights import load_weights

    source = resolve(config.train.pretrained, config.model)
    vit = config.vit.given()
    image_size = vit.pop("image_size", None) or source.image_size or get_variant(config.model).image_size
    if source.model_config is not None:  # a foodvit file: its own architecture, deviations included
        kept = {k: v for k, v in vit.items() if k not in ARCHITECTURE}
        model = VisionTransformer(source.model_config.replace(num_classes=num_classes, image_size=image_size, **kept))
    else:
        model = create_model(config.model, num_classes=num_classes, image_size=image_size, **vit)
    load_weights(model, source.state_dict(), skip_head=True)  # resamples E_pos for a new resolution
    model.reset_head(num_classes)  # zero-initialised, as the paper fine-tunes
    return model, _preprocess_for(source, image_size, config)


def _preprocess_for(source: Pretrained, image_size: int, config: RunConfig) -> Preprocess:
    """The weights' preprocessing, scaled to a new resolution when fine-tuning at another size."""
    base = source.preprocess or make_preprocess(image_size, DEFAULT_MEAN, DEFAULT_STD)
    d = config.data
    return replace(base.at_size(image_size), mean=tuple(d.mean) or base.mean, std=tuple(d.std) or base.std)
