"""Transfer learning from pre-trained weights. No network: the tests write their own
"pre-trained" files (random weights in torchvision's and timm's layouts)."""

import socket
import time

import pytest
import timm
import torch
import torchvision
from helpers import make_photo_folder, randomize_
from PIL import Image

import foodvit
from foodvit.cli.main import main
from foodvit.data.transforms import eval_transform
from foodvit.model.pretrained import PretrainedError, infer_variant, resolve
from foodvit.model.weights import from_torchvision


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Generated photos, even with FOODVIT_DATA set: a frozen backbone's properties (its weights as loaded, the head
    alone trained) show on one training and one test photo a class, and a ViT at 224 px costs about a second a photo
    here (FoodVision Mini's 300 would be minutes of the suite; real data: test_data, test_train)."""
    return str(make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=1, n_test=1, size=(240, 260)))


def _train(args):
    assert main(["train", "--quiet", "--epochs", "1", *args]) == 0


def _assert_backbone_identical(run, reference: dict):
    model = foodvit.load_model(run)
    state = model.state_dict()
    backbone = {k: v for k, v in reference.items() if not k.startswith("head.")}
    assert backbone.keys() == {k for k in state if not k.startswith("head.")}
    assert all(torch.equal(state[k], v) for k, v in backbone.items())
    assert model.head.weight.shape[0] == 3 and reference["head.weight"].shape[0] == 1000  # a new head


@pytest.mark.slow  # a ViT at 224 px; the fast tier keeps freezing (test_freezing), torchvision's layout (test_weights)
def test_torchvision_file_as_frozen_feature_extractor(photos, tmp_path):
    # torchvision's ViT class and layout (its vit_b_16 file's names, encoder.layers.encoder_layer_N...) at ViT-Ti/16's
    # size, which the file's shapes name: the same conversion and statistics as vit_b_16's, at a fifteenth of its cost
    from torchvision.models.vision_transformer import VisionTransformer

    tiny = VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768)
    source = randomize_(tiny).state_dict()
    assert "encoder.layers.encoder_layer_11.self_attention.in_proj_weight" in source  # torchvision's names
    torch.save(source, tmp_path / "vit_ti_16.pth")
    run = tmp_path / "fe"
    _train(
        [
            "--pretrained",
            str(tmp_path / "vit_ti_16.pth"),
            "--freeze-backbone",
            "true",
            "--data",
            photos,
            "--out",
            str(run),
            "--augment",
            "none",
            "--batch-size",
            "32",
        ]
    )
    _assert_backbone_identical(run, from_torchvision(source))
    predictor = foodvit.load_predictor(run)
    model = predictor.model
    assert model.config.embed_dim == 192 and model.config.depth == 12
    assert model.config.image_size == 224 and predictor.preprocess.mean == (
        0.485,
        0.456,
        0.406,
    )  # torchvision's statistics
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    trained = [p for group in ckpt["optimizer"]["param_groups"] for p in group["params"]]
    assert (
        len(trained) == 2 and len(ckpt["optimizer"]["state"]) == 2
    )  # head weight and bias only: no state for the frozen


@pytest.mark.slow  # a ViT-S/16 at 224 px; the fast tier keeps freezing (test_freezing) and weight files of every
# format (test_weights)
def test_timm_vit_s16_safetensors_as_frozen_feature_extractor(photos, tmp_path):
    from safetensors.torch import save_file

    source = randomize_(timm.create_model("vit_small_patch16_224")).state_dict()
    save_file({k: v.contiguous() for k, v in source.items()}, str(tmp_path / "vit_s.safetensors"))
    run = tmp_path / "fe_timm"
    _train(
        [
            "--pretrained",
            str(tmp_path / "vit_s.safetensors"),
            "--freeze-backbone",
            "true",
            "--data",
            photos,
            "--out",
            str(run),
        ]
    )
    _assert_backbone_identical(run, source)
    assert foodvit.load_model(run).config.embed_dim == 384


@pytest.mark.slow  # a ViT-Ti/16 at 384 px; the fast tier keeps position resampling (test_weights) and a pre-trained
# run resumed (test_run_directory)
def test_finetuning_at_384_from_a_224_file_interpolates_positions(tmp_path):
    photos = make_photo_folder(tmp_path / "p", n_train=1, n_test=1, size=(100, 120))
    source = randomize_(timm.create_model("vit_tiny_patch16_224"))
    torch.save(source.state_dict(), tmp_path / "ti.pth")
    run = tmp_path / "ft384"
    _train(
        [
            "--recipe",
            "finetune",
            "--pretrained",
            str(tmp_path / "ti.pth"),
            "--image-size",
            "384",
            "--data",
            str(photos),
            "--out",
            str(run),
            "--batch-size",
            "3",
        ]
    )
    predictor = foodvit.load_predictor(run)
    model = predictor.model
    assert model.pos_embed.shape == (1, 577, 192) and model.config.image_size == 384
    assert predictor.preprocess.image_size == 384 and predictor.preprocess.resize_size == round(384 * 256 / 224)
    assert model(torch.randn(1, 3, 384, 384)).shape == (1, 3)


