"""`foodvit train`: a RunConfig in, a run directory out, on one process or on many (torchrun).

A Trainer is a few explicit build steps, in this order: the processes (distributed.Context:
device from LOCAL_RANK, the process group), the classes of the data, the model (whose
preprocessing the caches need), the data sets and loaders (this rank's share of each batch), the
module the optimiser steps (the auxiliary head; wrapped in DistributedDataParallel), the
optimiser, schedule and EMA. Then fit() trains the CNN teacher when a loss reads one
(distill.py), pre-trains when --pretrain-epochs asks (pretrain.py), and runs the engine with
hooks: seeding and sampler order before each epoch; EMA, TensorBoard and the progress bar after
each step; metrics, checkpoint and report after each epoch (rank 0 alone writes). One process is
the plain case of the same code.

Reproducibility: every random stream (model initialisation, validation split, photo order,
augmentation, the rest of a step) has its own seed derived from the run seed (seeds.py), those
of epoch e from (seed, purpose, e), and a checkpoint is written after every epoch, so a resumed run
finishes exactly as an uninterrupted one would (on the CPU), on as many processes as it likes.
The seeding happens on the Trainer's own copy of PyTorch's random state (engine.own_random_state):
the caller's, a notebook's say, is as it was afterwards. The run directory's rules (new or empty
folder, one writer, nothing left by a failed start) live in rundir/directory.py.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from foodvit.config import RunConfig, ViTConfig, check_on_patch_grid
from foodvit.data.datasets import MemoryBudget, PhotoCache, PhotoDataset, open_dataset
from foodvit.data.datasource import DataSource, Listed
from foodvit.data.preprocess import Preprocess
from foodvit.data.sampling import make_loader
from foodvit.data.transforms import batch_mixer, eval_transform, train_transform
from foodvit.errors import FoodVitError, RunError
from foodvit.files import write_text
from foodvit.model.build import build_model
from foodvit.model.variants import check_start_size
from foodvit.model.vit import VisionTransformer
from foodvit.model.weights import resize_model
from foodvit.rundir import directory as rundir
from foodvit.seeds import derive_seed
from foodvit.training import auxiliary
from foodvit.training.compiling import compile_step
from foodvit.training.distill import borrowed_teacher, train_or_load_teacher
from foodvit.training.distributed import DEFAULT_TIMEOUT_S, Context, OnMain, PeerLost, is_backend_error
from foodvit.training.engine import (
    FitHooks,
    StepSettings,
    TrainingDiverged,
    deterministic_algorithms,
    epoch_line,
    evaluate,
    fit,
    own_random_state,
)
from foodvit.training.freezing import freeze_backbone
from foodvit.training.guidance import epoch_weight
from foodvit.training.masked import check_reconstructable
from foodvit.training.optim import build_ema, build_optimizer, build_scheduler
from foodvit.training.pretrain import pretrain
from foodvit.training.report import per_class_accuracy, size_note, write_results
from foodvit.training.resizing import AnyGrid


@dataclass
class Result:
    run: Path
    history: list[dict]
    test: dict  # loss, acc, n, confusion, per_class


EVAL_BATCH_SIZE = 64  # evaluation batches at least this large: no gradients, so memory allows it
GPU_SYNC_EVERY = 25  # on a GPU, check the loss for NaN every this many steps (each check waits for the GPU)


def train_decode_size(p: Preprocess) -> int:
    """The shorter side training photos are decoded to: enough for the eval resize and for random
    resized crops to zoom in twofold without upsampling."""
    return max(p.resize_size, 2 * p.image_size)


class Trainer:
    """One run on this process: built step by step from a config (and, when resuming, its
    checkpoint), then fitted. Under torchrun every rank builds one; rank 0 alone writes."""

    def __init__(self, config: RunConfig, out: Path, *, quiet: bool = False, log=print, saved: dict | None = None,
                 verbose: bool = False, context: Context | None = None, teacher_file: Path | None = None) -> None:
        self.config, self.out, self.verbose = config, Path(out), verbose
        self.teacher_file = teacher_file  # a teacher.pt another run trained with this run's teacher settings (distill.borrowed_teacher)
        self.ctx = context or Context.from_environment(config.train.device)
        self.main = self.ctx.is_main
        self.quiet = quiet or not self.main  # progress bars and lines on rank 0 only
        self.log = (lambda *a, **k: None) if self.quiet else log
        self.device = self.ctx.device
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
            return DataSource.parse(self.config.data.source, self.config.data.train_fraction).listed(seed=self.config.train.seed, quiet=self.quiet)

    def _build_model(self, num_classes: int, saved: dict | None) -> None:
        """From the checkpoint's architecture and preprocessing when resuming (no download: its
        weights replace any pre-trained ones anyway), else from the config (and the weights).
        The same seed on every rank: every process starts from the same weights."""
        with own_random_state(self.device):
            torch.manual_seed(derive_seed(self.config.train.seed, "init"))  # model (and auxiliary head) initialisation
            self._build_modules(num_classes, saved)

    def _build_modules(self, num_classes: int, saved: dict | None) -> None:
        if saved is not None and saved.get("model_config") and saved.get("preprocess"):
            self.model = VisionTransformer(ViTConfig(**saved["model_config"]))
            self.preprocess = Preprocess.from_dict(saved["preprocess"])
        else:
            self.model, self.preprocess = build_model(self.config, num_classes)
        d, patch = self.config.data, self.model.config.patch_size
        check_on_patch_grid("--test-size", d.test_size, patch)  # before training, not after it
        check_start_size(self.model.config, d.start_size)
        if self.config.train.freeze_backbone:
            freeze_backbone(self.model)
        # the module the optimiser steps: the ViT inside the auxiliary losses that are on (training only)
        resizing = bool(d.start_size) and d.start_size != self.model.config.image_size  # smaller batches first: any grid
        self.grid_model = AnyGrid(self.model) if resizing else self.model
        self.aux = auxiliary.wrap(self.grid_model, self.config.optim, num_classes, frozen=self.config.train.freeze_backbone)
        self.pretrained = False  # whether the self-supervised stage (pretrain.py) is done
        self.pretraining: list[dict] = []  # its epochs' rows, while it runs
        self.stage = "epoch"  # what is training now, for a message: the supervised epochs or the stage before them
        if self.config.optim.pretrain_epochs:
            check_reconstructable(self.model.config.pool, "--pretrain-epochs")  # before any photo is read
        self.trained = self.aux.trained
        self.teacher_history: list[dict] = []
        self.teacher_lent_by: str | None = None  # the run whose teacher this one borrowed
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
                                   train_cache=self.train_photos if c.data.cache else None,
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
                                     world_size=self.ctx.world_size, grad_norm=c.train.tensorboard and self.main, sam=c.optim.sam,
                                     input_shape=(self.model.config.in_channels, self.model.config.image_size, self.model.config.image_size))
        wrapped = self.ctx.wrap(self.trained)
        self.step_model = compile_step(wrapped, self.device) if c.train.compile else wrapped
        self.optimizer = build_optimizer(self.trained, c.optim, self.device)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / c.optim.accum_steps)
        self.scheduler = build_scheduler(self.optimizer, c.optim, self.steps_per_epoch, c.train.epochs)
        self.ema = build_ema(self.model, c.optim.ema)

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
            **self.aux.state_dict(),  # the auxiliary losses' own parts
            "pretrained": self.pretrained,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "history": self.history,
            "config": self.config.to_dict(),
            "classes": list(self.classes),
            "photos": self.photo_counts(),
        }

    def restore(self, state: dict) -> None:
        rundir.check_same_data(state, self.classes, self.photo_counts(), self.data.root)
        try:
            self.model.load_state_dict(state["model"])
            self.aux.load_state_dict(state)
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
        self.pretrained = bool(state.get("pretrained")) or self.start_epoch > 0

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
        if self.aux.guide is not None:
            o = self.config.optim
            self.aux.guide.weight = epoch_weight(o.guidance, o.guidance_schedule, epoch, self.config.train.epochs)

    def _after_epoch(self, epoch: int, row: dict) -> None:
        self.history.append(row)
        if self.main:
            rundir.write_metrics(self.out / "metrics.csv", self.history)
            rundir.save_checkpoint(self.out / "checkpoint.pt", self.state(epoch + 1))
        self.log(epoch_line(row, self.config.train.epochs))

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
        with deterministic_algorithms(c.train.deterministic), own_random_state(self.device), warnings.catch_warnings():
            # a share of one photo gives the class token a gradient that is a view (expand over a batch
            # of 1 is no copy): DDP copies it into its bucket and warns about performance, needlessly
            warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
            try:
                if self.aux.need_teacher:
                    self.aux.set_teacher(train_or_load_teacher(self))
                if c.optim.pretrain_epochs and not self.pretrained:
                    self.stage = "self-supervised pre-training epoch"
                    pretrain(self, self.pretraining)
                    self.pretrained, self.stage = True, "epoch"
                    if self.main:  # resumable from here: an interruption keeps the pre-trained weights
                        rundir.save_checkpoint(self.out / "checkpoint.pt", self.state(0))
                fit(self.step_model, self.train_loader, self.eval_loaders, self.optimizer, self.scheduler, epochs=c.train.epochs,
                    start_epoch=self.start_epoch, settings=self.settings, hooks=hooks, eval_model=self.eval_model,
                    eval_every=c.train.eval_every, show_progress=not self.quiet, num_classes=len(self.classes))
                return self.finish()
            except TrainingDiverged as err:
                self.ctx.stopping()  # every rank diverges at once (a collective check): keep this advice through torchrun's SIGTERM
                epoch = len(self.history if self.stage == "epoch" else self.pretraining) + 1
                raise TrainingDiverged(f"{err} in {self.stage} {epoch}; training stopped and {self._kept()}. "
                                       "Lower --lr, add --clip-grad 1.0 or --warmup-epochs, then start a new run.") from None
            except PeerLost as err:
                raise PeerLost(f"{err}; {self._kept()}: {rundir.resume_command(self.out)}") from None
            except RuntimeError as err:
                if not self.ctx.distributed or isinstance(err, FoodVitError) or not is_backend_error(err):
                    raise
                raise PeerLost(f"{self.ctx.peer_lost(err)}; {self._kept()}: {rundir.resume_command(self.out)}") from None
            finally:
                if self.tensorboard is not None:
                    self.tensorboard.close()

    def _kept(self) -> str:
        if self.history:
            return f"the last good checkpoint (epoch {len(self.history)}) is kept in {self.out / 'checkpoint.pt'}"
        if self.pretrained:
            return f"the pre-trained weights are kept in {self.out / 'checkpoint.pt'}"
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
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            write_results(self.out, config=self.config, data=self.data, model=model, trainable=trainable, train_size=self.model.config.image_size,
                          preprocess=preprocess, test=test, probabilities=probabilities, history=self.history,
                          teacher_history=self.teacher_history, teacher_lent_by=self.teacher_lent_by, device=self.device, processes=self.ctx.world_size,
                          tensorboard=self.tensorboard)
        self.ctx.barrier()  # the other ranks end when the run directory is complete
        return Result(self.out, self.history, test)

    def _at_test_size(self, model: VisionTransformer) -> tuple[VisionTransformer, Preprocess]:
        """The trained model and its preprocessing at --test-size (FixRes): a copy rebuilt for that
        resolution, position embeddings resampled (fixed sin-cos ones recomputed for the new grid)."""
        size = self.config.data.test_size
        if not size or size == model.config.image_size:
            return model, self.preprocess
        return resize_model(model, size).to(self.device).eval(), self.preprocess.at_size(size)


def train(config: RunConfig, out: str | Path | None = None, *, quiet: bool = False, log=print, verbose: bool = False,
          context: Context | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, teacher_from: Path | None = None) -> Result:
    """Start a new run in `out` (a new or empty folder; default runs/<date>-<time>). With
    pre-trained weights, the model is the one the weights dictate (pretrained.adapt_config).
    Under torchrun every rank calls this with the same arguments; rank 0 writes the run.
    teacher_from: a distilled or guided run on the same photos whose CNN teacher this run borrows
    instead of training it (checked to have this run's teacher settings; the photos are the caller's word)."""
    out = Path(out) if out else rundir.default_out()
    config = rundir.with_source(config)
    if config.train.pretrained:
        from foodvit.model.pretrained import adapt_config

        config = adapt_config(config)
    teacher_file = borrowed_teacher(teacher_from, config) if teacher_from is not None else None
    with contextlib.nullcontext(context) if context else Context.from_environment(config.train.device, timeout_s) as ctx:
        log = log if ctx.is_main else (lambda *a, **k: None)
        with OnMain(rundir.NewRunDirectory(out), ctx):
            if ctx.is_main:
                write_text(out / "config.json", config.to_json())
            trainer = Trainer(config, out, quiet=quiet, log=log, verbose=verbose, context=ctx, teacher_file=teacher_file)
            warning = size_note(config, sum(p.numel() for p in trainer.trained.parameters()), trainer.device)
            if warning and ctx.is_main:
                print(warning, file=sys.stderr)
            processes = f" on {ctx.world_size} processes" if ctx.distributed else ""
            if not quiet:
                log(f"training {config.model} ({config.recipe} recipe) on {trainer.data.root}: {len(trainer.data.train)} train / "
                    f"{len(trainer.data.test)} test photos, classes {', '.join(trainer.classes)}{processes}; run directory {out}")
            return trainer.fit()


def resume(out: str | Path, *, quiet: bool = False, log=print, data: str | None = None, verbose: bool = False,
           context: Context | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Finish the run in `out` from its last checkpoint, exactly as configured when it started, on
    as many processes as given (rank 0 reads the run and hands it to the others).

    The photos come from the source stored with the run; `data` points at the same photos moved
    elsewhere (same classes and number of photos, checked)."""
    out = Path(out)
    with contextlib.nullcontext(context) if context else Context.from_environment(rundir.stored_device(out), timeout_s) as ctx:
        log = (lambda *a, **k: None) if quiet or not ctx.is_main else log
        ctx.on_main(rundir.check_is_run, out)
        with OnMain(rundir.RunLock(out), ctx):
            config, state = ctx.on_main(rundir.read_for_resume, out, data, log) or (None, None)
            if ctx.distributed:
                config, state = ctx.broadcast((config, state))
            trainer = Trainer(config, out, quiet=quiet, log=log, saved=state, verbose=verbose, context=ctx)
            trainer.restore(state)
            if data and ctx.is_main:
                write_text(out / "config.json", config.to_json())
            log(f"resuming {out} after epoch {trainer.start_epoch} of {config.train.epochs}"
                + (f" on {ctx.world_size} processes" if ctx.distributed else ""))
            return trainer.fit()
