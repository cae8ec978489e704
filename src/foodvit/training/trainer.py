"""A run's machinery: a RunConfig in, a run directory out, on one process or on many (torchrun);
training/run.py starts or resumes one (`foodvit train`, `foodvit train --resume`).

A Trainer is a few explicit build steps, in this order: the processes (distributed.Context:
device from LOCAL_RANK, the process group), the classes of the data, the model (whose
preprocessing the caches need) and the training objectives that are on (objectives/), the data
sets and loaders (loading.py: this rank's share of each batch), the module the optimiser steps
(wrapped in DistributedDataParallel), the optimiser, schedule and EMA. Then fit() obtains the CNN
teacher when an objective reads one (teacher.py), pre-trains when --pretrain-epochs asks
(pretrain.py), and runs the engine with hooks: seeding, sampler order and the objectives' epoch
before each epoch; EMA, TensorBoard and the progress bar after each step; metrics, checkpoint and
report after each epoch (rank 0 alone writes); then the final test, at --test-size when asked, and the
run's model files and report. One process is the plain case of the same code.

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
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from foodvit.data.datasource import Listed
from foodvit.data.preprocess import Preprocess
from foodvit.errors import FoodVitError, RunError
from foodvit.model.build import build_model
from foodvit.model.variants import check_start_size
from foodvit.model.vit import VisionTransformer
from foodvit.model.weights import resize_model
from foodvit.rundir import directory as rundir
from foodvit.seeds import derive_seed
from foodvit.settings.model import ViTConfig, check_on_patch_grid
from foodvit.settings.run import RunConfig
from foodvit.training import loading, objectives
from foodvit.training.compiling import compile_step
from foodvit.training.distributed import Context, PeerLost, is_backend_error
from foodvit.training.engine import (
    FitHooks,
    StepSettings,
    TrainingDiverged,
    arithmetic,
    deterministic_algorithms,
    epoch_line,
    evaluate,
    fit,
    own_random_state,
    processor,
    silent,
)
from foodvit.training.freezing import freeze_backbone
from foodvit.training.objectives.masked import check_reconstructable
from foodvit.training.optim import build_ema, build_optimizer, build_scheduler
from foodvit.training.pretrain import pretrain
from foodvit.training.report import per_class_accuracy, write_results
from foodvit.training.resizing import AnyGrid
from foodvit.training.stages import StageData
from foodvit.training.teacher import Teacher, TeacherSetup, obtain_teacher

if TYPE_CHECKING:
    from foodvit.training.tracking import TensorBoard


GPU_SYNC_EVERY = 25  # on a GPU, check the loss for NaN every this many steps (each check waits for the GPU)


@dataclass
class Result:
    """What a run ends with (train() and resume() return it): its folder, its epochs' rows and the final test."""

    run: Path
    history: list[dict]
    test: dict  # loss, acc, n, confusion, per_class


def resumed(before, here: str, trains_here: bool = True) -> str:
    """What a resumed run's epochs trained in or on: `before` (its checkpoint's record) followed by `here` when this
    process differs from the last it names ("X, then Y") and trains an epoch (a run resumed only to write its
    results keeps `before`); `here` when the checkpoint records none."""
    if not isinstance(before, str) or not before:
        return here
    return before if not trains_here or before.rsplit(", then ", 1)[-1] == here else f"{before}, then {here}"