def test_stored_preprocessing_equals_torchvision_weights_transforms():
    from torchvision.models import ViT_B_16_Weights

    image = Image.new("RGB", (500, 375), (90, 140, 30))
    image.paste((200, 20, 20), (100, 80, 300, 250))
    for spec, weights in (
        ("torchvision:IMAGENET1K_V1", ViT_B_16_Weights.IMAGENET1K_V1),
        ("torchvision:DEFAULT", ViT_B_16_Weights.DEFAULT),
        ("torchvision:IMAGENET1K_SWAG_E2E_V1", ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1),
    ):
        source = resolve(spec)  # nothing is downloaded
        assert source.variant == "ViT-B/16"
        torch.testing.assert_close(
            eval_transform(source.preprocess)(image), weights.transforms()(image), atol=1e-5, rtol=0
        )
    swag = resolve("torchvision:IMAGENET1K_SWAG_E2E_V1").preprocess
    assert (swag.image_size, swag.resize_size, swag.interpolation) == (384, 384, "bicubic")
    assert resolve("torchvision:vit_b_32.IMAGENET1K_V1").variant == "ViT-B/32"


def test_timm_names_give_variant_and_preprocessing():
    source = resolve("timm:vit_base_patch16_224.augreg2_in21k_ft_in1k")
    assert source.variant == "ViT-B/16" and source.image_size == 224
    assert source.preprocess.resize_size == 248 and source.preprocess.interpolation == "bicubic"  # crop_pct 0.9
    assert source.preprocess.mean == (0.5, 0.5, 0.5)
    assert resolve("timm:vit_small_patch16_384.augreg_in21k_ft_in1k").image_size == 384
    with pytest.raises(PretrainedError, match="not a plain ViT"):
        resolve("timm:resnet50.a1_in1k")


def test_timm_weights_without_timm_name_the_extra(tmp_path, monkeypatch, capsys):
    # timm is an extra: a run that names its weights without it installed says which extra brings it, in one line
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # what an environment without the extra finds
    monkeypatch.setitem(sys.modules, "timm.models", None)
    assert (
        main(
            [
                "train",
                "--pretrained",
                "timm:vit_small_patch16_224.augreg_in21k_ft_in1k",
                "--data",
                str(tmp_path),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "foodvit train: error: --pretrained timm:NAME needs timm, which comes with the "
        "timm extra: pip install 'foodvit[timm]'\n"
    )


def test_variant_is_inferred_from_tensor_shapes():
    with torch.device("meta"):  # shapes are all it reads: no weights drawn
        assert infer_variant(torchvision.models.vit_b_32().state_dict()) == ("ViT-B/32", 224)
        assert infer_variant(timm.create_model("vit_tiny_patch16_384").state_dict()) == ("ViT-Ti/16", 384)


def test_model_that_disagrees_with_the_weights_stops_the_run(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--pretrained",
                "timm:vit_small_patch16_224.augreg_in21k_ft_in1k",
                "--model",
                "ViT-B/16",
                "--data",
                str(tmp_path),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "--model ViT-B/16 does not match the weights timm:vit_small_patch16_224.augreg_in21k_ft_in1k, "
        "which are ViT-S/16" in err
    )


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """The network unreachable: every HTTP(S) connection goes through a proxy nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, dead)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path


@pytest.mark.parametrize("spec", ["torchvision:IMAGENET1K_V1", "timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k"])
def test_offline_download_fails_fast_and_leaves_no_partial_file(offline, spec):
    started = time.monotonic()
    with pytest.raises(PretrainedError, match=r"could not download the weights .*--pretrained /path/to/weights\.pth"):
        resolve(spec).state_dict()
    assert time.monotonic() - started < 15
    assert not [p for p in offline.rglob("*") if p.is_file()]


def test_offline_training_run_says_what_to_do(offline, capsys):
    photos = make_photo_folder(offline / "p", n_train=1, n_test=1)
    assert (
        main(["train", "--pretrained", "torchvision:IMAGENET1K_V1", "--data", str(photos), "--out", str(offline / "r")])
        == 2
    )
    assert "pass a local weights file instead" in capsys.readouterr().err


def test_a_network_error_is_not_taken_for_a_missing_safetensors_file(monkeypatch):
    # the .bin fallback used to catch every Exception: a time-out was reported as the .bin's failure
    import huggingface_hub

    import foodvit.model.pretrained as P

    asked = []

    def download(repo, filename, **kwargs):
        asked.append(filename)
        raise TimeoutError("read timed out")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, filename, **kwargs: None)
    monkeypatch.setattr(P, "_probe", lambda url: None)
    with pytest.raises(TimeoutError, match="read timed out"):
        P._timm_state_dict("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert asked == ["model.safetensors"]  # no second try at the .bin for a network error
