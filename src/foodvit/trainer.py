"""`foodvit train`: a RunConfig in, a run directory out. Wires data, model, optimiser and the
engine together; every piece lives in its own module.

Reproducibility: everything random in epoch e (data order, augmentation, dropout, mixup) is drawn
from a seed derived from (seed, e), and a checkpoint is written after every epoch, so a resumed
run finishes exactly as an uninterrupted one would (on the CPU).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data as D
from .config import RunConfig
from .drloc import WithDenseRelativeLocalization
from .engine import FitHooks, StepSettings, TrainingDiverged, evaluate, fit
from .model import VisionTransformer
from .optim import build_ema, build_optimizer, build_scheduler
from .report import per_class_accuracy, plot_confusion, plot_curves, save_figure, write_report
from .run import RunError, load_checkpoint, save_checkpoint, save_model, write_metrics, write_text
from .transforms import Preprocess, batch_mixer, eval_transform, make_preprocess, train_transform
from .variants import create_model, get_variant


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but PyTorch sees no CUDA GPU here; use --device cpu or auto")
    return device


def use_deterministic_algorithms() -> None:
    """Make GPU training repeat exactly: without this, kernels that add in a varying order (attention
    and gather backward with atomics) make two runs, or a run and its resume, differ by rounding.
    cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it starts, so this must come before the first matrix
    product on the GPU (the Trainer calls it first)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def default_preprocess(config: RunConfig) -> Preprocess:
    """Preprocessing from the model's registry entry (size, normalisation) and the data settings."""
    variant = get_variant(config.model)
    d = config.data
    image_size = config.vit.get("image_size", variant.image_size)
    return make_preprocess(image_size, d.mean or variant.mean, d.std or variant.std, d.resize_mode, d.crop_pct, d.interpolation)


def build_model(config: RunConfig, num_classes: int) -> tuple[VisionTransformer, Preprocess]:
    """The model to train and its preprocessing (from pre-trained weights when given)."""
    if config.train.pretrained:
        from .pretrained import pretrained_model

        return pretrained_model(config, num_classes)
    vit = dict(config.vit)
    image_size = vit.pop("image_size", get_variant(config.model).image_size)
    return create_model(config.model, num_classes=num_classes, image_size=image_size, **vit), default_preprocess(config)


@dataclass
class Result:
    run: Path
    history: list[dict]
    test: dict  # loss, acc, n, confusion, per_class


