"""The demo page (Gradio Blocks) that serve.py mounts at /: a photo in; the top-k probabilities as
bars, the time taken, the attention rollout over the crop the model saw, and a model card out.
The same page for a run directory (PyTorch) and an exported .onnx (ONNX Runtime, no PyTorch): the
overlay comes from Predictor.attention; a file without the attention output shows the photo's
answer without it and says so in one line.

It classifies through the same Service as POST /predict (same decoding, same limits, same batches),
so the page and the API give the same answer, or the same one-line error, for the same photo: the
photo component hands over the uploaded file undecoded, and foodvit decodes it.
Uploads and the pictures shown are deleted from Gradio's cache after PAGE_CACHE[1] seconds.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from foodvit import markup
from foodvit.data.photos import PhotoError
from foodvit.deploy.onnx_runtime import NO_ATTENTION

OVERLAY_SIZE = 224  # px: the attention picture is shown at least this large
# Gradio's delete_cache (frequency, age) in seconds: every 10 minutes, the uploads and pictures
# older than 30 minutes are deleted (a page that stays open longer shows a photo that is gone).
PAGE_CACHE = (600, 1800)


def model_card(predictor) -> str:
    """A short model card in Markdown: model, size, recipe, classes, test accuracy, data, date; every value read from
    the model (its class names, its card) shown as its characters, never as markup (markup.py)."""
    rows = card_rows(predictor, code=markup.code, text=markup.text)
    return "### Model card\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in rows)


def card_rows(predictor, code=str, text=str) -> list[tuple[str, str]]:
    """The model card's rows (name, text): model, size, recipe, classes, test accuracy, data, date. code(value) marks a
    name, text(value) is any other value read from the model (a class name, a field of its card): as they are by
    default, for a page that sets them as text; markup.code and markup.text in Markdown (model_card)."""
    card, metrics = predictor.card, predictor.card.get("metrics", {})
    model = card.get("model", {})
    rows = [
        (
            "model",
            text(
                f"ViT, {_count(model.get('depth'), 'block')}, D={model.get('embed_dim', '?')}, "
                f"{_count(model.get('num_heads'), 'head')}, patch {model.get('patch_size', '?')}, "
                f"{predictor.preprocess.image_size} px input"
            ),
        ),
        ("parameters", f"{card['params'] / 1e6:.2f} M" if card.get("params") else "unknown"),
        (
            "recipe",
            f"{code(metrics['recipe'])}, {text(_count(metrics.get('epochs'), 'epoch'))}"
            if metrics.get("recipe")
            else "unknown",
        ),
        ("classes", ", ".join(text(name) for name in predictor.classes)),
    ]
    if "test_acc" in metrics:
        n = metrics.get("test_n")
        correct = f" ({round(metrics['test_acc'] * n)}/{n} photos)" if n else ""
        rows.append(("test accuracy", text(f"{metrics['test_acc']:.3f}{correct}, per image")))
    if metrics.get("data"):
        counts = [
            f"{metrics[k]} {what} photos"
            for k, what in (("train_photos", "training"), ("test_n", "test"))
            if metrics.get(k)
        ]
        rows.append(("training data", code(data_name(metrics["data"])) + "".join(f", {text(c)}" for c in counts)))
    if metrics.get("trained"):
        rows.append(("trained", text(metrics["trained"])))
    return rows


def data_name(source: str) -> str:
    """A data source's name without where it lies on the trainer's machine (a card is published
    with an exported Space): DataSource.name, e.g. pizza_steak_sushi or food101:pizza,steak."""
    from foodvit.data.datasource import DataSource

    return DataSource.parse(source).name


def _count(n, word: str) -> str:
    return f"{n if n is not None else '?'} {word}{'' if n == 1 else 's'}"


def probability_table(answer: dict) -> str:
    """The probabilities to three decimals, best first, and the time taken, in Markdown (class names as text)."""
    lines = ["| class | probability |", "|---|---|"]
    ranked = sorted(answer["probabilities"].items(), key=lambda kv: -kv[1])
    lines += [f"| {markup.text(label)} | {p:.3f} |" for label, p in ranked]
    return (
        "\n".join(lines)
        + f"\n\nanswered in **{answer['seconds'] * 1000:.0f} ms** (decoding, preprocessing and the model)"
    )


def attention_overlay(predictor, photo):
    """The attention rollout (Predictor.attention) over exactly the crop the model saw, as a PIL
    image; None when the model has no attention output (an .onnx exported without --with-attention).
    NumPy and Pillow only: the page of an .onnx model imports no PyTorch."""
    heat = predictor.attention(photo)
    if heat is None:
        return None
    import numpy as np
    from PIL import Image

    from foodvit.data.preprocess import crop_view
    from foodvit.viz.overlay import overlay_array

    picture = Image.fromarray(overlay_array(np.asarray(crop_view(predictor.preprocess, photo), dtype=np.uint8), heat))
    if picture.width < OVERLAY_SIZE:  # a small model's crop, enlarged so that people can see it
        picture = picture.resize((OVERLAY_SIZE, OVERLAY_SIZE), Image.Resampling.NEAREST)
    return picture


def build_page(service, examples: Sequence[Path] = (), cache: tuple[int, int] | None = None):
    """The page's Blocks. cache: Gradio's delete_cache (frequency, age) in seconds, PAGE_CACHE by default."""
    import gradio as gr

    from foodvit.data.photos import safe_name

    predictor = service.predictor

    def classify(path: str | None):
        if not path:
            raise gr.Error("no photo yet: upload one, paste one or take one with the webcam")
        name = safe_name(Path(path).name)
        try:
            data = Path(path).read_bytes()  # a file the page received: serve.py has Gradio refuse any other path
        except OSError:
            raise gr.Error(html.escape(f"{name} is no longer on the server; upload it again", quote=False)) from None
        try:
            photo = predictor.decode(data, name, max_pixels=service.max_pixels, budget=service.budget)
            answer = service.classify(photo, name)
        except PhotoError as err:
            # Gradio shows an error's message as HTML: the file's name and Pillow's words as text
            raise gr.Error(html.escape(str(err), quote=False), print_exception=False) from None
        label = {c: p for c, p in answer["probabilities"].items()}
        return label, probability_table(answer), attention_overlay(predictor, photo)

    title = f"foodvit: {', '.join(predictor.classes)}"  # the window's title is set as text
    heading = f"foodvit: {', '.join(markup.text(name) for name in predictor.classes)}"
    # the Markdown that shows the model's words (class names, its card) renders no math: $...$ in a name stays text
    as_text: dict = {"latex_delimiters": []}
    with gr.Blocks(title=title, analytics_enabled=False, delete_cache=cache or PAGE_CACHE) as page:
        gr.Markdown(
            f"# {heading}\nA Vision Transformer (Dosovitskiy et al., 2021) trained with foodvit. "
            "Give it a photo: it answers with the probability of each class and shows where it looked.",
            **as_text,
        )
        with gr.Row(equal_height=False):
            with gr.Column(min_width=300):
                image = gr.Image(
                    type="filepath",
                    image_mode=None,
                    sources=["upload", "clipboard", "webcam"],
                    label="photo",
                    elem_id="foodvit-photo",
                )
                # gr.Image in the browser (upload, paste, webcam), but the upload handed over as its file path,
                # undecoded: gr.Image's own preprocessing opens it with Pillow and answers a bad file with its own
                # error, which names the server's cache path. (On the instance: a subclass of a Gradio component
                # makes Gradio write a .pyi stub beside this module.)
                # (mypy: an assignment over a method is what is meant here)
                image.preprocess = lambda payload: None if payload is None else payload.path  # type: ignore[method-assign]
                button = gr.Button("Classify", variant="primary", elem_id="foodvit-classify")
                if examples:
                    gr.Examples(
                        examples=[[str(p)] for p in examples], inputs=[image], label="examples from the test photos"
                    )
            with gr.Column(min_width=300):
                label = gr.Label(
                    num_top_classes=min(service.top_k, len(predictor.classes)),
                    label="prediction",
                    elem_id="foodvit-label",
                )
                table = gr.Markdown(elem_id="foodvit-probabilities", **as_text)
                overlay = gr.Image(
                    label="attention rollout over the model's crop (Abnar & Zuidema 2020)",
                    interactive=False,
                    type="pil",
                    height=OVERLAY_SIZE + 40,
                    elem_id="foodvit-attention",
                    visible=predictor.has_attention,
                )
                if not predictor.has_attention:
                    gr.Markdown(NO_ATTENTION, elem_id="foodvit-no-attention")
        gr.Markdown(model_card(predictor), elem_id="foodvit-card", **as_text)
        gr.Markdown("API: `POST /predict` with the photo in the form field `file`; `GET /health`.")
        outputs = [label, table, overlay]
        button.click(classify, inputs=[image], outputs=outputs, api_name="classify")
        # api_name=False: no API endpoint for the upload event (Gradio accepts it; its annotation says str | None)
        image.upload(classify, inputs=[image], outputs=outputs, api_name=False)  # type: ignore[arg-type]
    return page