class Trainer:
    """One run on this process: built step by step from a config (and, when resuming, its
    checkpoint), then fitted. Under torchrun every rank builds one; rank 0 alone writes."""

    def __init__(
        self,
        config: RunConfig,
        out: Path,
        *,
        quiet: bool = False,
        log=print,
        saved: dict | None = None,
        verbose: bool = False,
        context: Context | None = None,
        teacher_file: Path | None = None,
    ) -> None:
        self.config, self.out, self.verbose = config, Path(out), verbose
        # a teacher.pt another run trained with this run's teacher settings (teacher.borrowed_teacher)
        self.teacher_file = teacher_file
        self.ctx = context or Context.from_environment(config.train.device)
        self.main = self.ctx.is_main
        self.quiet = quiet or not self.main  # progress bars and lines on rank 0 only
        self.log = silent if self.quiet else log
        self.device = self.ctx.device
        # what the run's epochs train in (engine.arithmetic) and on (engine.processor); a run resumed elsewhere names
        # both ("X, then Y")
        self.trained_in = arithmetic(self.device, config.train.amp)
        self.chip = processor(self.device)
        self.history: list[dict] = []
        self.start_epoch = 0
        if config.train.tensorboard and self.main:
            from foodvit.training.tracking import require_tensorboard

            require_tensorboard()  # before any photo is read
        with self.ctx.main_first():  # the first process of each machine downloads or unpacks the source
            listed = loading.list_data(config, quiet=self.quiet)  # not kept: the checked splits replace it
        self._build_model(len(listed.classes), saved)
        self._open_data(listed)
        self._build_optimisation()
        self.tensorboard: TensorBoard | None = None

    # ------------------------------------------------------------------ build steps

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
        # the module the optimiser steps: the ViT, with the training objectives that are on (training only)
        # smaller batches first: any grid
        resizing = bool(d.start_size) and d.start_size != self.model.config.image_size
        self.grid_model = AnyGrid(self.model) if resizing else self.model
        self.objectives = objectives.build(
            self.grid_model, self.config, num_classes, frozen=self.config.train.freeze_backbone
        )
        self.pretrained = False  # whether the self-supervised stage (pretrain.py) is done
        self.pretraining: list[dict] = []  # its epochs' rows, while it runs
        self.stage = "epoch"  # what is training now, for a message: the supervised epochs or the stage before them
        if self.config.pretrain.epochs:
            check_reconstructable(self.model.config.pool, "--pretrain-epochs")  # before any photo is read
        self.trained = self.objectives
        self.teacher_history: list[dict] = []
        self.teacher_lent_by: str | None = None  # the run whose teacher this one borrowed
        self.trained.to(self.device)

    def _open_data(self, listed: Listed) -> None:
        """The splits, checked, and this rank's loaders (training/loading.py)."""
        self.data, self.caches = loading.open_data(
            self.config, self.preprocess, listed, quiet=self.quiet, verbose=self.verbose, main=self.main
        )
        self.classes = self.data.classes
        self.train_loader = loading.train_loader(self.config, self.preprocess, self.data, self.caches, self.ctx)
        self.eval_loaders = (
            {"val": self.eval_loader(self.data.val, self.preprocess)} if self.data.val is not None else {}
        )
        self.test_loader = self.eval_loader(self.data.test, self.preprocess)
        if self.data.pool is None:  # with a validation source, the test split is read once, at the end
            self.eval_loaders["test"] = self.test_loader

    def eval_loader(self, split, preprocess: Preprocess):
        return loading.eval_loader(
            self.config, split, preprocess, self.caches, self.ctx, own=preprocess == self.preprocess
        )

    def _build_optimisation(self) -> None:
        """DistributedDataParallel between the model and the optimiser, then optimiser, schedule, EMA."""
        c = self.config
        self.settings = StepSettings(
            self.device,
            c.optim.accum_steps,
            c.optim.clip_grad,
            c.optim.label_smoothing,
            c.train.amp,
            sync_every=1 if self.device.type == "cpu" else GPU_SYNC_EVERY,
            reduce=self.ctx.all_reduce,
            world_size=self.ctx.world_size,
            grad_norm=c.train.tensorboard and self.main,
            sam=c.optim.sam,
            input_shape=(self.model.config.in_channels, self.model.config.image_size, self.model.config.image_size),
        )
        wrapped = self.ctx.wrap(self.trained)
        self.step_model = compile_step(wrapped, self.device) if c.train.compile else wrapped
        self.optimizer = build_optimizer(self.trained, c.optim, self.device)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / c.optim.accum_steps)
        self.scheduler = build_scheduler(self.optimizer, c.optim, self.steps_per_epoch, c.train.epochs)
        self.ema = build_ema(self.model, c.optim.ema)

    # ------------------------------------------------------------------ checkpoints

    def photo_counts(self) -> dict:
        """The photos the run trains and tests on, in all and a class (in the classes' order): what a resume
        checks its data against."""
        held = self.data.val.counts() if self.data.val is not None else {}
        train = [n + held.get(name, 0) for name, n in self.data.train.counts().items()]
        test = list(self.data.test.counts().values())
        return {"train": sum(train), "test": sum(test), "train_by_class": train, "test_by_class": test}

    def state(self, epochs_done: int) -> dict:
        return {
            "format": rundir.CHECKPOINT_FORMAT,
            "epoch": epochs_done,
            "model": self.model.state_dict(),
            "model_config": asdict(self.model.config),
            "preprocess": asdict(self.preprocess),
            **self.objectives.state_dict_of_parts(objectives.checkpoint_keys()),  # the objectives' own parts
            "pretrained": self.pretrained,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "history": self.history,
            "config": self.config.to_dict(),
            "classes": list(self.classes),
            "photos": self.photo_counts(),
            "arithmetic": self.trained_in,
            "processor": self.chip,
        }

    def restore(self, state: dict) -> None:
        rundir.check_same_data(state, self.classes, self.photo_counts(), self.data.root)
        try:
            self.model.load_state_dict(state["model"])
            self.objectives.load_parts(state)
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()
            raise RunError(
                f"{self.out / 'checkpoint.pt'} does not fit the model its config.json describes "
                f"({first[1].strip() if len(first) > 1 else first[0][:200]}); was it copied from another run? "
                "Start a new run with --out"
            ) from None
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.history = list(state["history"])
        self.start_epoch = int(state["epoch"])
        self.pretrained = bool(state.get("pretrained")) or self.start_epoch > 0
        if self.start_epoch > 0:  # what its epochs so far trained in and on (absent before foodvit recorded them)
            before = state.get("arithmetic")
            trains_here = self.start_epoch < self.config.train.epochs  # else only its results are written here
            last = before.rsplit(", then ", 1)[-1] if isinstance(before, str) and before else self.trained_in
            if trains_here and last != self.trained_in:
                self.log(
                    f"{self.out}: trained in {last} up to epoch {self.start_epoch}, and the rest trains in "
                    f"{self.trained_in} here, so the run is not the one either machine alone would give (its "
                    "model.json names both)"
                )
            self.trained_in = resumed(before, self.trained_in, trains_here)
            self.chip = resumed(state.get("processor"), self.chip, trains_here)

    # ------------------------------------------------------------------ the stages before the run's epochs

    def stage_data(self) -> StageData:
        """What a stage before the run's own epochs trains on (training/stages.py)."""
        return StageData(self.train_loader, self.ctx, self.config.train.seed, self.steps_per_epoch, self.quiet)

    def teacher(self) -> Teacher:
        """The run's CNN teacher (training/teacher.py): its teacher.pt, the one lent to it, or one trained now
        on the run's photos; while it trains, the run is resumable after each of its epochs."""
        setup = TeacherSetup.of_run(
            self.config,
            len(self.classes),
            self.settings,
            self.preprocess.image_size,
            {**self.eval_loaders, "test": self.test_loader},
            self.ctx.world_size,
        )
        return obtain_teacher(
            setup,
            self.stage_data(),
            self.out,
            lent=self.teacher_file,
            log=self.log,
            resumable=self._resumable_before_training,
        )

    def _resumable_before_training(self) -> None:
        """A checkpoint of the run before its first epoch, where it has none yet: resumable from here."""
        if self.main and not self.history:
            rundir.save_checkpoint(self.out / "checkpoint.pt", self.state(0))

    # ------------------------------------------------------------------ the run

    def input_size(self, epoch: int) -> int:
        """The resolution epoch (from 0) trains at: --start-size for the first --start-share of the
        epochs (progressive resizing), then the model's own."""
        d = self.config.data
        if d.start_size and epoch < round(d.start_share * self.config.train.epochs):
            return d.start_size
        return self.model.config.image_size

    def _before_epoch(self, epoch: int) -> None:
        # dropout, mixup, drloc pairs of this epoch
        torch.manual_seed(derive_seed(self.config.train.seed, "step", epoch))
        self.train_loader.batch_sampler.set_epoch(epoch)  # its order and augmentation seeds
        size = self.input_size(epoch)
        self.settings.input_size = 0 if size == self.model.config.image_size else size
        self.objectives.set_epoch(epoch, self.config.train.epochs)  # an objective's weight may follow the epochs

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
        ema = self.ema
        if ema is not None:
            hooks.on_step.append(lambda _: ema.update_parameters(self.model))
        if self.config.train.tensorboard and self.main:
            from foodvit.training.tracking import TensorBoard

            self.tensorboard = TensorBoard(self.out, self.steps_per_epoch, self.start_epoch)
            hooks.on_step.append(self.tensorboard.on_step)
            hooks.after_epoch.append(self.tensorboard.after_epoch)
        return hooks

    def fit(self) -> Result:
        """The stages before the run's epochs (stages()), then its epochs and its final test."""
        c = self.config
        hooks = self._hooks()
        with self._guarded():
            self._stages()
            fit(
                self.step_model,
                self.train_loader,
                self.eval_loaders,
                self.optimizer,
                self.scheduler,
                epochs=c.train.epochs,
                start_epoch=self.start_epoch,
                settings=self.settings,
                hooks=hooks,
                eval_model=self.eval_model,
                eval_every=c.train.eval_every,
                show_progress=not self.quiet,
                num_classes=len(self.classes),
            )
            return self._final_test()

    def stages(self) -> None:
        """Only the stages before the run's epochs (its CNN teacher, its pre-training), each kept as it ends: the run
        is then resumable from its first epoch, and its resume learns what fit() would have."""
        with self._guarded():
            self._stages()
        self._resumable_before_training()  # also where no stage ran

    def _stages(self) -> None:
        c = self.config
        if self.objectives.needs_teacher:
            teacher = self.teacher()
            self.teacher_history, self.teacher_lent_by = teacher.history, teacher.lent_by
            self.objectives.set_teacher(teacher)
        if c.pretrain.epochs and not self.pretrained:
            self.stage = "self-supervised pre-training epoch"
            pretrain(
                self.grid_model,
                c,
                self.stage_data(),
                self.settings,
                size=self.input_size(0),
                out=self.out if self.main else None,
                rows=self.pretraining,
                log=self.log,
            )
            self.pretrained, self.stage = True, "epoch"
            if self.main:  # resumable from here: an interruption keeps the pre-trained weights
                rundir.save_checkpoint(self.out / "checkpoint.pt", self.state(0))

    def _final_test(self) -> Result:
        """The final test evaluation, with the confusion matrix and every photo's probabilities (every rank
        evaluates its part), at --test-size when asked; then, on rank 0, the model file, plots and report
        (report.py)."""
        model = self.eval_model()
        if isinstance(model, torch.optim.swa_utils.AveragedModel):
            model = model.module
        assert isinstance(model, VisionTransformer)  # the run's ViT, or the EMA's copy of it
        model, preprocess = self._at_test_size(model)

        def scored(split, own_loader) -> dict:
            """A split evaluated with every photo's probabilities and each class's accuracy."""
            loader = own_loader if preprocess == self.preprocess else self.eval_loader(split, preprocess)
            result = evaluate(
                model,
                loader,
                self.settings,
                num_classes=len(self.classes),
                keep_probabilities=True,
                gather=self.ctx.gather,
            )
            result["per_class"] = per_class_accuracy(result["confusion"], self.classes)
            return result

        test = scored(self.data.test, self.test_loader)
        probabilities = test.pop("probabilities")
        # a validation source (--validate-on) is judged by the same final model, every photo's answer kept
        validation = scored(self.data.val, self.eval_loaders["val"]) if self.data.pool is not None else None
        if self.main:
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            write_results(
                self.out,
                config=self.config,
                data=self.data,
                model=model,
                trainable=trainable,
                train_size=self.model.config.image_size,
                preprocess=preprocess,
                test=test,
                probabilities=probabilities,
                history=self.history,
                teacher_history=self.teacher_history,
                teacher_lent_by=self.teacher_lent_by,
                validation=validation,
                device=self.device,
                trained_in=self.trained_in,
                chip=self.chip,
                processes=self.ctx.world_size,
                tensorboard=self.tensorboard,
            )
        self.ctx.barrier()  # the other ranks end when the run directory is complete
        return Result(self.out, self.history, test)

    def _at_test_size(self, model: VisionTransformer) -> tuple[VisionTransformer, Preprocess]:
        """The trained model and its preprocessing at --test-size (FixRes): a copy rebuilt for that
        resolution, position embeddings resampled (fixed sin-cos ones recomputed for the new grid)."""
        size = self.config.data.test_size
        if not size or size == model.config.image_size:
            return model, self.preprocess
        return resize_model(model, size).to(self.device).eval(), self.preprocess.at_size(size)

    @contextlib.contextmanager
    def _guarded(self):
        """The block's training on the run's own random state, deterministic where asked; a divergence, a lost
        process or a backend's failure said in one line with what is kept."""
        with (
            deterministic_algorithms(self.config.train.deterministic),
            own_random_state(self.device),
            warnings.catch_warnings(),
        ):
            # a share of one photo gives the class token a gradient that is a view (expand over a batch
            # of 1 is no copy): DDP copies it into its bucket and warns about performance, needlessly
            warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
            try:
                yield
            except TrainingDiverged as err:
                # every rank diverges at once (a collective check): keep this advice through torchrun's SIGTERM
                self.ctx.stopping()
                epoch = len(self.history if self.stage == "epoch" else self.pretraining) + 1
                raise TrainingDiverged(
                    f"{err} in {self.stage} {epoch}; training stopped and {self._kept()}. "
                    "Lower --lr, add --clip-grad 1.0 or --warmup-epochs, then start a new run."
                ) from None
            except PeerLost as err:
                raise PeerLost(f"{err}; {self._kept()}: {rundir.resume_command(self.out)}") from None
            except RuntimeError as err:
                if not self.ctx.distributed or isinstance(err, FoodVitError) or not is_backend_error(err):
                    raise
                raise PeerLost(
                    f"{self.ctx.peer_lost(err)}; {self._kept()}: {rundir.resume_command(self.out)}"
                ) from None
            finally:
                if self.tensorboard is not None:
                    self.tensorboard.close()

    def _kept(self) -> str:
        if self.history:
            return f"the last good checkpoint (epoch {len(self.history)}) is kept in {self.out / 'checkpoint.pt'}"
        if self.pretrained:
            return f"the pre-trained weights are kept in {self.out / 'checkpoint.pt'}"
        return "no epoch finished"
