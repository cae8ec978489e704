"""Experiment tracking: TensorBoard event files read back with TensorBoard's own reader, and
`foodvit compare` for runs side by side."""

import csv
import json

import pytest
from helpers import make_photo_folder, report_figures

from foodvit.cli.main import main

pytest.importorskip("tensorboard", reason="the TensorBoard test needs the track extra: pip install -e '.[track]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from foodvit.training.tracking import EPOCH_SCALARS  # noqa: E402

ARGS = ["--recipe", "tiny", "--image-size", "32", "--depth", "1", "--batch-size", "8", "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    photos = make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=6, n_test=3)
    root = tmp_path_factory.mktemp("runs")
    with report_figures():  # TensorBoard's images tab holds them
        assert (
            main(
                [
                    "train",
                    *ARGS,
                    "--data",
                    str(photos),
                    "--epochs",
                    "3",
                    "--tensorboard",
                    "--val-fraction",
                    "0.2",
                    "--out",
                    str(root / "tracked"),
                ]
            )
            == 0
        )
    assert (
        main(["train", *ARGS, "--data", str(photos), "--epochs", "2", "--lr", "0.0003", "--out", str(root / "plain")])
        == 0
    )
    return root


def _events(run):
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def test_every_epoch_scalar_is_in_the_event_files_with_the_metrics_csv_values(runs):
    run = runs / "tracked"
    events = _events(run)
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    steps_per_epoch = 2  # 15 training photos (3 held out for validation) in batches of 8
    for key, tag in EPOCH_SCALARS.items():
        values = events.Scalars(tag)
        assert [v.step for v in values] == [steps_per_epoch * e for e in (1, 2, 3)], tag
        if key not in ("images_per_s", "model_share"):  # timings; metrics.csv rounds to 6 digits
            assert [round(v.value, 4) for v in values] == [round(float(r[key]), 4) for r in rows], tag
    step_losses = events.Scalars("train/step_loss")
    assert [v.step for v in step_losses] == list(range(1, 3 * steps_per_epoch + 1))
    assert (
        len(events.Scalars("train/grad_norm")) == 3 * steps_per_epoch
        and len(events.Scalars("train/lr")) == 3 * steps_per_epoch
    )
    assert set(events.Tags()["images"]) == {"curves", "confusion", "most_wrong", "predictions"}
    # the hparams plugin: the settings with the final metrics, for TensorBoard's HPARAMS tab
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(1e-3)
    assert start.hparams["data.augment"].string_value == "flip"
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"hparam/test_acc", "hparam/test_loss"}
    final = events.Scalars("hparam/test_acc")[-1].value
    assert final == pytest.approx(json.loads((run / "model.json").read_text())["metrics"]["test_acc"], abs=1e-6)


def test_compare_shows_the_differing_settings_and_the_final_metrics(runs, capsys):
    assert main(["compare", str(runs / "tracked"), str(runs / "plain")]) == 0
    out = capsys.readouterr().out
    lines = {
        line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip() and not line.startswith("-")
    }
    assert lines["optim.lr"] == ["0.001", "0.0003"]
    assert lines["train.epochs"] == ["3", "2"]
    assert lines["train.tensorboard"] == ["True", "False"]
    assert "data.augment" not in lines  # the same in both: not shown
    assert lines["epochs"] == ["3", "2"]
    assert float(lines["test"][1]) >= 0  # "test loss" / "test acc" rows are there
    assert "test acc" in out


def test_compare_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert "holds no foodvit run" in capsys.readouterr().err
