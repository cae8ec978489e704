"""`foodvit train`: a RunConfig in, a run directory out, on one process or on many (torchrun).

A Trainer is a few explicit build steps, in this order: the processes (distributed.Context:
device from LOCAL_RANK, the process group), the classes of the data, the model (whose
preprocessing the caches need), the data sets and loaders (this rank's share of each batch), the
module the optimiser steps (the auxiliary head; wrapped in DistributedDataParallel), the
optimiser, schedule and EMA. Then fit() runs the engine with hooks: seeding and sampler order
before each epoch; EMA, TensorBoard and the progress bar after each step; metrics, checkpoint
and report after each epoch (rank 0 alone writes). One process is the plain case of the same code.

Reproducibility: every random stream (model initialisation, validation split, photo order,
augmentation, the rest of a step) has its own seed derived from the run seed (seeds.py), those
of epoch e from (seed, purpose, e), and a checkpoint is written after every epoch, so a resumed run
finishes exactly as an uninterrupted one would (on the CPU), on as many processes as it likes.

The run directory is the user's: a new run goes only into a new or empty folder, one process at
a time writes it (a lock file), a run that fails before its first checkpoint leaves nothing
behind, and a resumed run continues with exactly the settings, data and model it started with.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from foodvit.config import RunConfig, ViTConfig, check_on_patch_grid
from foodvit.data.datasets import Listed, MemoryBudget, PhotoCache, PhotoDataset, list_source, open_dataset
from foodvit.data.preprocess import Preprocess, eval_transform, make_preprocess
from foodvit.data.sampling import make_loader
from foodvit.data.sources import default_source
from foodvit.data.transforms import batch_mixer, train_transform
from foodvit.errors import ConfigError, FoodVitError
from foodvit.files import RunLock
from foodvit.model.variants import create_model, get_variant
from foodvit.model.vit import VisionTransformer
from foodvit.model.weights import resize_model
from foodvit.rundir.directory import (
    RUN_FILES,
    TEACHER_FILE,
    RunError,
    load_checkpoint,
    read_config,
    save_checkpoint,
    save_model,
    write_metrics,
    write_text,
)
from foodvit.seeds import derive_seed
from foodvit.training.distill import WithDistillation, build_teacher
from foodvit.training.distributed import DEFAULT_TIMEOUT_S, Context, PeerLost, backend_reason
from foodvit.training.drloc import WithDenseRelativeLocalization
from foodvit.training.engine import FitHooks, StepSettings, TrainingDiverged, evaluate, fit
from foodvit.training.freezing import freeze_backbone
from foodvit.training.optim import build_ema, build_optimizer, build_scheduler
from foodvit.training.report import per_class_accuracy, plot_confusion, plot_curves, write_report
from foodvit.training.resizing import AnyGrid
from foodvit.viz.figures import most_wrong_figure, predictions_figure
from foodvit.viz.plotting import save_figure


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """Within the block, deterministic algorithms only, so that GPU training repeats exactly:
    without this, kernels that add in a varying order (attention and gather backward with atomics)
    make two runs, or a run and its resume, differ by rounding. The process's previous settings
    come back afterwards. cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it starts, so the Trainer sets
    it (if unset) before its first matrix product on the GPU."""
    if not enabled:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.benchmark = previous[1]


def default_preprocess(config: RunConfig) -> Preprocess:
    """Preprocessing from the model's registry entry (size, normalisation) and the data settings."""
    variant = get_variant(config.model)
    d = config.data
    image_size = config.vit.get("image_size", variant.image_size)
    return make_preprocess(image_size, d.mean or variant.mean, d.std or variant.std, d.resize_mode, d.crop_pct, d.interpolation)


def build_model(config: RunConfig, num_classes: int) -> tuple[VisionTransformer, Preprocess]:
    """The model to train and its preprocessing (from pre-trained weights when given)."""
    if config.train.pretrained:
        from foodvit.model.pretrained import pretrained_model

        return pretrained_model(config, num_classes)
    vit = dict(config.vit)
    image_size = vit.pop("image_size", get_variant(config.model).image_size)
    return create_model(config.model, num_classes=num_classes, image_size=image_size, **vit), default_preprocess(config)