class Trainer:
    """One run: built from a config, optionally restored from a checkpoint, then fitted."""

    def __init__(self, config: RunConfig, out: Path, *, quiet: bool = False, log=print) -> None:
        self.config, self.out, self.quiet = config, Path(out), quiet
        self.log = (lambda *a, **k: None) if quiet else log
        c = config
        self.device = pick_device(c.train.device)
        if c.train.deterministic:
            use_deterministic_algorithms()
        torch.manual_seed(c.train.seed)  # model initialisation
        self._open_data()
        self.model.to(self.device)
        self.settings = StepSettings(self.device, c.optim.accum_steps, c.optim.clip_grad, c.optim.label_smoothing,
                                     c.train.amp, sync_every=1 if self.device.type == "cpu" else 25)
        # the module the optimiser steps: the ViT, or the ViT with the auxiliary head (training only)
        self.trained = self.model
        # the auxiliary loss trains the encoder: with a frozen one (a feature extractor) it has nothing to train
        if c.optim.drloc > 0 and not c.train.freeze_backbone:
            self.trained = WithDenseRelativeLocalization(self.model, c.optim.drloc, c.optim.drloc_pairs).to(self.device)
        self.optimizer = build_optimizer(self.trained, c.optim, self.device)
        steps_per_epoch = math.ceil(len(self.train_loader) / c.optim.accum_steps)
        self.scheduler = build_scheduler(self.optimizer, c.optim, steps_per_epoch, c.train.epochs)
        self.ema = build_ema(self.model, c.optim.ema)
        self.step_model = torch.compile(self.trained) if c.train.compile else self.trained
        self.history: list[dict] = []
        self.start_epoch = 0

    def _open_data(self) -> None:
        c = self.config
        root = D.check_layout(D.resolve(c.data.source, quiet=self.quiet))
        # The head needs the number of classes; the caches need the preprocessing, which may come
        # from pre-trained weights. So: list the classes, build the model, then read the photos.
        self.model, self.preprocess = build_model(c, len(D.class_names(root / "train")))
        if c.train.freeze_backbone:
            self.model.freeze_backbone()
        p = self.preprocess
        train_cache = D.PhotoCache.decoded(max(p.resize_size, 2 * p.image_size)) if c.data.cache else None
        eval_cache = D.PhotoCache.transformed(eval_transform(p)) if c.data.cache else None
        self.data = D.open_dataset(root, strict=c.data.strict, val_fraction=c.data.val_fraction, seed=c.train.seed,
                                   train_cache=train_cache, eval_cache=eval_cache, quiet=self.quiet)
        self.classes = self.data.classes
        augment = train_transform(p, c.data.augment, c.data.scale_min, c.data.random_erasing)
        train_ds = D.PhotoDataset(self.data.train, augment, train_cache)
        mixer = batch_mixer(len(self.classes), c.data.mixup, c.data.cutmix, c.data.mix_prob)
        pin = self.device.type == "cuda"
        self.train_loader = D.make_loader(train_ds, c.train.batch_size, train=True, seed=c.train.seed,
                                          repeats=c.data.repeated_aug, workers=c.data.workers, mixer=mixer, pin_memory=pin)

        def eval_loader(split):
            ds = D.PhotoDataset(split, None, eval_cache) if eval_cache else D.PhotoDataset(split, eval_transform(p))
            # cached photos are finished tensors: workers, started at every evaluation, would only cost time
            workers = 0 if eval_cache else c.data.workers
            return D.make_loader(ds, max(c.train.batch_size, 64), train=False, workers=workers, pin_memory=pin)

        self.eval_loaders = {"val": eval_loader(self.data.val)} if self.data.val is not None else {}
        self.eval_loaders["test"] = eval_loader(self.data.test)

    # ------------------------------------------------------------------ checkpoints

    def state(self, epochs_done: int) -> dict:
        return {
            "format": "foodvit-checkpoint",
            "epoch": epochs_done,
            "model": self.model.state_dict(),
            "auxiliary": self.trained.drloc.state_dict() if self.trained is not self.model else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "history": self.history,
            "rng": torch.get_rng_state(),
            "config": self.config.to_dict(),
            "classes": list(self.classes),
        }

    def restore(self, state: dict) -> None:
        if list(state["classes"]) != list(self.classes):
            raise RunError(f"the checkpoint was trained on classes {state['classes']}, the data now has {list(self.classes)}")
        self.model.load_state_dict(state["model"])
        if self.trained is not self.model:
            self.trained.drloc.load_state_dict(state["auxiliary"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"])
        self.history = list(state["history"])
        self.start_epoch = int(state["epoch"])

    # ------------------------------------------------------------------ the run

    def _before_epoch(self, epoch: int) -> None:
        seed = D.epoch_seed(self.config.train.seed, epoch)
        torch.manual_seed(seed)  # augmentation, dropout, mixup of this epoch
        self.train_loader.sampler.set_epoch(epoch)

    def _after_epoch(self, epoch: int, row: dict) -> None:
        self.history.append(row)
        write_metrics(self.out / "metrics.csv", self.history)
        save_checkpoint(self.out / "checkpoint.pt", self.state(epoch + 1))
        self.log(_epoch_line(row, self.config.train.epochs))

    def eval_model(self):
        return self.ema.module if self.ema is not None else self.model

    def fit(self) -> Result:
        c = self.config
        hooks = FitHooks(before_epoch=[self._before_epoch], after_epoch=[self._after_epoch])
        if self.ema is not None:
            hooks.on_step.append(lambda _: self.ema.update_parameters(self.model))
        try:
            fit(self.step_model, self.train_loader, self.eval_loaders, self.optimizer, self.scheduler, epochs=c.train.epochs,
                start_epoch=self.start_epoch, settings=self.settings, hooks=hooks, eval_model=self.eval_model,
                eval_every=c.train.eval_every, show_progress=not self.quiet)
        except TrainingDiverged as err:
            kept = f"the last good checkpoint (epoch {len(self.history)}) is kept in {self.out / 'checkpoint.pt'}" if self.history else "no epoch finished"
            raise TrainingDiverged(f"{err} in epoch {len(self.history) + 1}; training stopped and {kept}. "
                                   "Lower --lr, add --clip-grad 1.0 or --warmup-epochs, then start a new run.") from None
        return self.finish()

    def finish(self) -> Result:
        """Final test evaluation (with the confusion matrix), the model file, plots and report."""
        model = self.eval_model()
        if isinstance(model, torch.optim.swa_utils.AveragedModel):
            model = model.module
        test = evaluate(model, self.eval_loaders["test"], self.settings, num_classes=len(self.classes), keep_probabilities=True)
        test["per_class"] = per_class_accuracy(test["confusion"], self.classes)
        summary = {"test_acc": test["acc"], "test_loss": test["loss"], "test_n": test["n"], "recipe": self.config.recipe,
                   "epochs": len(self.history)}
        save_model(self.out, model, self.classes, self.preprocess, {"metrics": summary})
        save_figure(plot_curves(self.history), self.out / "curves.png")
        save_figure(plot_confusion(test["confusion"], self.classes), self.out / "confusion.png")
        save_figure(self._most_wrong(test.pop("probabilities")), self.out / "most_wrong.png")
        counts = {"train": self.data.train.counts(), "test": self.data.test.counts()}
        if self.data.val is not None:
            counts["val"] = self.data.val.counts()
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        info = {"params": params, "trainable": trainable, "image_size": model.config.image_size,
                "patch_size": model.config.patch_size, "data_root": str(self.data.root), "device": _device_name(self.device)}
        wrong = ["## Most confidently wrong test photos", "", "![most wrong](most_wrong.png)", ""]
        write_report(self.out, config=self.config, classes=self.classes, counts=counts, history=self.history, final=test,
                     model_info=info, extra_sections=wrong)
        return Result(self.out, self.history, test)

    def _most_wrong(self, probabilities: torch.Tensor):
        from .viz import most_wrong_figure

        top = probabilities.max(dim=1)
        results = [{"image": str(path), "label": self.classes[i], "probability": p}
                   for (path, _), p, i in zip(self.data.test.samples, top.values.tolist(), top.indices.tolist())]
        truths = [self.classes[label] for _, label in self.data.test.samples]
        return most_wrong_figure(results, truths)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def _epoch_line(row: dict, epochs: int) -> str:
    parts = [f"epoch {row['epoch']:>3}/{epochs}", f"train loss {row['train_loss']:.4f} acc {row['train_acc']:.3f}"]
    for split in ("val", "test"):
        if row.get(f"{split}_acc") is not None:
            parts.append(f"{split} loss {row[f'{split}_loss']:.4f} acc {row[f'{split}_acc']:.3f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['seconds']:.1f} s"]
    return " | ".join(parts)


def default_out() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def train(config: RunConfig, out: str | Path | None = None, *, quiet: bool = False, log=print) -> Result:
    """Start a new run in `out` (which must not hold one already)."""
    out = Path(out) if out else default_out()
    if (out / "checkpoint.pt").exists() or (out / "model.safetensors").exists():
        raise RunError(f"{out} already holds a run; continue it with `foodvit train --resume {out}` or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "config.json", config.to_json())
    trainer = Trainer(config, out, quiet=quiet, log=log)
    if not quiet:
        log(f"training {config.model} ({config.recipe} recipe) on {trainer.data.root}: {len(trainer.data.train)} train / "
            f"{len(trainer.data.test)} test photos, classes {', '.join(trainer.classes)}; run directory {out}")
    return trainer.fit()


def resume(out: str | Path, *, quiet: bool = False, log=print) -> Result:
    """Finish the run in `out` from its last checkpoint, exactly as configured when it started."""
    out = Path(out)
    config_path = out / "config.json"
    if not config_path.is_file():
        raise RunError(f"{out} holds no foodvit run (no config.json); start one with foodvit train --out {out}")
    config = RunConfig.from_dict(json.loads(config_path.read_text()))
    state = load_checkpoint(out / "checkpoint.pt")
    trainer = Trainer(config, out, quiet=quiet, log=log)
    trainer.restore(state)
    if not quiet:
        log(f"resuming {out} after epoch {trainer.start_epoch} of {config.train.epochs}")
    return trainer.fit()
