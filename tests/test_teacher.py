"""The CNN teacher's own module (training/teacher.py): an interrupted teacher stage keeps its epochs,
and the run resumes from them to the end an uninterrupted run reaches."""

import csv

import pytest
import torch
from helpers import make_photo_folder

from foodvit.cli.main import main
from foodvit.rundir.directory import TEACHER_FILE, TEACHER_PROGRESS, load_checkpoint

TIME_COLUMNS = ("seconds", "images_per_s", "model_share")


def rows(run):
    with (run / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)]


@pytest.mark.slow  # three trainings through the CLI of two epochs, a teacher each
def test_a_run_stopped_in_its_teacher_stage_resumes_to_the_uninterrupted_end(tmp_path, monkeypatch, capsys):
    import foodvit.training.teacher as T

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    args = [
        "train",
        "--data",
        str(photos),
        "--recipe",
        "tiny",
        "--epochs",
        "2",
        "--image-size",
        "32",
        "--depth",
        "2",
        "--batch-size",
        "8",
        "--guidance",
        "1",
        "--seed",
        "0",
        "--quiet",
    ]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    real = T.epoch_line

    def stop_after_the_first_teacher_epoch(row, epochs):
        if row["epoch"] == 1:
            raise KeyboardInterrupt  # as a ctrl-C (or a kill) while the teacher trains
        return real(row, epochs)

    monkeypatch.setattr(T, "epoch_line", stop_after_the_first_teacher_epoch)
    stopped = tmp_path / "stopped"
    assert main([*args, "--out", str(stopped)]) != 0
    assert (stopped / TEACHER_PROGRESS).is_file() and not (stopped / TEACHER_FILE).exists()
    assert len(load_checkpoint(stopped / TEACHER_PROGRESS)["history"]) == 1
    monkeypatch.setattr(T, "epoch_line", real)
    capsys.readouterr()
    assert main(["train", "--resume", str(stopped), "--quiet"]) == 0
    assert not (stopped / TEACHER_PROGRESS).exists()
    teacher, uninterrupted = load_checkpoint(stopped / TEACHER_FILE), load_checkpoint(tmp_path / "whole" / TEACHER_FILE)
    assert [r["train_loss"] for r in teacher["history"]] == pytest.approx(
        [r["train_loss"] for r in uninterrupted["history"]], rel=1e-6
    )
    for key, value in uninterrupted["model"].items():
        torch.testing.assert_close(teacher["model"][key], value, rtol=0, atol=0)
    assert rows(stopped) == rows(tmp_path / "whole")


def test_a_teacher_with_its_own_epochs_and_side(tmp_path):
    """--teacher-epochs and --teacher-size: the teacher trains that many epochs on batches of that side, while
    the ViT keeps its own; a teacher is the same one whatever the ViT's epochs, and another at another side."""
    from dataclasses import replace

    from foodvit.settings.run import RunConfig
    from foodvit.training.engine import StepSettings
    from foodvit.training.teacher import TeacherSetup, teacher_changes

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    run = tmp_path / "run"
    args = ["train", "--data", str(photos), "--recipe", "tiny", "--epochs", "3", "--image-size", "48"]
    args += ["--depth", "2", "--batch-size", "8", "--guidance", "1", "--quiet", "--out", str(run)]
    assert main([*args, "--teacher-epochs", "2", "--teacher-size", "32"]) == 0
    assert len(load_checkpoint(run / TEACHER_FILE)["history"]) == 2
    assert len(rows(run)) == 3

    config = RunConfig.from_dict({"optim": {"guidance": 1.0, "teacher_epochs": 2, "teacher_size": 32}})
    setup = TeacherSetup.of_run(config, 3, StepSettings(device=torch.device("cpu")), 48, None, 1)
    assert (setup.epochs, setup.image_size, setup.settings.input_size) == (2, 32, 32)
    whole = TeacherSetup.of_run(
        replace(config, teacher=replace(config.teacher, size=0)),
        3,
        StepSettings(device=torch.device("cpu")),
        48,
        None,
        1,
    )
    assert (whole.image_size, whole.settings.input_size) == (48, 0)
    longer = replace(config, train=replace(config.train, epochs=config.train.epochs + 50))
    assert teacher_changes(config, longer) == ""
    assert "epochs" in teacher_changes(config, replace(config, teacher=replace(config.teacher, epochs=0)))
    assert "size" in teacher_changes(config, replace(config, teacher=replace(config.teacher, size=40)))


def test_a_teacher_with_few_epochs_of_its_own_warms_up_for_half_of_them_at_most():
    from foodvit.settings.run import RunConfig
    from foodvit.training.engine import StepSettings
    from foodvit.training.teacher import TeacherSetup

    def warmup(teacher_epochs: int, run_epochs: int = 3) -> float:
        settings = {"guidance": 1.0, "warmup_epochs": 5, "teacher_epochs": teacher_epochs}
        config = RunConfig.from_dict({"optim": settings, "train": {"epochs": run_epochs}})
        return TeacherSetup.of_run(config, 3, StepSettings(), 32, None, 1).optim.warmup_epochs

    assert warmup(4) == 2  # else it would still be warming up at its last epoch, its rate never decaying
    assert warmup(50) == 5
    assert warmup(0) == 5  # the run's epochs, the run's schedule: as the ViT's own


@pytest.mark.parametrize("native", [True, False])
def test_a_teachers_place_records_whether_it_trained_under_bf16(monkeypatch, native):
    # a teacher trained under bf16 autocast is another teacher than one trained in float32 from the same seed: its
    # place says which, so that a run on the other arithmetic never borrows it (--amp false, or a CPU without bf16)
    from dataclasses import replace

    from foodvit.recipes import load_recipe
    from foodvit.training import engine
    from foodvit.training.teacher import place_changes, training_place

    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: native)
    config = load_recipe("default")
    cpu = torch.device("cpu")
    on, off = (training_place(cpu, 1, replace(config, train=replace(config.train, amp=amp))) for amp in (True, False))
    assert on["bf16"] is native and off["bf16"] is False
    assert training_place(torch.device("cuda"), 1, config)["bf16"] is True
    assert (place_changes(on, off) == "") is not native
    if native:
        assert "bf16: True there, False here" in place_changes(on, off)


@pytest.mark.parametrize("damage", ["{x", "[]", '{"train": {"epochs": 1.5}}'])
def test_a_lenders_damaged_config_is_one_line_naming_it(tmp_path, damage):
    # a lender's unreadable config.json once failed with a JSON traceback in the borrowing study's first fold
    from foodvit.errors import RunError
    from foodvit.recipes import load_recipe
    from foodvit.training.teacher import borrowed_teacher

    lender = tmp_path / "lender"
    lender.mkdir()
    (lender / "teacher.pt").write_bytes(b"a teacher")
    (lender / "config.json").write_text(damage)
    with pytest.raises(RunError) as refused:
        borrowed_teacher(lender, load_recipe("default"))
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and str(lender / "config.json") in message
    assert message.endswith("(it lends its CNN teacher to this run; or leave the teacher out)")
