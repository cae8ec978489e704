"""The CNN teacher that distillation and locality guidance read (objectives/distill.py,
objectives/guidance.py): a torchvision architecture trained first, from random initialisation, on
the run's own photos, augmentation and optimiser, then frozen. This module owns it: its training,
its fingerprint (the settings and the place it depends on), its lending, and its forward pass (Teacher),
which the objectives that read it hold. It trains for the run's epochs at the model's side,
or for epochs and at a side of its own (--teacher-epochs, --teacher-size: its batches resized as progressive
resizing resizes the ViT's); whatever its training side, the objectives that read it give it the ViT's batches as
they are, and its test accuracy is measured at the model's side.

The teacher is saved as teacher.pt in the run (a resumed run loads it instead of training it again)
and plays no part in prediction. A run may borrow the teacher another run trained (`foodvit cv
--teachers STUDY`): only when every setting the teacher depends on (teacher_settings) is the same
and it trained where the run trains (training_place), so the borrowed teacher is the one the run
would train.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from foodvit.data.sampling import single_photo_share
from foodvit.errors import ConfigError, RunError
from foodvit.model.build import default_preprocess
from foodvit.rundir.compare import differences
from foodvit.rundir.directory import TEACHER_FILE, TEACHER_PROGRESS, load_checkpoint, read_config, save_checkpoint
from foodvit.seeds import derive_seed
from foodvit.settings.objectives import STUDENT_SETTINGS
from foodvit.settings.run import TEACHERS, OptimConfig, RunConfig, reads_teacher
from foodvit.training.engine import Classifier, StepSettings, epoch_line, silent, trains_in_bf16
from foodvit.training.optim import within_stage
from foodvit.training.stages import Stage, StageData

if TYPE_CHECKING:
    from torchvision.models import ResNet

logger = logging.getLogger(__name__)

TEACHER_STRIDE = 32  # a ResNet's total stride: at this size or less its last feature map is 1 x 1
STAGES = ("layer1", "layer2", "layer3", "layer4")  # a torchvision ResNet's stages, in order
PROGRESS_FORMAT = (
    "foodvit-teacher-progress"  # teacher-progress.pt: a teacher's training after an epoch, before its last
)


def _nothing() -> None:
    pass


def build_teacher(name: str, num_classes: int) -> nn.Module:
    """A torchvision classifier with random weights (no download, nothing pre-trained), its weights channels-last:
    its convolutions, batch norms and pools then run on channels-last activations, faster on the CPU than on
    (B, C, H, W) rows (bench/speed/layouts.py, results/speed-layouts.csv; the same sums in another order)."""
    import torchvision

    if name not in TEACHERS:
        raise ConfigError(f"--teacher must be one of {', '.join(TEACHERS)}, got {name!r}")
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    return model.to(memory_format=torch.channels_last)


def stage_channels(module: nn.Module, stages: int) -> list[int]:
    """Output channels of the first `stages` stages of a torchvision ResNet (each one's last block's last conv)."""
    channels = []
    for name in STAGES[:stages]:
        last = getattr(module, name)[-1]
        channels.append((last.conv3 if hasattr(last, "conv3") else last.conv2).out_channels)
    return channels


def teacher_skeleton(name: str, num_classes: int) -> nn.Module:
    """The teacher's architecture, built without drawing from the random state: what a wrapper needs
    to know of it (its stages' widths) before the teacher is trained."""
    with torch.random.fork_rng(devices=[]):
        return build_teacher(name, num_classes)


def read_teacher(path: Path, architecture: str, lent: bool = False) -> dict | None:
    """A run's saved CNN teacher (of distillation or locality guidance), or None when it has none yet."""
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    if (
        not isinstance(state, dict)
        or state.get("format") != "foodvit-teacher"
        or state.get("architecture") != architecture
    ):
        advice = (
            f"a {architecture} CNN teacher; leave the teacher out"
            if lent
            else f"this run's {architecture} CNN teacher; remove it to train the teacher again"
        )
        raise RunError(f"{path} is not {advice}")
    return state


def trains_teacher(config: RunConfig) -> bool:
    """Whether a run trains a CNN teacher: an objective that reads it is on (settings/run.reads_teacher), on a backbone
    that trains."""
    return reads_teacher(config) and not config.train.freeze_backbone


def teacher_settings(config: RunConfig) -> dict:
    """Every setting a run's CNN teacher depends on, besides its photos and machine (trained_on): the
    preprocessing the run resolves (image size, normalisation), its architecture, the data, optimiser and training
    settings. Not among them: the ViT's architecture, the student's own settings (STUDENT_SETTINGS), and what never
    reaches the teacher's training (the ViT's progressive resizing: the teacher trains at its own side; no
    compiling; no test size; no validation source, which it is only scored on; the cache and the number of loader
    workers change only the time, except that with mixing on, a batch is mixed in the loader's worker when there
    is one)."""
    settings = config.to_dict()
    data = {
        k: v
        for k, v in settings["data"].items()
        if k not in ("source", "validate_on", "start_size", "start_share", "test_size", "cache", "cache_gb")
    }
    data["workers"] = min(config.data.workers, 1) if (config.data.mixup or config.data.cutmix) else 0
    optim = {k: v for k, v in settings["optim"].items() if f"optim.{k}" not in STUDENT_SETTINGS}
    train = {k: v for k, v in settings["train"].items() if k not in ("epochs", "eval_every", "tensorboard", "compile")}
    return {
        "preprocess": asdict(default_preprocess(config)),
        # its epochs and size as they resolve (the run's epochs when the teacher has none of its own), named as such
        "teacher": {
            "architecture": config.teacher.architecture,
            "epochs": teacher_epochs(config),
            "size": teacher_size(config),
        },
        "data": data,
        "optim": optim,
        "train": train,
    }


def teacher_epochs(config: RunConfig) -> int:
    """The epochs the run's CNN teacher trains for: --teacher-epochs, else the run's."""
    return config.teacher.epochs or config.train.epochs


def teacher_size(config: RunConfig) -> int:
    """The side the run's CNN teacher trains at: --teacher-size, else the model's image size."""
    return config.teacher.size or default_preprocess(config).image_size


def setting_changes(theirs: dict, ours: dict) -> str:
    """The settings that differ, 'key: A there, B here', the first three and how many more."""
    changed = differences(theirs, ours)
    shown = "; ".join(f"{key}: {a!r} there, {b!r} here" for key, a, b in changed[:3])
    return shown + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def teacher_changes(lender: RunConfig, config: RunConfig) -> str:
    """What would make `lender`'s CNN teacher another than `config`'s ('' when none): the teacher settings
    that differ."""
    return setting_changes(teacher_settings(lender), teacher_settings(config))


def borrowed_teacher(lender: Path, config: RunConfig) -> Path:
    """The teacher.pt of run `lender`, checked to be the teacher `config` would train itself (the same
    teacher_settings; the caller answers for the photos being the same, obtain_teacher checks the
    machine); else a one-line error that says what differs."""
    lender = Path(lender)
    if not trains_teacher(config):
        raise ConfigError(
            "a borrowed CNN teacher serves only --distill or --guidance (on a backbone that trains), and this run "
            "trains no teacher: leave the teacher out"
        )
    if not (lender / TEACHER_FILE).is_file() or not (lender / "config.json").is_file():
        raise RunError(
            f"{lender} holds no trained CNN teacher ({TEACHER_FILE} and config.json): give a distilled or guided "
            "run whose teacher has finished training, or leave the teacher out"
        )
    try:
        settings = read_config(lender / "config.json")
    except RunError as err:  # damaged: named in one line, as a run's own config.json is
        raise RunError(f"{err} (it lends its CNN teacher to this run; or leave the teacher out)") from None
    shown = teacher_changes(settings, config)
    if shown:
        raise RunError(
            f"{lender}'s CNN teacher was trained with other settings ({shown}); it is not the teacher this run "
            "would train: leave the teacher out"
        )
    return lender / TEACHER_FILE


def training_place(device: torch.device, processes: int, config: RunConfig) -> dict:
    """Where a teacher trains, besides its settings: the device kind, processes (each one's batch norm
    sees its share), the CPU's threads (they split the sums of a matrix product, so 1 and 2 threads
    round differently and train two different teachers from one seed), its memory layout (build_teacher's
    channels-last: another order of the same sums), bf16 autocast (engine.trains_in_bf16: CUDA, or a CPU with native
    bf16), deterministic kernels (CUDA only) and the PyTorch version."""
    cuda = device.type == "cuda"
    return {
        "device": device.type,
        "processes": processes,
        "threads": torch.get_num_threads() if device.type == "cpu" else 0,
        "layout": "channels-last",
        "bf16": trains_in_bf16(device, config.train.amp),
        "deterministic": bool(cuda and config.train.deterministic),
        "torch": str(torch.__version__),
    }


def place_changes(theirs: dict | None, ours: dict) -> str:
    """How a teacher's recorded place differs from where a run trains ('' when it does not); a teacher file that
    records only some of it is told so."""
    missing = [key for key in ours if key not in (theirs or {})]
    if missing:
        return f"its file records no {', '.join(missing)}"
    return setting_changes(theirs or {}, ours) if theirs != ours else ""


@dataclass
class TeacherSetup:
    """What a run's CNN teacher is made of, besides its photos (StageData): its architecture and
    classes, its epochs, optimiser settings and step settings (the teacher trains at its side, resizing its batches
    when that is not the model's, and without sharpness-aware minimisation), its side and batch size (checked
    before it trains), the photos it is evaluated on after its last epoch (the test split, and a validation split
    when the run has one), where it trains (training_place), and
    whether its side is its own (--teacher-size) rather than the model's."""

    architecture: str
    num_classes: int
    epochs: int
    optim: OptimConfig
    settings: StepSettings
    image_size: int
    batch_size: int
    eval_loaders: dict[str, Any]
    place: dict
    own_size: bool = False

    @classmethod
    def of_run(
        cls,
        config: RunConfig,
        num_classes: int,
        settings: StepSettings,
        image_size: int,
        eval_loaders: dict[str, Any],
        processes: int,
    ) -> TeacherSetup:
        size = config.teacher.size or image_size  # its batches are loaded at image_size
        epochs = teacher_epochs(config)
        optim = within_stage(config.optim, epochs) if config.teacher.epochs else config.optim  # a schedule of its own
        return cls(
            config.teacher.architecture,
            num_classes,
            epochs,
            optim,
            replace(settings, input_size=0 if size == image_size else size, sam=0.0),
            size,
            config.train.batch_size,
            eval_loaders,
            training_place(settings.device, processes, config),
            own_size=bool(config.teacher.size),
        )


@dataclass(eq=False)
class Teacher:
    """A run's CNN teacher, frozen (its batch-norm statistics stay as trained): the trained network, its epochs'
    rows, the run that lent it (if one did), and its forward pass, which the objectives that read it call on
    the batch as loaded, without gradients. Not an nn.Module: an objective that holds it does not make it a
    submodule, so its weights never join the student's parameters, optimiser, DistributedDataParallel or
    checkpoint (teacher.pt keeps them)."""

    module: nn.Module
    history: list[dict] = field(default_factory=list)
    lent_by: str | None = None

    def __post_init__(self) -> None:
        self.module.eval().requires_grad_(False)

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> its logits (B, classes)."""
        return self.module(images)

    @torch.no_grad()
    def feature_maps(self, images: torch.Tensor, stages: int) -> list[torch.Tensor]:
        """(B, C, H, W) -> the feature maps after each of its first `stages` stages, (B, C_k, H_k, W_k) (a
        torchvision ResNet's); the later stages are not run."""
        t = cast("ResNet", self.module)
        x = t.maxpool(t.relu(t.bn1(t.conv1(images))))
        maps = []
        for name in STAGES[:stages]:
            x = getattr(t, name)(x)
            maps.append(x)
        return maps


def lent_teacher(path: Path, setup: TeacherSetup) -> dict:
    """The teacher lent to the run, trained where this run trains (else it would differ)."""
    saved = read_teacher(path, setup.architecture, lent=True)
    if saved is None:
        raise RunError(
            f"the CNN teacher lent to this run, {path}, has gone: leave the teacher out, or give a run that has one"
        )
    where = place_changes(saved.get("trained_on"), setup.place)
    if where:
        raise RunError(
            f"the CNN teacher {path} was trained elsewhere ({where}); it would not be the teacher this run trains: "
            "leave the teacher out"
        )
    return saved


def check_teacher_batches(setup: TeacherSetup, data: StageData) -> None:
    """Before a teacher trains: a ConfigError where its last batch norm would see a 1 x 1 map (at
    TEACHER_STRIDE px or less) and some step gives a process a single photo, one value per channel,
    which batch norm cannot train on; it names the nearest batch size that would do."""
    size, world, batch = setup.image_size, data.context.world_size, setup.batch_size
    n = len(data.loader.batch_sampler.sampler)
    if size > TEACHER_STRIDE or not single_photo_share(n, batch, world):
        return
    nearest = next(
        (b for d in range(1, n) for b in (batch - d, batch + d) if 2 <= b <= n and not single_photo_share(n, b, world)),
        None,
    )
    where = f" on {world} processes" if world > 1 else ""
    side = "a --teacher-size" if setup.own_size else "an --image-size"
    instead = f"give --batch-size {nearest}, or" if nearest else "give"
    raise ConfigError(
        f"the {setup.architecture} teacher cannot train on a single photo at {size} px (its last batch norm would "
        f"see one value per channel), and {n} photos an epoch in batches of {batch}{where} give a process one photo "
        f"in a step: {instead} {side} above {TEACHER_STRIDE}"
    )


def obtain_teacher(
    setup: TeacherSetup,
    data: StageData,
    folder: Path,
    *,
    lent: Path | None = None,
    log: Callable = silent,
    resumable: Callable[[], None] = _nothing,
) -> Teacher:
    """The CNN teacher of a run whose folder is `folder`: its teacher.pt when it has one (a resumed run), else the one
    `lent` to it (checked by borrowed_teacher), else a CNN trained now from random initialisation on the stage's photos,
    from where an interrupted training stopped (teacher-progress.pt, written after each epoch) if it did. A teacher
    trained or lent is saved in the folder; `resumable` is called (on every process) whenever the folder holds what a
    resumed run needs of the teacher, so that the caller can make the run resumable from there."""
    ctx, path = data.context, folder / TEACHER_FILE
    torch.manual_seed(derive_seed(data.seed, "teacher-init"))
    module = build_teacher(setup.architecture, setup.num_classes).to(ctx.device)
    saved = ctx.broadcast(ctx.on_main(read_teacher, path, setup.architecture))
    origin = f"{path} ({setup.architecture}, trained earlier in this run)"
    if saved is None and lent is not None:
        saved = {**ctx.broadcast(ctx.on_main(lent_teacher, lent, setup)), "lent_by": str(lent.parent)}
        origin = f"{lent} ({setup.architecture}, lent by another run with the same settings)"
        ctx.on_main(keep_teacher, folder, saved)
        resumable()
    if saved is None:
        saved = train_teacher(module, setup, data, folder, log, resumable)
    else:
        module.load_state_dict(saved["model"])
        if not data.quiet:
            logger.info("CNN teacher: %s", origin)
    # lent_by kept in teacher.pt: a resumed run says so
    return Teacher(module, list(saved["history"]), saved.get("lent_by"))


def train_teacher(
    module: nn.Module, setup: TeacherSetup, data: StageData, folder: Path, log: Callable, resumable: Callable[[], None]
) -> dict:
    """`module` trained for the teacher's epochs, each epoch's state kept in teacher-progress.pt (and the
    training continued from it when it holds some), then saved as teacher.pt; returns what teacher.pt holds."""
    check_teacher_batches(setup, data)
    ctx, progress_file = data.context, folder / TEACHER_PROGRESS
    stage = Stage(Classifier(module), data, epochs=setup.epochs, purpose="teacher-step", optim=setup.optim)
    progress = ctx.broadcast(ctx.on_main(read_progress, progress_file, setup.architecture))
    history = list(progress["history"]) if progress else []
    if progress:
        module.load_state_dict(progress["model"])
        stage.restore(progress["stage"])
        if not data.quiet:
            logger.info(
                "continuing the CNN teacher's training (%s) after epoch %d of %d",
                setup.architecture,
                len(history),
                setup.epochs,
            )
    elif not data.quiet:
        logger.info(
            "training the CNN teacher (%s, random initialisation) for %d epochs", setup.architecture, setup.epochs
        )

    def after_epoch(epoch: int, row: dict) -> None:
        history.append(row)
        if epoch + 1 < setup.epochs:  # the last epoch's state goes to teacher.pt
            state = {
                "format": PROGRESS_FORMAT,
                "architecture": setup.architecture,
                "model": module.state_dict(),
                "stage": stage.state(),
                "history": history,
                "trained_on": setup.place,
            }
            ctx.on_main(save_checkpoint, progress_file, state)
            resumable()
        log("teacher " + epoch_line(row, setup.epochs))

    stage.fit(
        setup.settings,
        start_epoch=len(history),
        after_epoch=[after_epoch],
        eval_loaders=setup.eval_loaders,
        eval_model=module,
        eval_every=setup.epochs,
        num_classes=setup.num_classes,
    )
    saved = {
        "format": "foodvit-teacher",
        "architecture": setup.architecture,
        "model": module.state_dict(),
        "history": history,
        "trained_on": setup.place,
    }
    ctx.on_main(keep_teacher, folder, saved)
    resumable()
    return saved


def read_progress(path: Path, architecture: str) -> dict | None:
    """An interrupted teacher training's last epoch (teacher-progress.pt), or None."""
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    if (
        not isinstance(state, dict)
        or state.get("format") != PROGRESS_FORMAT
        or state.get("architecture") != architecture
    ):
        raise RunError(
            f"{path} is not this run's {architecture} CNN teacher in training; remove it to train the teacher again"
        )
    return state


def keep_teacher(folder: Path, saved: dict) -> None:
    """The finished teacher saved in the run, its training's progress file removed."""
    save_checkpoint(folder / TEACHER_FILE, saved)
    (folder / TEACHER_PROGRESS).unlink(missing_ok=True)