@dataclass
class Result:
    run: Path
    history: list[dict]
    test: dict  # loss, acc, n, confusion, per_class


LARGE_MODEL_PARAMS = 20_000_000  # above this, say what a run will cost before it starts
EVAL_BATCH_SIZE = 64  # evaluation batches at least this large: no gradients, so memory allows it
GPU_SYNC_EVERY = 25  # on a GPU, check the loss for NaN every this many steps (each check waits for the GPU)


def train_decode_size(p: Preprocess) -> int:
    """The shorter side training photos are decoded to: enough for the eval resize and for random
    resized crops to zoom in twofold without upsampling."""
    return max(p.resize_size, 2 * p.image_size)


def resume_command(out: Path) -> str:
    """How to continue a run, in the launcher it was started with."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"resume with `torchrun --nproc_per_node N -m foodvit train --resume {out}` (any number of processes)"
    return f"resume with `foodvit train --resume {out}`"


class Trainer:
    """One run on this process: built step by step from a config (and, when resuming, its
    checkpoint), then fitted. Under torchrun every rank builds one; rank 0 alone writes."""

    def __init__(self, config: RunConfig, out: Path, *, quiet: bool = False, log=print, saved: dict | None = None,
                 verbose: bool = False, context: Context | None = None) -> None:
        self.config, self.out, self.verbose = config, Path(out), verbose
        self.ctx = context or Context.from_environment(config.train.device)
        self.main = self.ctx.is_main
        self.quiet = quiet or not self.main  # progress bars and lines on rank 0 only
        self.log = (lambda *a, **k: None) if self.quiet else log
        self.device = self.ctx.device
        if config.train.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self.history: list[dict] = []
        self.start_epoch = 0
        if config.train.tensorboard and self.main:
            from foodvit.training.tracking import require_tensorboard

            require_tensorboard()  # before any photo is read
        listed = self._list_data()  # not kept: the checked splits replace it (the list of photos is held once)
        self._build_model(len(listed.classes), saved)
        self._open_data(listed)
        self._build_loaders()
        self._build_optimisation()
        self.tensorboard = None

    # ------------------------------------------------------------------ build steps

    def _list_data(self) -> Listed:
        """The data's files and classes; the first process of each machine downloads or unpacks the
        source, the others find it in the cache."""
        with self.ctx.main_first():
            return list_source(self.config.data.source, quiet=self.quiet)

    def _build_model(self, num_classes: int, saved: dict | None) -> None:
        """From the checkpoint's architecture and preprocessing when resuming (no download: its
        weights replace any pre-trained ones anyway), else from the config (and the weights).
        The same seed on every rank: every process starts from the same weights."""
        torch.manual_seed(derive_seed(self.config.train.seed, "init"))  # model (and auxiliary head) initialisation
        if saved is not None and saved.get("model_config") and saved.get("preprocess"):
            self.model = VisionTransformer(ViTConfig(**saved["model_config"]))
            self.preprocess = Preprocess.from_dict(saved["preprocess"])
        else:
            self.model, self.preprocess = build_model(self.config, num_classes)
        d, patch = self.config.data, self.model.config.patch_size
        check_on_patch_grid("--test-size", d.test_size, patch)  # before training, not after it
        check_on_patch_grid("--start-size", d.start_size, patch)
        if d.start_size and d.start_size != self.model.config.image_size and self.model.config.pos_embed == "learned":
            raise ConfigError("--start-size (progressive resizing) needs fixed position embeddings: add --pos-embed sincos2d")
        if self.config.train.freeze_backbone:
            freeze_backbone(self.model)
        # the module the optimiser steps: the ViT, with the auxiliary head and the distillation loss
        # if asked (training only); both train the encoder: with a frozen one (a feature extractor)
        # they have nothing to train
        c = self.config
        resizing = bool(d.start_size) and d.start_size != self.model.config.image_size  # smaller batches first: any grid
        self.trained = AnyGrid(self.model) if resizing else self.model
        self.localization = self.distiller = None
        if c.optim.drloc > 0 and not c.train.freeze_backbone:
            self.trained = self.localization = WithDenseRelativeLocalization(self.trained, c.optim.drloc, c.optim.drloc_pairs)
        if c.optim.distill > 0 and not c.train.freeze_backbone:
            self.trained = self.distiller = WithDistillation(self.trained, c.optim.distill)  # its teacher comes in fit()
        self.teacher_history: list[dict] = []
        self.trained.to(self.device)

    def _open_data(self, listed: Listed) -> None:
        """The splits, checked; with the cache on, photos decoded once, as far as the memory budget goes.
        Training photos are decoded and downsized the same way with the cache on or off (kept or
        not): the cache changes the time a run takes, never what it computes."""
        c, p = self.config, self.preprocess
        budget = MemoryBudget(c.data.cache_gb)
        self.train_photos = PhotoCache.decoded(train_decode_size(p), p.interpolation, keep=c.data.cache, budget=budget)
        self.eval_cache = PhotoCache.transformed(eval_transform(p), budget=budget) if c.data.cache else None
        self.data = open_dataset(listed, strict=c.data.strict, val_fraction=c.data.val_fraction, seed=c.train.seed,
                                   train_fraction=c.data.train_fraction, train_cache=self.train_photos if c.data.cache else None,
                                   eval_cache=self.eval_cache, quiet=self.quiet)
        if self.main:
            for split in (self.data.train, self.data.test):
                for line in split.skipped_summary(self.verbose):
                    print(line, file=sys.stderr)
        self.classes = self.data.classes

    def _build_loaders(self) -> None:
        """This rank's loaders: its share of each global training batch, its part of each evaluation split."""
        c, p, ctx = self.config, self.preprocess, self.ctx
        augment = train_transform(p, c.data.augment, c.data.scale_min, c.data.random_erasing)
        train_ds = PhotoDataset(self.data.train, augment, self.train_photos)
        mixer = batch_mixer(len(self.classes), c.data.mixup, c.data.cutmix, c.data.mix_prob)
        pin = self.device.type == "cuda"
        self.train_loader = make_loader(train_ds, c.train.batch_size, train=True, seed=c.train.seed, repeats=c.data.repeated_aug,
                                        workers=c.data.workers, mixer=mixer, pin_memory=pin, rank=ctx.rank, world_size=ctx.world_size)

        self.eval_loaders = {"val": self._eval_loader(self.data.val, p)} if self.data.val is not None else {}
        self.eval_loaders["test"] = self._eval_loader(self.data.test, p)

    def _eval_loader(self, split, preprocess: Preprocess):
        """This rank's part of an evaluation split; from the decode cache when it holds this preprocessing's tensors."""
        c = self.config
        cached = self.eval_cache is not None and preprocess == self.preprocess
        ds = PhotoDataset(split, None, self.eval_cache) if cached else PhotoDataset(split, eval_transform(preprocess))
        # cached photos are finished tensors: workers, started at every evaluation, would only cost time
        return make_loader(ds, max(c.train.batch_size, EVAL_BATCH_SIZE), train=False, workers=0 if cached else c.data.workers,
                           pin_memory=self.device.type == "cuda", rank=self.ctx.rank, world_size=self.ctx.world_size)

    def _build_optimisation(self) -> None:
        """DistributedDataParallel between the model and the optimiser, then optimiser, schedule, EMA."""
        c = self.config
        self.settings = StepSettings(self.device, c.optim.accum_steps, c.optim.clip_grad, c.optim.label_smoothing, c.train.amp,
                                     sync_every=1 if self.device.type == "cpu" else GPU_SYNC_EVERY, reduce=self.ctx.all_reduce,
                                     world_size=self.ctx.world_size, grad_norm=c.train.tensorboard and self.main,
                                     input_shape=(self.model.config.in_channels, self.model.config.image_size, self.model.config.image_size))
        wrapped = self.ctx.wrap(self.trained)
        self.step_model = torch.compile(wrapped) if c.train.compile else wrapped
        self.optimizer = build_optimizer(self.trained, c.optim, self.device)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / c.optim.accum_steps)
        self.scheduler = build_scheduler(self.optimizer, c.optim, self.steps_per_epoch, c.train.epochs)
        self.ema = build_ema(self.model, c.optim.ema)

    def size_warning(self) -> str | None:
        """A word before a long CPU run or a large checkpoint (ViT-B/16: minutes an epoch, 1 GB)."""
        params = sum(p.numel() for p in self.trained.parameters())
        if params < LARGE_MODEL_PARAMS:
            return None
        moments = {"adam": 2, "adamw": 2, "sgd": 1}[self.config.optim.optimizer]
        checkpoint_gb = params * 4 * (1 + moments) / 1e9  # fp32 weights and optimiser state
        slow = (" On a CPU each epoch takes minutes (the course recipe, ViT-B/16: about 3.5 minutes an epoch of "
                "FoodVision Mini's 225 photos on 2 cores).") if self.device.type == "cpu" else ""
        return (f"note: {self.config.model} has {params / 1e6:.1f} M parameters; checkpoint.pt will hold about "
                f"{checkpoint_gb:.1f} GB.{slow}")

    # ------------------------------------------------------------------ checkpoints

    def photo_counts(self) -> dict[str, int]:
        return {"train": len(self.data.train) + (len(self.data.val) if self.data.val is not None else 0), "test": len(self.data.test)}

    def state(self, epochs_done: int) -> dict:
        return {
            "format": "foodvit-checkpoint",
            "epoch": epochs_done,
            "model": self.model.state_dict(),
            "model_config": asdict(self.model.config),
            "preprocess": asdict(self.preprocess),
            "auxiliary": self.localization.drloc.state_dict() if self.localization is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "history": self.history,
            "config": self.config.to_dict(),
            "classes": list(self.classes),
            "photos": self.photo_counts(),
        }

    def restore(self, state: dict) -> None:
        if list(state["classes"]) != list(self.classes):
            raise RunError(f"the checkpoint was trained on classes {state['classes']}, the data in {self.data.root} has "
                           f"{list(self.classes)}; resume with the run's own data (--data) or start a new run")
        photos = state.get("photos")
        if photos is not None and photos != self.photo_counts():
            raise RunError(f"the run was trained on {photos['train']} train / {photos['test']} test photos, the data in "
                           f"{self.data.root} has {self.photo_counts()['train']} / {self.photo_counts()['test']}; "
                           "resume with the same photos, or start a new run")
        try:
            self.model.load_state_dict(state["model"])
            if self.localization is not None:
                self.localization.drloc.load_state_dict(state["auxiliary"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()
            raise RunError(f"{self.out / 'checkpoint.pt'} does not fit the model its config.json describes "
                           f"({first[1].strip() if len(first) > 1 else first[0][:200]}); was it copied from another run? "
                           "Start a new run with --out") from None
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.history = list(state["history"])
        self.start_epoch = int(state["epoch"])

    # ------------------------------------------------------------------ the run

    def input_size(self, epoch: int) -> int:
        """The resolution epoch (from 0) trains at: --start-size for the first --start-share of the
        epochs (progressive resizing), then the model's own."""
        d = self.config.data
        if d.start_size and epoch < round(d.start_share * self.config.train.epochs):
            return d.start_size
        return self.model.config.image_size

    def _before_epoch(self, epoch: int) -> None:
        torch.manual_seed(derive_seed(self.config.train.seed, "step", epoch))  # dropout, mixup, drloc pairs of this epoch
        self.train_loader.batch_sampler.set_epoch(epoch)  # its order and augmentation seeds
        size = self.input_size(epoch)
        self.settings.input_size = 0 if size == self.model.config.image_size else size

    def _after_epoch(self, epoch: int, row: dict) -> None:
        self.history.append(row)
        if self.main:
            write_metrics(self.out / "metrics.csv", self.history)
            save_checkpoint(self.out / "checkpoint.pt", self.state(epoch + 1))
        self.log(_epoch_line(row, self.config.train.epochs))

    def eval_model(self):
        """The model to evaluate (the EMA's, if any), at its own resolution."""
        if self.ema is not None:
            return self.ema.module
        return self.model

    def _hooks(self) -> FitHooks:
        hooks = FitHooks(before_epoch=[self._before_epoch], after_epoch=[self._after_epoch])
        if self.ema is not None:
            hooks.on_step.append(lambda _: self.ema.update_parameters(self.model))
        if self.config.train.tensorboard and self.main:
            from foodvit.training.tracking import TensorBoard

            self.tensorboard = TensorBoard(self.out, self.steps_per_epoch, self.start_epoch)
            hooks.on_step.append(self.tensorboard.on_step)
            hooks.after_epoch.append(self.tensorboard.after_epoch)
        return hooks

    def fit(self) -> Result:
        c = self.config
        hooks = self._hooks()
        with deterministic_algorithms(c.train.deterministic):
            try:
                if self.distiller is not None:
                    self.distiller.set_teacher(self._teacher())
                fit(self.step_model, self.train_loader, self.eval_loaders, self.optimizer, self.scheduler, epochs=c.train.epochs,
                    start_epoch=self.start_epoch, settings=self.settings, hooks=hooks, eval_model=self.eval_model,
                    eval_every=c.train.eval_every, show_progress=not self.quiet, num_classes=len(self.classes))
                return self.finish()
            except TrainingDiverged as err:
                raise TrainingDiverged(f"{err} in epoch {len(self.history) + 1}; training stopped and {self._kept()}. "
                                       "Lower --lr, add --clip-grad 1.0 or --warmup-epochs, then start a new run.") from None
            except PeerLost as err:
                raise PeerLost(f"{err}; {self._kept()}: {resume_command(self.out)}") from None
            except RuntimeError as err:
                if not self.ctx.distributed or isinstance(err, FoodVitError) or not _is_backend_error(err):
                    raise
                raise PeerLost(f"rank {self.ctx.rank}: lost contact with the other training processes ({backend_reason(err)}); "
                               f"{self._kept()}: {resume_command(self.out)}") from None
            finally:
                if self.tensorboard is not None:
                    self.tensorboard.close()

    def _teacher(self) -> torch.nn.Module:
        """The distillation teacher: the run's teacher.pt when it has one (a resumed run), else a
        CNN trained now from random initialisation on the run's training photos, with its
        augmentation, optimiser settings, schedule and epochs, then saved there."""
        c = self.config
        path = self.out / TEACHER_FILE
        torch.manual_seed(derive_seed(c.train.seed, "teacher-init"))
        teacher = build_teacher(c.optim.teacher, len(self.classes)).to(self.device)
        saved = self.ctx.broadcast(self.ctx.on_main(_read_teacher, path, c.optim.teacher))
        if saved is None:
            self.log(f"training the distillation teacher ({c.optim.teacher}, random initialisation) for {c.train.epochs} epochs")
            optimizer = build_optimizer(teacher, c.optim, self.device)
            scheduler = build_scheduler(optimizer, c.optim, self.steps_per_epoch, c.train.epochs)

            def before(epoch: int) -> None:
                torch.manual_seed(derive_seed(c.train.seed, "teacher-step", epoch))
                self.train_loader.batch_sampler.set_epoch(epoch)

            hooks = FitHooks(before_epoch=[before], after_epoch=[lambda _, row: self.log("teacher " + _epoch_line(row, c.train.epochs))])
            history = fit(self.ctx.wrap(teacher), self.train_loader, {"test": self.eval_loaders["test"]}, optimizer, scheduler,
                          epochs=c.train.epochs, settings=replace(self.settings, input_size=0), hooks=hooks,
                          eval_every=c.train.epochs, show_progress=not self.quiet, num_classes=len(self.classes))
            saved = {"format": "foodvit-teacher", "architecture": c.optim.teacher, "model": teacher.state_dict(), "history": history}
            if self.main:
                save_checkpoint(path, saved)
                if not self.history:  # the run is resumable from here: an interruption keeps the trained teacher
                    save_checkpoint(self.out / "checkpoint.pt", self.state(0))
        else:
            teacher.load_state_dict(saved["model"])
            self.log(f"distillation teacher: {path} ({c.optim.teacher}, trained earlier in this run)")
        self.teacher_history = list(saved["history"])
        return teacher

    def _kept(self) -> str:
        if self.history:
            return f"the last good checkpoint (epoch {len(self.history)}) is kept in {self.out / 'checkpoint.pt'}"
        return "no epoch finished"

    def finish(self) -> Result:
        """Final test evaluation (with the confusion matrix; every rank evaluates its part), then,
        on rank 0, the model file, plots and report."""
        model = self.eval_model()
        if isinstance(model, torch.optim.swa_utils.AveragedModel):
            model = model.module
        model, preprocess = self._at_test_size(model)
        loader = self.eval_loaders["test"] if preprocess == self.preprocess else self._eval_loader(self.data.test, preprocess)
        test = evaluate(model, loader, self.settings, num_classes=len(self.classes), keep_probabilities=True, gather=self.ctx.gather)
        test["per_class"] = per_class_accuracy(test["confusion"], self.classes)
        probabilities = test.pop("probabilities")
        if self.main:
            self._write_results(model, test, probabilities, preprocess)
        self.ctx.barrier()  # the other ranks end when the run directory is complete
        return Result(self.out, self.history, test)

    def _at_test_size(self, model: VisionTransformer) -> tuple[VisionTransformer, Preprocess]:
        """The trained model and its preprocessing at --test-size (FixRes): a copy rebuilt for that
        resolution, position embeddings resampled (fixed sin-cos ones recomputed for the new grid)."""
        size = self.config.data.test_size
        if not size or size == model.config.image_size:
            return model, self.preprocess
        return resize_model(model, size).to(self.device).eval(), self.preprocess.at_size(size)

    def _write_results(self, model, test: dict, probabilities: torch.Tensor, preprocess: Preprocess) -> None:
        summary = {"test_acc": test["acc"], "test_loss": test["loss"], "test_n": test["n"], "recipe": self.config.recipe,
                   "epochs": len(self.history), "trained": time.strftime("%Y-%m-%d"), "data": str(self.config.data.source or self.data.root),
                   "train_photos": len(self.data.train)}
        if self.teacher_history:
            summary["teacher_test_acc"] = self.teacher_history[-1]["test_acc"]
        save_model(self.out, model, self.classes, preprocess, {"metrics": summary})
        results, truths = self._test_results(probabilities)
        figures = {"curves": plot_curves(self.history), "confusion": plot_confusion(test["confusion"], self.classes),
                   "most_wrong": most_wrong_figure(results, truths)}
        for name, figure in figures.items():
            save_figure(figure, self.out / f"{name}.png")
        counts = {"train": self.data.train.counts(), "test": self.data.test.counts()}
        if self.data.val is not None:
            counts["val"] = self.data.val.counts()
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        info = {"params": params, "trainable": trainable, "image_size": model.config.image_size, "train_image_size": self.model.config.image_size,
                "patch_size": model.config.patch_size, "data_root": str(self.data.root), "device": _device_name(self.device),
                "processes": self.ctx.world_size}
        sections = ["## Most confidently wrong test photos", "", "![most wrong](most_wrong.png)", ""]
        if self.teacher_history:
            last = self.teacher_history[-1]  # evaluated on the test split at its last epoch
            sections = ["## Distillation teacher", "",
                     f"{self.config.optim.teacher} trained from random initialisation on the same photos for {last['epoch']} epochs "
                     f"({sum(r['seconds'] for r in self.teacher_history):.0f} s): test accuracy {last['test_acc']:.3f} "
                     f"(per image). The ViT learned from its labels (weight {self.config.optim.distill:g}); the saved model "
                     f"is the ViT alone, and `{TEACHER_FILE}` keeps the teacher.", ""] + sections
        write_report(self.out, config=self.config, classes=self.classes, counts=counts, history=self.history, final=test,
                     model_info=info, extra_sections=sections)
        if self.tensorboard is not None:
            figures["predictions"] = predictions_figure(results, truths)
            self.tensorboard.finish(config=self.config.to_dict(), final=test, figures=figures, epochs=len(self.history))

    def _test_results(self, probabilities: torch.Tensor) -> tuple[list[dict], list[str]]:
        """Each test photo's prediction (as predict gives it) and its true class."""
        top = probabilities.max(dim=1)
        results = [{"image": str(path), "label": self.classes[i], "probability": p}
                   for (path, _), p, i in zip(self.data.test.samples, top.values.tolist(), top.indices.tolist())]
        return results, [self.classes[label] for _, label in self.data.test.samples]


def _read_teacher(path: Path, architecture: str) -> dict | None:
    """A run's saved distillation teacher, or None when it has none yet."""
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    if state.get("format") != "foodvit-teacher" or state.get("architecture") != architecture:
        raise RunError(f"{path} is not this run's {architecture} distillation teacher; remove it to train the teacher again")
    return state


def _is_backend_error(err: RuntimeError) -> bool:
    """Whether a RuntimeError comes from the process group's transport (a peer gone, a timeout)."""
    import torch.distributed as dist

    text = str(err).lower()
    return isinstance(err, dist.DistError) or any(w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer"))


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


def with_source(config: RunConfig) -> RunConfig:
    """The config with the data source it will really use (FOODVIT_DATA's, or the course's URL,
    when none is given), so that config.json says where the photos came from."""
    if config.data.source:
        return config
    return replace(config, data=replace(config.data, source=default_source()))


class NewRunDirectory:
    """A new run's folder, for the time of its start: created (or an empty one taken), locked, and,
    if the run fails before its first checkpoint, left as it was found (nothing to resume)."""

    def __init__(self, out: Path) -> None:
        self.out, self.created = Path(out), False
        self.lock = RunLock(self.out)

    def __enter__(self) -> "NewRunDirectory":
        out = self.out
        if out.exists() and not out.is_dir():
            raise RunError(f"--out {out} is a file; a run directory is a folder: choose another --out")
        self.created = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        except FoodVitError:
            raise
        except OSError as err:
            self._forget()
            raise RunError(f"cannot write to {out} ({err.strerror or err}); choose a writable --out") from None
        others = sorted(p.name for p in out.iterdir() if p.name != RunLock.NAME)
        if others:
            self.lock.release()
            if "checkpoint.pt" in others or "model.safetensors" in others:
                raise RunError(f"{out} already holds a run; continue it with `foodvit train --resume {out}` or choose another --out")
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise RunError(f"{out} is not empty ({shown}) and holds no foodvit run; foodvit writes a new run only into a new "
                           "or empty folder, so that nothing of yours is overwritten: choose another --out")
        return self

    def __exit__(self, kind, error, tb) -> None:
        self.lock.release()
        if kind is not None and not (self.out / "checkpoint.pt").exists():
            self._forget()

    def _forget(self) -> None:
        """Remove what this start wrote (foodvit's own files only), and the folder if it made it."""
        for name in RUN_FILES:
            (self.out / name).unlink(missing_ok=True)
        if self.created:
            try:
                self.out.rmdir()  # only if empty
            except OSError:
                pass


class OnMain:
    """A context manager entered and left by rank 0 alone; an error entering it stops every rank."""

    def __init__(self, manager, ctx: Context) -> None:
        self.manager, self.ctx = manager, ctx

    def __enter__(self):
        return self.ctx.on_main(self.manager.__enter__)

    def __exit__(self, *exc):
        return self.manager.__exit__(*exc) if self.ctx.is_main else None


def train(config: RunConfig, out: str | Path | None = None, *, quiet: bool = False, log=print, verbose: bool = False,
          context: Context | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Start a new run in `out` (a new or empty folder; default runs/<date>-<time>). With
    pre-trained weights, the model is the one the weights dictate (pretrained.adapt_config).
    Under torchrun every rank calls this with the same arguments; rank 0 writes the run."""
    out = Path(out) if out else default_out()
    config = with_source(config)
    if config.train.pretrained:
        from foodvit.model.pretrained import adapt_config

        config = adapt_config(config)
    with contextlib.nullcontext(context) if context else Context.from_environment(config.train.device, timeout_s) as ctx:
        log = log if ctx.is_main else (lambda *a, **k: None)
        with OnMain(NewRunDirectory(out), ctx):
            if ctx.is_main:
                write_text(out / "config.json", config.to_json())
            trainer = Trainer(config, out, quiet=quiet, log=log, verbose=verbose, context=ctx)
            warning = trainer.size_warning()
            if warning and ctx.is_main:
                print(warning, file=sys.stderr)
            processes = f" on {ctx.world_size} processes" if ctx.distributed else ""
            if not quiet:
                log(f"training {config.model} ({config.recipe} recipe) on {trainer.data.root}: {len(trainer.data.train)} train / "
                    f"{len(trainer.data.test)} test photos, classes {', '.join(trainer.classes)}{processes}; run directory {out}")
            return trainer.fit()


def config_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """'key: a -> b' for every setting that differs between two nested config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += config_differences(x, y, f"{prefix}{key}.")
        elif (list(x) if isinstance(x, tuple) else x) != (list(y) if isinstance(y, tuple) else y):
            out.append(f"{prefix}{key}: {x!r} -> {y!r}")
    return out


def resume(out: str | Path, *, quiet: bool = False, log=print, data: str | None = None, verbose: bool = False,
           context: Context | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Finish the run in `out` from its last checkpoint, exactly as configured when it started, on
    as many processes as given (rank 0 reads the run and hands it to the others).

    The photos come from the source stored with the run; `data` points at the same photos moved
    elsewhere (same classes and number of photos, checked)."""
    out = Path(out)
    with contextlib.nullcontext(context) if context else Context.from_environment(_stored_device(out), timeout_s) as ctx:
        log = (lambda *a, **k: None) if quiet or not ctx.is_main else log
        ctx.on_main(_check_is_run, out)
        with OnMain(RunLock(out), ctx):
            config, state = ctx.on_main(_read_run, out, data, log) or (None, None)
            if ctx.distributed:
                config, state = ctx.broadcast((config, state))
            trainer = Trainer(config, out, quiet=quiet, log=log, saved=state, verbose=verbose, context=ctx)
            trainer.restore(state)
            if data and ctx.is_main:
                write_text(out / "config.json", config.to_json())
            log(f"resuming {out} after epoch {trainer.start_epoch} of {config.train.epochs}"
                + (f" on {ctx.world_size} processes" if ctx.distributed else ""))
            return trainer.fit()


def _stored_device(out: Path) -> str:
    """The device setting a run was started with (to pick this process's device before reading the run)."""
    try:
        return read_config(out / "config.json").train.device
    except FoodVitError:
        return "auto"  # the checks in _read_run say what is wrong


def _check_is_run(out: Path) -> None:
    if not (out / "config.json").is_file():
        raise RunError(f"{out} holds no foodvit run (no config.json); start one with foodvit train --out {out}")


def _read_run(out: Path, data: str | None, log) -> tuple[RunConfig, dict]:
    """A run's settings and last checkpoint, checked against each other."""
    config_path = out / "config.json"
    config = read_config(config_path)
    state = load_checkpoint(out / "checkpoint.pt")
    if state.get("config") is not None:
        # the stored settings through today's defaults: settings added since the run started are not edits
        try:
            stored = RunConfig.from_dict(state["config"]).to_dict()
        except (FoodVitError, TypeError):
            stored = state["config"]
        differences = config_differences(stored, config.to_dict())
        if differences:
            raise RunError(f"{config_path} differs from the settings the run started with ({'; '.join(differences)}); "
                           "a resumed run continues with its own settings: undo the edit, or start a new run with --out")
    if data:
        log(f"data: {data} (given with --resume; the run started with {config.data.source or 'the default source'})")
        config = replace(config, data=replace(config.data, source=str(data)))
    elif config.data.source:
        log(f"data: {config.data.source} (stored with the run)")
    else:  # runs of older versions stored "" for the default source
        config = with_source(config)
        log(f"data: {config.data.source} (the run stored no source; the default now)")
    return config, state
