"""Distillation from a convolutional teacher trained on the same photos (Touvron et al. 2021, "Training
data-efficient image transformers & distillation through attention" (DeiT), section 5: hard-label
distillation).

A CNN's locality and translation equivariance are what a ViT lacks on small data; a CNN trained
from scratch on the same few hundred photos classifies better than the ViT does. With --distill W,
the run first trains the teacher (a torchvision architecture, random initialisation, the run's own
photos, augmentation, optimiser and schedule), then the ViT with

    loss = CE(student(x), y) + W x CE(student(x), argmax teacher(x))

on every augmented batch x: the teacher labels the crop the student sees, which is what it adds
over the true label (DeiT's hard distillation; W = 1 is DeiT's equal weighting of the two terms,
doubled). The teacher is saved as teacher.pt in the run (a resumed run loads it instead of training
it again) and plays no part in prediction: the saved model is the ViT alone. A run may borrow the
teacher another run trained (`foodvit cv --teachers STUDY`): only when every setting the teacher
depends on (teacher_settings) is the same, so the borrowed teacher is the one the run would train.

By default the teacher's labels train the ViT's own head. With --distill-token (DeiT's distillation
token, model/vit.py deviation 9) they train the token's own head instead:

    loss = CE(head(x), y) + W x CE(head_dist(x), argmax teacher(x))

and the model predicts with the mean of the two heads' logits.

With --distill-temperature T > 0 the term is soft distillation instead (Hinton et al. 2015; DeiT's
soft variant, T = 3): the student matches the teacher's class probabilities softened at T,

    loss = CE(student(x), y) + W x T^2 x KL(softmax(teacher(x) / T) || softmax(student(x) / T))

which passes on how sure the teacher is and which classes it confuses, not only its choice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.config import TEACHERS, RunConfig
from foodvit.data.sampling import single_photo_share
from foodvit.errors import ConfigError, RunError
from foodvit.model.build import default_preprocess
from foodvit.rundir.compare import differences
from foodvit.rundir.directory import TEACHER_FILE, load_checkpoint, save_checkpoint
from foodvit.seeds import derive_seed
from foodvit.training.heads import HeadsAndLoss, TaughtLoss, loss_so_far
from foodvit.training.engine import epoch_line
from foodvit.training.stages import fit_stage


TEACHER_STRIDE = 32  # a ResNet's total stride: at this size or less its last feature map is 1 x 1


def build_teacher(name: str, num_classes: int) -> nn.Module:
    """A torchvision classifier with random weights (no download, nothing pre-trained)."""
    import torchvision

    if name not in TEACHERS:
        raise ConfigError(f"--teacher must be one of {', '.join(TEACHERS)}, got {name!r}")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def teacher_skeleton(name: str, num_classes: int) -> nn.Module:
    """The teacher's architecture, built without drawing from the random state: what a wrapper needs
    to know of it (its stages' widths) before the teacher is trained."""
    with torch.random.fork_rng(devices=[]):
        return build_teacher(name, num_classes)


class WithDistillation(TaughtLoss):
    """A student trained on a frozen teacher's classes besides the true ones: the term is weight x
    the cross-entropy of the distillation token's logits (without the token: the logits') against
    the teacher's predicted classes, or, at a temperature T > 0, against its probabilities softened
    at T: T^2 x KL(softmax(teacher / T) || softmax(student / T)) (Hinton et al. 2015; the T^2 keeps
    the term's gradients the size of the hard term's as T grows). The student is a VisionTransformer
    or one wrapped for training."""

    def __init__(self, student: nn.Module, weight: float, teacher: nn.Module | None = None, temperature: float = 0.0) -> None:
        super().__init__(student, weight, teacher)
        self.temperature = temperature

    def forward_heads(self, images: torch.Tensor) -> HeadsAndLoss:
        teacher = self.trained_teacher()
        heads = self.student.forward_heads(images)
        with torch.no_grad():
            taught = teacher(images).float()  # an empty share gives an empty (0, classes) tensor
        student = (heads.logits if heads.distilled is None else heads.distilled).float()  # the token's own head, if any
        # the mean over the batch, as a sum over its count: an empty share (distributed) gives 0
        if self.temperature > 0:
            t = self.temperature
            distill = t * t * F.kl_div(F.log_softmax(student / t, dim=1), F.log_softmax(taught / t, dim=1),
                                       reduction="sum", log_target=True)
        else:
            distill = F.cross_entropy(student, taught.argmax(dim=1), reduction="sum")
        distill = distill / max(1, images.shape[0])
        return HeadsAndLoss(heads.logits, heads.distilled, self.weight * distill + loss_so_far(heads))


def read_teacher(path: Path, architecture: str, lent: bool = False) -> dict | None:
    """A run's saved CNN teacher (of distillation or locality guidance), or None when it has none yet."""
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    if state.get("format") != "foodvit-teacher" or state.get("architecture") != architecture:
        advice = (f"a {architecture} CNN teacher; leave the teacher out" if lent
                  else f"this run's {architecture} CNN teacher; remove it to train the teacher again")
        raise RunError(f"{path} is not {advice}")
    return state


# The optimiser settings that shape the ViT's training alone, never the CNN teacher's: its auxiliary losses, its
# self-supervised pre-training, the average of its weights and sharpness-aware minimisation (its remedy for sharp minima).
STUDENT_SETTINGS = ("drloc", "drloc_pairs", "distill", "distill_temperature", "guidance", "guidance_schedule", "guidance_stages", "masked", "mask_ratio", "mask_pixels", "contrast", "contrast_temperature", "pretrain_epochs", "pretrain_mask_ratio", "ema", "sam")


def trains_teacher(config: RunConfig) -> bool:
    """Whether a run trains a CNN teacher: distillation or guidance on, on a backbone that trains (auxiliary.wrap)."""
    return (config.optim.distill > 0 or config.optim.guidance > 0) and not config.train.freeze_backbone


def teacher_settings(config: RunConfig) -> dict:
    """Every setting a run's CNN teacher depends on, besides its photos and machine (trained_on): the
    preprocessing the run resolves (image size, normalisation), the data, optimiser and training settings.
    Not among them: the ViT's architecture, the student's own settings (STUDENT_SETTINGS), and what never
    reaches the teacher's training (it trains at full size: no progressive resizing; no compiling; no
    test size; the cache and the number of loader workers change only the time, except that with
    mixing on, a batch is mixed in the loader's worker when there is one)."""
    settings = config.to_dict()
    data = {k: v for k, v in settings["data"].items() if k not in ("source", "start_size", "start_share", "test_size", "cache", "cache_gb")}
    data["workers"] = min(config.data.workers, 1) if (config.data.mixup or config.data.cutmix) else 0
    return {"preprocess": asdict(default_preprocess(config)), "data": data,
            "optim": {k: v for k, v in settings["optim"].items() if k not in STUDENT_SETTINGS},
            "train": {k: v for k, v in settings["train"].items() if k not in ("eval_every", "tensorboard", "compile")}}


def setting_changes(theirs: dict, ours: dict) -> str:
    """The settings that differ, 'key: A there, B here', the first three and how many more."""
    changed = differences(theirs, ours)
    shown = "; ".join(f"{key}: {a!r} there, {b!r} here" for key, a, b in changed[:3])
    return shown + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def teacher_changes(lender: RunConfig, config: RunConfig) -> str:
    """What would make `lender`'s CNN teacher another than `config`'s ('' when none): the teacher settings that differ."""
    return setting_changes(teacher_settings(lender), teacher_settings(config))


def borrowed_teacher(lender: Path, config: RunConfig) -> Path:
    """The teacher.pt of run `lender`, checked to be the teacher `config` would train itself (the same
    teacher_settings; the caller answers for the photos being the same, train_or_load_teacher checks the
    machine); else a one-line error that says what differs."""
    lender = Path(lender)
    if not trains_teacher(config):
        raise ConfigError("a borrowed CNN teacher serves only --distill or --guidance (on a backbone that trains), and this run "
                          "trains no teacher: leave the teacher out")
    if not (lender / TEACHER_FILE).is_file() or not (lender / "config.json").is_file():
        raise RunError(f"{lender} holds no trained CNN teacher ({TEACHER_FILE} and config.json): give a distilled or guided "
                       "run whose teacher has finished training, or leave the teacher out")
    shown = teacher_changes(RunConfig.from_dict(json.loads((lender / "config.json").read_text()), where=str(lender / "config.json")),
                            config)
    if shown:
        raise RunError(f"{lender}'s CNN teacher was trained with other settings ({shown}); it is not the teacher this run "
                       "would train: leave the teacher out")
    return lender / TEACHER_FILE


def training_place(device: torch.device, processes: int, config: RunConfig) -> dict:
    """Where a teacher trains, besides its settings: the device kind, processes (each one's batch norm
    sees its share), the CPU's threads (they split the sums of a matrix product, so 1 and 2 threads
    round differently and train two different teachers from one seed), bf16 and deterministic kernels
    (CUDA only) and the PyTorch version."""
    cuda = device.type == "cuda"
    return {"device": device.type, "processes": processes, "threads": torch.get_num_threads() if device.type == "cpu" else 0,
            "bf16": bool(cuda and config.train.amp), "deterministic": bool(cuda and config.train.deterministic),
            "torch": str(torch.__version__)}


def trained_on(trainer) -> dict:
    """Where this run's teacher trains (training_place)."""
    return training_place(trainer.device, trainer.ctx.world_size, trainer.config)


def place_changes(theirs: dict | None, ours: dict) -> str:
    """How a teacher's recorded place differs from where a run trains ('' when it does not); a teacher
    written before foodvit recorded some of it is told so."""
    missing = [key for key in ours if key not in (theirs or {})]
    if missing:
        return f"it was written by a foodvit that did not record its {', '.join(missing)}"
    return setting_changes(theirs, ours) if theirs != ours else ""


def lent_teacher(trainer) -> dict:
    """The teacher lent to the run (trainer.teacher_file), trained where this run trains (else it would differ)."""
    c, path = trainer.config, trainer.teacher_file
    saved = read_teacher(path, c.optim.teacher, lent=True)
    if saved is None:
        raise RunError(f"the CNN teacher lent to this run, {path}, has gone: leave the teacher out, or give a run that has one")
    where = place_changes(saved.get("trained_on"), trained_on(trainer))
    if where:
        raise RunError(f"the CNN teacher {path} was trained elsewhere ({where}); it would not be the teacher this run trains: "
                       "leave the teacher out")
    return saved


def check_teacher_batches(trainer) -> None:
    """Before a teacher trains: a ConfigError where its last batch norm would see a 1 x 1 map (at
    TEACHER_STRIDE px or less) and some step gives a process a single photo, one value per channel,
    which batch norm cannot train on; it names the nearest batch size that would do."""
    c, size, world = trainer.config, trainer.preprocess.image_size, trainer.ctx.world_size
    n, batch = len(trainer.train_loader.batch_sampler.sampler), c.train.batch_size
    if size > TEACHER_STRIDE or not single_photo_share(n, batch, world):
        return
    nearest = next((b for d in range(1, n) for b in (batch - d, batch + d) if 2 <= b <= n and not single_photo_share(n, b, world)), None)
    where = f" on {world} processes" if world > 1 else ""
    instead = f"give --batch-size {nearest}, or" if nearest else "give"
    raise ConfigError(f"the {c.optim.teacher} teacher cannot train on a single photo at {size} px (its last batch norm would see "
                      f"one value per channel), and {n} photos an epoch in batches of {batch}{where} give a process one photo "
                      f"in a step: {instead} an --image-size above {TEACHER_STRIDE}")


def train_or_load_teacher(trainer) -> torch.nn.Module:
    """The CNN teacher of distillation and locality guidance: the run's teacher.pt when it has one (a resumed run), else
    the one lent to the run (trainer.teacher_file, checked by borrowed_teacher), else a CNN trained now from random
    initialisation on the run's training photos, with its augmentation, optimiser settings, schedule and epochs; a
    teacher trained or lent is saved in the run."""
    c = trainer.config
    path = trainer.out / TEACHER_FILE
    torch.manual_seed(derive_seed(c.train.seed, "teacher-init"))
    # channels-last: its convolutions, batch norms and pools run faster on it (the same sums, another order)
    teacher = build_teacher(c.optim.teacher, len(trainer.classes)).to(trainer.device, memory_format=torch.channels_last)
    saved = trainer.ctx.broadcast(trainer.ctx.on_main(read_teacher, path, c.optim.teacher))
    origin = f"{path} ({c.optim.teacher}, trained earlier in this run)"
    if saved is None and trainer.teacher_file is not None:
        saved = {**trainer.ctx.broadcast(trainer.ctx.on_main(lent_teacher, trainer)), "lent_by": str(trainer.teacher_file.parent)}
        origin = f"{trainer.teacher_file} ({c.optim.teacher}, lent by another run with the same settings)"
        if trainer.main:
            keep_teacher(trainer, saved)
    if saved is None:
        check_teacher_batches(trainer)
        trainer.log(f"training the CNN teacher ({c.optim.teacher}, random initialisation) for {c.train.epochs} epochs")
        history = fit_stage(trainer, teacher, epochs=c.train.epochs, purpose="teacher-step", optim=c.optim,
                            settings=replace(trainer.settings, input_size=0, sam=0.0),
                            after_epoch=[lambda _, row: trainer.log("teacher " + epoch_line(row, c.train.epochs))],
                            eval_loaders={"test": trainer.eval_loaders["test"]}, eval_every=c.train.epochs, num_classes=len(trainer.classes))
        saved = {"format": "foodvit-teacher", "architecture": c.optim.teacher, "model": teacher.state_dict(), "history": history,
                 "trained_on": trained_on(trainer)}
        if trainer.main:
            keep_teacher(trainer, saved)
    else:
        teacher.load_state_dict(saved["model"])
        trainer.log(f"CNN teacher: {origin}")
    trainer.teacher_history = list(saved["history"])
    trainer.teacher_lent_by = saved.get("lent_by")  # kept in the run's teacher.pt: a resumed run still says so
    return teacher


def keep_teacher(trainer, saved: dict) -> None:
    """The teacher saved in the run; a run that has not trained its ViT yet is resumable from here,
    so an interruption keeps the teacher."""
    save_checkpoint(trainer.out / TEACHER_FILE, saved)
    if not trainer.history:
        save_checkpoint(trainer.out / "checkpoint.pt", trainer.state(0))
