"""Writes docs/walkthrough.ipynb from the cells below (the notebook's source of truth is this file;
`make notebook` rebuilds it and executes it, saving the outputs).

    .venv/bin/python docs/build_walkthrough.py && make notebook
"""

from pathlib import Path

import nbformat

MD, CODE = "markdown", "code"

CELLS = [
    (
        MD,
        """# From the paper to the code: a Vision Transformer, equation by equation

This notebook follows section 3.1 of *An Image is Worth 16x16 Words* (Dosovitskiy et al., ICLR 2021)
with real tensors from **foodvit**. Each step calls the library's own modules one at a time, computes
the same thing by hand from the paper's equation, and **asserts** that the two agree. No code is
copied from the library: where a cell says `model.patch_embed(x)`, that *is* foodvit's code path.

The photo comes from FoodVision Mini (pizza, steak, sushi): the folder named by `FOODVIT_DATA`, else
the course's zip, downloaded once. Runs top to bottom on a laptop CPU: its one training run (section 6)
is kept to a few epochs of a small recipe, and the large models whose weights are never used are built
without storage.""",
    ),
    (
        CODE,
        """import io, os, warnings
warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm's notice about notebook widgets
import torch, torch.nn.functional as F
from IPython.display import Image, display

import foodvit
from foodvit.data.datasource import DataSource
from foodvit.data.photos import load_rgb
from foodvit.data.preprocess import make_preprocess, to_array
from foodvit.data.transforms import model_view
from foodvit.viz.figures import attention_distance_figure, explain_figure, filters_figure, overlay_array, patches_figure, pos_similarity_figure
from foodvit.viz.plotting import subplots

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

def show(fig):
    \"\"\"Show a matplotlib Figure inline (foodvit draws without pyplot's global state).\"\"\"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    display(Image(data=buffer.getvalue()))

test = DataSource.parse(os.environ.get("FOODVIT_DATA") or None).open_split("test")
photo_path = next(path for path, label in test.samples if test.classes[label] == "pizza")
photo = load_rgb(photo_path)
print(f"{len(test)} test photos, classes {list(test.classes)}; this one: {photo_path.name}, {photo.size[0]} x {photo.size[1]} px")""",
    ),
    (
        MD,
        """## 1. An image is worth 16 x 16 words: patches (Eq. 1, `x_p`)

ViT-B/16 reads a 224 x 224 image as a 14 x 14 grid of 16 x 16 patches: N = HW / P^2 = 196.
`foodvit.viz.figures.patches_figure` draws the grid over the crop the model would see.""",
    ),
    (CODE, """show(patches_figure(photo, image_size=224, patch_size=16))"""),
    (
        MD,
        """The patches are flattened (P^2 * C = 768 numbers each) and multiplied by one matrix **E** (Eq. 1).
foodvit computes `x_p E` as a single `Conv2d` with kernel = stride = P (`PatchEmbed` in
`src/foodvit/model/vit.py`). Here the same numbers come from cutting the patches out by hand and using
the convolution's weights as E.""",
    ),
    (
        CODE,
        """model = foodvit.create_model("ViT-B/16", num_classes=3).eval()      # Table 1's Base, P = 16, a 3-class head
preprocess = make_preprocess(224, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))   # resize 256, centre-crop 224, scale to [-1, 1]
x = torch.from_numpy(to_array(preprocess, photo))[None]             # (1, 3, 224, 224)

P = 16
patches = x.unfold(2, P, P).unfold(3, P, P)                          # (1, 3, 14, 14, 16, 16)
patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(1, 196, 3 * P * P)   # (1, N, P^2 C), each patch flattened
E = model.patch_embed.proj.weight.reshape(768, -1).T                 # the conv kernel, transposed, is E: (P^2 C, D)
by_hand = patches @ E + model.patch_embed.proj.bias                  # x_p E (+ bias): (1, 196, 768)

with torch.no_grad():
    library = model.patch_embed(x)
print("image", tuple(x.shape), "-> patches", tuple(patches.shape), "-> x_p E", tuple(library.shape))
print("max |by hand - Conv2d| =", f"{(by_hand - library).abs().max().item():.2e}")
assert torch.allclose(by_hand, library, atol=1e-4)""",
    ),
    (
        MD,
        """## 2. Eq. 1: the class token and the position embedding

z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos. A learnable class token is prepended (197 tokens) and a
learned 1-D position embedding is added (`VisionTransformer._embed`, the first step of `forward_features`).""",
    ),
    (
        CODE,
        """with torch.no_grad():
    z0_by_hand = torch.cat([model.cls_token.expand(1, -1, -1), library], dim=1) + model.pos_embed
    z0 = model._embed(x)                    # the library's Eq. 1 (dropout is off in eval mode)
print("x_p E", tuple(library.shape), "-> [x_class; x_p E]", tuple(z0_by_hand.shape), "+ E_pos", tuple(model.pos_embed.shape))
print("max |by hand - model._embed| =", f"{(z0_by_hand - z0).abs().max().item():.2e}")
assert torch.allclose(z0_by_hand, z0, atol=1e-5)""",
    ),
    (
        MD,
        """## 3. Eq. 2 and 3: one encoder block by hand

z'_l = MSA(LN(z_{l-1})) + z_{l-1}  (Eq. 2) and  z_l = MLP(LN(z'_l)) + z'_l  (Eq. 3).
MSA (Appendix A): q, k, v = z U_qkv; each head computes softmax(q k^T / sqrt(d)) v with d = D / h = 64;
the heads are concatenated and projected by U_msa. Everything below uses block 0's own weights
(`Block`, `Attention`, `MLP` in `src/foodvit/model/blocks.py`).""",
    ),
    (
        CODE,
        """block = model.blocks[0]
h, d = 12, 64

def layer_norm(z, norm):
    mean = z.mean(-1, keepdim=True)
    var = z.var(-1, keepdim=True, unbiased=False)
    return (z - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

with torch.no_grad():
    a = layer_norm(z0, block.norm1)
    q, k, v = (a @ block.attn.qkv.weight.T + block.attn.qkv.bias).chunk(3, dim=-1)      # each (1, 197, 768)
    q, k, v = (t.reshape(1, 197, h, d).transpose(1, 2) for t in (q, k, v))            # (1, h, 197, d)
    attention = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)              # (1, h, 197, 197)
    heads = (attention @ v).transpose(1, 2).reshape(1, 197, 768)                       # concatenate the heads
    z1_prime = heads @ block.attn.proj.weight.T + block.attn.proj.bias + z0            # Eq. 2
    m = layer_norm(z1_prime, block.norm2)
    m = F.gelu(m @ block.mlp.fc1.weight.T + block.mlp.fc1.bias) @ block.mlp.fc2.weight.T + block.mlp.fc2.bias
    z1_by_hand = m + z1_prime                                                            # Eq. 3
    z1, weights = block(z0, return_attention=True)                                       # the library's block
print("z_0", tuple(z0.shape), "-> attention", tuple(attention.shape), "-> z_1", tuple(z1.shape))
print("max |by hand - Block.forward| =", f"{(z1_by_hand - z1).abs().max().item():.2e}",
      "| attention weights:", f"{(attention - weights).abs().max().item():.2e}")
assert torch.allclose(z1_by_hand, z1, atol=1e-4) and torch.allclose(attention, weights, atol=1e-5)""",
    ),
    (
        MD,
        """What does the first head of block 0 (head 0, counting from 0 as the code does) look at from the class token? Its row of the attention matrix over the
196 patches, laid back on the 14 x 14 grid. (This model has random weights; section 7 shows a trained one.)""",
    ),
    (
        CODE,
        """crop = model_view(preprocess, photo)                                 # the 224 x 224 crop, uint8
fig, axes = subplots(1, 2, figsize=(8, 4))
axes[0].imshow(crop.permute(1, 2, 0).numpy()); axes[0].set_title("the model's crop")
axes[1].imshow(overlay_array(crop, attention[0, 0, 0, 1:].reshape(14, 14)))
axes[1].set_title("block 0, head 0: class token's attention")
for ax in axes: ax.axis("off")
show(fig)""",
    ),
    (
        MD,
        """## 4. Eq. 4 and Table 1: the head, and the variants

y = LN(z_L^0): after L blocks, the final LayerNorm is applied and the class token's state (index 0) goes
through the classification head. By hand, with every block of the library in turn:""",
    ),
    (
        CODE,
        """with torch.no_grad():
    z = model._embed(x)
    for blk in model.blocks:
        z, _ = blk(z)
    logits_by_hand = model.head(model.norm(z)[:, 0])     # Eq. 4: y = LN(z_L^0), then the head
    logits = model(x)
print("z_L", tuple(z.shape), "-> z_L^0", tuple(z[:, 0].shape), "-> logits", tuple(logits.shape))
print("max |by hand - model(x)| =", f"{(logits_by_hand - logits).abs().max().item():.2e}")
assert torch.allclose(logits_by_hand, logits, atol=1e-4)""",
    ),
    (
        MD,
        """Table 1 of the paper: Base, Large and Huge, with their parameter counts (86M, 307M, 632M).
foodvit's registry (`src/foodvit/model/variants.py`) builds each, here with a 1000-class head at 224 px;
the counts below come from the built models, built on PyTorch's meta device: parameters with shapes and no storage,
so ViT-H/14's 632M weights cost neither memory nor the time to initialise them.""",
    ),
    (
        CODE,
        """def on_meta(name, num_classes=1000):
    with torch.device("meta"):
        return foodvit.create_model(name, num_classes=num_classes)

def count(m):
    return sum(p.numel() for p in m.parameters())

paper = {"ViT-B/16": 86e6, "ViT-L/16": 307e6, "ViT-H/14": 632e6}
print(f"{'model':<9} {'layers':>6} {'D':>5} {'MLP':>5} {'heads':>5} {'params':>12} {'paper':>7}")
for name, expected in paper.items():
    m = on_meta(name)
    c = m.config
    print(f"{name:<9} {c.depth:>6} {c.embed_dim:>5} {c.mlp_dim:>5} {c.num_heads:>5} {count(m):>12,} {expected / 1e6:>6.0f}M")
    assert abs(count(m) - expected) / expected < 0.01""",
    ),
    (
        MD,
        """The check allows 1%, and ViT-L/16 uses 0.9% of it: 304.3M against 307M. Is the gap the classification
head? The paper pre-trains on ImageNet-21k (about 21k classes; 21,843 below) and fine-tunes on ImageNet (1000), and a
head is D x classes + classes weights. Computed for both heads, and for the other patch size the paper
gives the Large model (32, which changes only the patch embedding E):""",
    ),
    (
        CODE,
        """large = on_meta("ViT-L/16")
for label, m in [("ViT-L/16, 1000-class head", large),
                 ("ViT-L/16, 21843-class head", on_meta("ViT-L/16", num_classes=21843)),
                 ("ViT-L/32, 1000-class head", on_meta("ViT-L/32"))]:
    print(f"{label:<27} {count(m):>12,} = {count(m) / 1e6:5.1f}M  (head {count(m.head):>10,}; E {count(m.patch_embed):>9,})")""",
    ),
    (
        MD,
        """The 21k-class head is not the gap: it adds 21.4M and moves the count further from 307M (325.7M). The
paper's Table 1 does not say which head or patch size its counts are for, and they are rounded: Base's
86M is ViT-B/16's 86.6M rounded down, while ViT-L/32, whose patch embedding takes 32 x 32 x 3 = 3072
inputs per patch instead of 768, has 306.5M, which rounds to the paper's 307M. The paper does not say
which it counted; what its table does fix, the layers, D, MLP size and heads, foodvit builds exactly.""",
    ),
    (
        MD,
        """## 5. Equal to the reference implementations

The same weights in torchvision's `vit_b_16` and in timm's `vit_base_patch16_224` give the same logits
as foodvit's model: weights are random (not zeros: torchvision starts its head at zero, which would make
the comparison empty) and moved between layouts by `foodvit.load_weights`.""",
    ),
    (
        CODE,
        """import timm, torchvision

def randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return module.eval()

for name, theirs in [("torchvision vit_b_16", torchvision.models.vit_b_16(num_classes=3)),
                     ("timm vit_base_patch16_224", timm.create_model("vit_base_patch16_224", num_classes=3))]:
    randomize(theirs)
    ours = foodvit.load_weights(foodvit.create_model("ViT-B/16", num_classes=3), theirs.state_dict()).eval()
    with torch.no_grad():
        diff = (ours(x) - theirs(x)).abs().max().item()
    print(f"{name:<26} max |logit difference| = {diff:.2e}")
    assert diff < 1e-4""",
    ),
    (
        MD,
        """## 6. Training on 225 photos

What the full recipes reach is *not* run here (the course's run alone took 2,229 s on 2 CPU cores);
these are the measurements kept in `results/headline.csv` (`foodvit train --recipe course`,
`bench/accuracy/recipe.py`), per image, from scratch, on FoodVision Mini (225 training and 75 test photos):

| run | accuracy | measured on |
|---|---|---|
| the course's ViT-B/16 from scratch: 224 px, Adam 3e-3, weight decay 0.3, 10 epochs, no augmentation (seed 42) | 0.333, every photo called pizza | the 75 test photos |
| foodvit's default recipe (`foodvit train`, 100 epochs), seeds 0-2 | 0.796, seeds' std 0.017 (0.773 / 0.800 / 0.813); standard error 0.047 | the 75 test photos |
| the default recipe, 5-fold cross-validation (seed 0) | 0.831 +- 0.025 (+- standard error) | the 225 training photos, each predicted by the fold model that did not see it |
| a ResNet-18 from scratch trained as the ViT is (100 epochs at 96 px), the same folds | 0.738 +- 0.029 | the same 225 training photos |

**The course's run collapses**: the model predicts one class for everything, so its accuracy is that
class's share of the test photos, a third. **The default recipe** is a small ViT made for small data
(ViT-Ti/8 at 96 px with 6 blocks, trained at 64 px for its first two thirds, a convolutional tokeniser
and sequence pooling as in CCT, sin-cos positions, mimetic initialisation of the
attention, augmentation, label smoothing, AdamW with warmup and cosine decay, an auxiliary
localization loss, and locality guidance: a ResNet-18 trained first on the same photos whose feature
maps three of the ViT's blocks learn to predict, and masked patches: a quarter of each training photo's
patches hidden, their pixels predicted from the output tokens: `src/foodvit/recipes/default.toml`); it does not
collapse, learns all three classes and scores above the CNN (the CNN's locality is exactly what the
ViT lacks on small data; guidance and the convolutional tokeniser lend it). A run takes about 8 minutes on a 2-core
CPU that multiplies bf16 natively, where its training steps run under bf16 autocast (2 threads, nothing else running;
about 13 minutes on a CPU without native bf16, in float32).

**The run below shows the mechanics, not those numbers.** It trains the `tiny` recipe (ViT-Ti/8 at 64 px
with 4 blocks, flips as its only augmentation, the class token and learned positions:
`src/foodvit/recipes/tiny.toml`) for 3 epochs, through the same `train()` and run directory as `foodvit
train`. Expect its test accuracy near chance, one photo in three: a ViT has no convolution telling it
that neighbouring pixels belong together, so from scratch it must learn that from the photos
themselves, and 225 photos take many passes (the default recipe makes 100) before it beats guessing.
What a few epochs do show is the loop itself: the loss curves, the test accuracy, the files of a run.""",
    ),
    (
        CODE,
        """import tempfile
from pathlib import Path
import foodvit
from foodvit.training.report import plot_curves
from foodvit.viz.attention import attention_distances_over

workdir = tempfile.TemporaryDirectory(prefix="walkthrough-")  # removed when the kernel exits
run = workdir.name + "/run"
settings = {"data.source": os.environ.get("FOODVIT_DATA") or "", "train.epochs": 3, "train.seed": 0}
result = foodvit.train("tiny", run, overrides=settings, quiet=True, log=lambda *args, **kwargs: None)
print(f"{len(result.history)} epochs; test accuracy {result.test['acc']:.3f} on {result.test['n']} photos (per image; chance is 0.333)")
print("the run's files:", ", ".join(sorted(p.name for p in Path(run).iterdir())))
show(plot_curves(result.history))""",
    ),
    (
        MD,
        """Pre-trained weights are the other way out of small data (the course's transfer-learning chapter).
Two recipes start from torchvision's ImageNet ViT-B/16 and differ in what they train:

    foodvit train --recipe feature-extractor    # feature extraction: the backbone frozen, only a new 3-class head learns
    foodvit train --recipe finetune             # fine-tuning (the paper's section 3.2): every layer learns

The first is the course's transfer run; the second updates all of ViT-B/16's weights, so each of its
steps also runs the backward pass through the whole backbone.

## 7. Inside the trained model

Attention rollout (Abnar & Zuidema 2020) over the crop the model saw, read out through the model's own
pooling (here the class token, Eq. 4), with the top-3 probabilities (`foodvit.viz.figures.explain_figure`,
through a `foodvit.Predictor`):""",
    ),
    (
        CODE,
        """predictor = foodvit.load_predictor(run)
show(explain_figure(predictor, photo))""",
    ),
    (
        MD,
        """Figure 7 of the paper has three panels: the principal components of the patch-embedding filters E
(left), the similarity of the position embeddings (centre), and the mean attention distance of each
head against depth (right). After 3 epochs these show mostly where the model started, not what it
learned. The tiny recipe's positions are learned from a random start, and so few steps leave them
nearly as random as they began (centre). The paper's learned embeddings, after pre-training, show the
image's 2-D layout: a patch is most like its neighbours and its own row and column. The default
recipe's fixed sin-cos positions are laid out in 2-D from the first step: in the fourth picture (a
ViT-Ti/8 at 64 px with those positions, untrained) each position's similarity falls off smoothly with
distance on the grid, where the tiny run's learned ones show only a bright square for the position
itself.""",
    ),
    (
        CODE,
        """trained = predictor.model
show(filters_figure(trained))
show(pos_similarity_figure(trained))
images = torch.stack([torch.from_numpy(predictor.prepare(load_rgb(p))) for p, _ in test.samples[::8]])
show(attention_distance_figure(attention_distances_over(trained, images), trained.config.image_size))
show(pos_similarity_figure(foodvit.create_model("ViT-Ti/8", num_classes=3, image_size=64, pos_embed="sincos2d")))""",
    ),
    (
        MD,
        """That is the whole model: Eq. 1 in `PatchEmbed` and `VisionTransformer._embed`, Eq. 2 and 3 in `Block`
(with `Attention` and `MLP`, in `model/blocks.py`), Eq. 4 in `VisionTransformer._pool` and `head` (read by
`forward_head`), Table 1 in `model/variants.py`.
From here: `foodvit train` for the full recipe, `foodvit serve` for a demo of your run, `foodvit
export` to ship it.""",
    ),
]


def build(path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for number, (kind, source) in enumerate(CELLS):
        if kind == MD:
            notebook.cells.append(nbformat.v4.new_markdown_cell(source, id=f"cell-{number}"))
        else:
            cell = nbformat.v4.new_code_cell(source, id=f"cell-{number}")  # fixed ids: a rebuild changes only edits
            # the training cell's numbers depend on the machine's arithmetic (float rounding over the epochs, bf16
            # autocast where the CPU has it): tests/test_notebook.py does not compare its printed output
            if "foodvit.train(" in source:
                cell.metadata["tags"] = ["varies"]
            notebook.cells.append(cell)
    varies = [cell for cell in notebook.cells if "varies" in cell.metadata.get("tags", [])]
    if len(varies) != 1:
        raise SystemExit(f"{len(varies)} cells tagged 'varies' where the training cell alone should be: fix build()")
    nbformat.write(notebook, path)


if __name__ == "__main__":
    build(Path(__file__).with_name("walkthrough.ipynb"))
