"""A tune study's folder stays true to its database: every trial folder is bound to the settings its
folds trained with, checked on reuse; a study whose database is gone, foreign, truncated or random
bytes is refused in one line; a trial cut short by --budget is resumed by the next `foodvit tune`,
never failed for good. Through the command line, on the tiny recipe with tiny generated photos."""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from helpers import make_photo_folder

optuna = pytest.importorskip("optuna")

from foodvit.cli.main import main  # noqa: E402
from foodvit.tuning import cv  # noqa: E402

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


@pytest.fixture(scope="module")
def space(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("space") / "space.toml"
    path.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    return path


def tune(photos, out, space, *extra) -> list[str]:
    return ["tune", "--data", str(photos), "--out", str(out), "--folds", "2", "--space", str(space), *TINY, *extra]


@pytest.fixture(scope="module")
def one_trial(tmp_path_factory, photos, space) -> Path:
    """A study of one finished trial (the starting recipe), copied by each test that damages it."""
    study = tmp_path_factory.mktemp("tuned") / "study"
    assert main(tune(photos, study, space, "--trials", "1")) == 0
    assert (study / "trial-0000" / "fold-1.json").is_file()
    return study


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"foodvit {command}: error: ") and "Traceback" not in err, err
    return err


def damage_copy(one_trial: Path, tmp_path: Path, how: str) -> Path:
    study = tmp_path / "study"
    shutil.copytree(one_trial, study)
    db = study / "study.db"
    if how == "deleted":
        db.unlink()
    elif how == "foreign":
        db.unlink()
        with sqlite3.connect(db) as connection:
            connection.execute("create table photos (name text)")
    elif how == "truncated":
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    elif how == "random":
        db.write_bytes(bytes(range(256)) * 64)
    elif how == "empty":
        db.write_bytes(b"")
    return study


@pytest.mark.parametrize("how", ["deleted", "foreign", "truncated", "random", "empty"])
def test_a_study_whose_database_is_gone_or_damaged_is_refused_in_one_line(
    one_trial, photos, space, tmp_path, capsys, how
):
    study = damage_copy(one_trial, tmp_path, how)
    before = {p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and not p.name.startswith(".")}
    capsys.readouterr()
    assert main(tune(photos, study, space, "--trials", "1")) == 2
    err = one_line_error(capsys, "tune")
    assert "study.db" in err and "--out" in err
    assert {
        p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and not p.name.startswith(".")
    } == before  # nothing touched, nothing lost


def test_another_studys_database_never_reports_a_fold_under_settings_it_was_not_trained_with(
    one_trial, photos, space, tmp_path, capsys
):
    other = tmp_path / "other"
    assert main(tune(photos, other, space, "--trials", "1", "--lr", "0.003")) == 0  # the same space, another start
    study = damage_copy(one_trial, tmp_path, "kept")
    shutil.copy(other / "study.db", study / "study.db")  # a foodvit study's database, of other settings
    capsys.readouterr()
    assert main(tune(photos, study, space, "--trials", "1")) == 2
    err = one_line_error(capsys, "tune")
    assert "trial-0000" in err and "optim.lr" in err
    assert "0.003" not in (study / "tune.md").read_text()  # no report under the foreign settings


def test_a_trial_folder_is_bound_to_its_settings_and_checked_when_it_is_reused(
    one_trial, tmp_path, photos, space, capsys
):
    study = damage_copy(one_trial, tmp_path, "kept")
    bound = json.loads((study / "trial-0000" / "trial.json").read_text())
    assert bound["settings"]["optim"]["lr"] == 1e-3  # the tiny recipe's, the starting trial's
    # a fold trained with other settings slipped into the folder: the trial's fold does not say what it holds
    config = json.loads((study / "trial-0000" / "fold-0" / "config.json").read_text())
    bound["settings"]["optim"]["lr"] = 0.5
    (study / "trial-0000" / "trial.json").write_text(json.dumps(bound))
    capsys.readouterr()
    assert main(tune(photos, study, space, "--trials", "1")) == 2
    assert "trial-0000" in one_line_error(capsys, "tune")
    assert config == json.loads((study / "trial-0000" / "fold-0" / "config.json").read_text())


def test_a_budget_shorter_than_one_fold_stops_the_trial_and_the_next_tune_resumes_it(
    photos, space, tmp_path, capsys, monkeypatch
):
    real_run_fold, ran = cv.run_fold, []

    def run_fold(config, run, folder, **kwargs):
        ran.append(f"{run.parent.name}/{run.name}")
        return {
            **real_run_fold(config, run, folder, **kwargs),
            "seconds": 5.0,
        }  # every fold takes 5 s, whatever the machine

    monkeypatch.setattr(cv, "run_fold", run_fold)
    study = tmp_path / "study"
    assert main(tune(photos, study, space, "--budget", "0.05s")) == 0
    out = capsys.readouterr()
    assert "less than one fold takes here (5 s" in out.out + out.err and "the next `foodvit tune`" in out.out
    assert ran == ["trial-0000/fold-0"]
    assert main(tune(photos, study, space, "--trials", "1")) == 0
    summary = capsys.readouterr().out
    assert ran[1:] == ["trial-0000/fold-0", "trial-0000/fold-1"]  # fold 0's result read again, fold 1 trained
    assert "has not finished" not in summary and "the starting recipe (trial 1) is the best found" in summary
    study_db = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study / 'study.db'}")
    assert [t.state.name for t in study_db.trials] == ["PRUNED", "COMPLETE"]
    assert study_db.trials[1].user_attrs["dir"] == "trial-0000" and study_db.trials[1].user_attrs["baseline"]
    assert "0 failed" in summary and "1 stopped by the budget" in summary


def test_a_file_where_a_trial_folder_belongs_and_a_binary_space_file_are_one_line(
    one_trial, photos, space, tmp_path, capsys
):
    study = damage_copy(one_trial, tmp_path, "kept")
    shutil.rmtree(study / "trial-0000")
    (study / "trial-0000").write_text("a file")
    capsys.readouterr()
    assert main(tune(photos, study, space, "--trials", "1")) == 2
    assert "trial-0000 is a file" in one_line_error(capsys, "tune")
    binary = tmp_path / "space.toml"
    binary.write_bytes(b"\x00\xff\xfe")
    assert main(tune(photos, tmp_path / "new", binary, "--trials", "1")) == 2
    assert "not UTF-8" in one_line_error(capsys, "tune")


@pytest.mark.parametrize("command", ["cv", "tune"])
def test_a_study_inside_the_class_folders_it_trains_on_is_refused(photos, space, tmp_path, capsys, command):
    # cv wrote its study into train/study/: every later command on that data saw a class "study" of its links
    data = shutil.copytree(photos, tmp_path / "photos")
    for out in (data / "train" / "study", data / "train"):
        argv = ["cv", "--data", str(data), "--out", str(out), "--folds", "2", *TINY]
        assert main(argv if command == "cv" else tune(data, out, space, "--trials", "1")) == 2
        assert f"--out {out} is inside {data / 'train'}, the folder of the class folders" in one_line_error(
            capsys, command
        )
    assert sorted(p.name for p in (data / "train").iterdir()) == ["pizza", "steak", "sushi"]


def test_a_study_whose_photos_moved_goes_on_from_their_new_place(photos, tmp_path, capsys):
    # its fold folders' links still pointed at the old place: "class folder .../fold-1/train/pizza has no readable
    # photos; add photos or remove the folder", and removing it made another error
    data, study = shutil.copytree(photos, tmp_path / "photos"), tmp_path / "study"
    assert main(["cv", "--data", str(data), "--out", str(study), "--folds", "2", "--fold", "0", *TINY]) == 0
    kept = (study / "fold-0.json").read_bytes()
    moved = data.rename(tmp_path / "moved")
    assert main(["cv", "--data", str(moved), "--out", str(study), "--folds", "2", *TINY]) == 0
    assert (study / "fold-0.json").read_bytes() == kept and (study / "cv.json").is_file()  # fold 0 not run again
    links = sorted((study / "folds").rglob("*.jpg"))
    assert links and all(os.readlink(link).startswith(str(moved)) for link in links)


def test_a_damaged_fold_result_is_scored_again_from_its_run_not_trained_again(
    one_trial, photos, tmp_path, capsys, monkeypatch
):
    import foodvit.training.run as trainer

    study = damage_copy(one_trial, tmp_path, "kept") / "trial-0000"  # a trial folder is a cv study of its settings
    cv_study = tmp_path / "cv"
    assert main(["cv", "--data", str(photos), "--out", str(cv_study), "--folds", "2", *TINY]) == 0
    kept, kept_study = json.loads((cv_study / "fold-0.json").read_text()), (cv_study / "cv.json").read_text()
    (cv_study / "fold-0.json").write_text('{"seed": 0, "fold"')  # cut short
    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("a finished fold was trained again"))
    capsys.readouterr()
    assert main(["cv", "--data", str(photos), "--out", str(cv_study), "--folds", "2", *TINY]) == 0
    again = json.loads((cv_study / "fold-0.json").read_text())
    assert again["predictions"] == kept["predictions"] and study.is_dir()
    # edited so that it no longer agrees with itself: tracebacks where the study summed it, or a study over fewer
    # photos than it holds
    for edit in ({"accuracy": "0.9"}, {"correct": None}, {"seconds": None}, {"predictions": []}):
        (cv_study / "fold-0.json").write_text(json.dumps({**kept, **edit}))
        (cv_study / "cv.json").unlink()
        assert main(["cv", "--data", str(photos), "--out", str(cv_study), "--folds", "2", *TINY]) == 0, edit
        assert json.loads((cv_study / "fold-0.json").read_text())["predictions"] == kept["predictions"]
        assert json.loads((cv_study / "cv.json").read_text())["n"] == json.loads(kept_study)["n"]


def test_a_study_folder_named_with_url_characters_keeps_its_database_inside(photos, space, tmp_path):
    study = tmp_path / "what? #1 100%"
    assert main(tune(photos, study, space, "--trials", "1")) == 0
    assert (study / "study.db").is_file() and sorted(p.name for p in tmp_path.iterdir()) == [study.name]


def test_studies_in_one_storage_have_names_of_their_own_that_a_moved_folder_keeps(tmp_path):
    from foodvit.tuning.storage import WHERE, record_storage, study_name

    identity, url = {"kind": "tune", "data": "abc", "folds": 2}, f"sqlite:///{tmp_path / 'shared.db'}"
    one, two = tmp_path / "a" / "study", tmp_path / "b" / "study"  # one folder name, two studies
    assert study_name(one, None, identity) == "foodvit"  # the folder's own study.db holds that study alone
    first = study_name(one, url, identity)
    names = {first, study_name(two, url, identity), study_name(one, url, {**identity, "data": "other photos"})}
    assert len(names) == 3 and all(n.startswith("foodvit-study-") for n in names)  # each --out, each study its own
    one.mkdir(parents=True)
    record_storage(one, url, first)
    moved = tmp_path / "elsewhere"
    one.rename(moved)  # or taken to another machine that reaches the same server
    assert study_name(moved, url, identity) == first == json.loads((moved / WHERE).read_text())["study"]
    (moved / WHERE).write_text(json.dumps({"storage": url}))  # noted before studies had names of their own
    assert study_name(moved, url, identity) == "foodvit"


def test_a_storages_study_of_another_folder_is_refused_and_one_without_a_folder_is_claimed(tmp_path):
    from foodvit.errors import StudyError
    from foodvit.tuning.storage import IDENTITY, check_study

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(storage=url, study_name="foodvit")  # as every study in a --storage was named
    ours = {"kind": "tune", "data": "abc", "folds": 2, "settings": {"optim": {"lr": 0.001}}}
    check_study(study, ours, url)  # a study that says whose it is not: this folder's from now on
    assert optuna.load_study(study_name="foodvit", storage=url).user_attrs[IDENTITY] == ours
    check_study(study, ours, url)
    with pytest.raises(
        StudyError,
        match=r"holds under the name foodvit the trials of another study \(data: 'abc' -> "
        r"'xyz'\), not this folder's; give the --storage that holds",
    ):
        check_study(optuna.load_study(study_name="foodvit", storage=url), {**ours, "data": "xyz"}, url)


@pytest.mark.slow  # two studies in one database; the fast tier keeps their names and the check of a study's owner
def test_two_studies_sharing_one_sqlite_storage_never_share_trials(photos, space, tmp_path, capsys):
    other = make_photo_folder(tmp_path / "other", n_train=5, n_test=2)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    assert main(tune(photos, tmp_path / "sA", space, "--trials", "1", "--storage", url)) == 0
    capsys.readouterr()
    # another study's first trial had been this one's best, and this one's starting recipe never ran
    assert main(tune(other, tmp_path / "sB", space, "--trials", "1", "--storage", url)) == 0
    assert sorted(p.name for p in (tmp_path / "sB").glob("trial-*")) == ["trial-0000"]  # it had run trial-0001 alone
    assert "the starting recipe (trial 0) is the best found" in capsys.readouterr().out
    names = {json.loads((tmp_path / s / "storage.json").read_text())["study"] for s in ("sA", "sB")}
    assert len(names) == 2 and set(optuna.get_all_study_names(url)) == names
    for name in names:
        trials = optuna.load_study(study_name=name, storage=url).trials
        assert [(t.state.name, t.user_attrs["dir"], t.user_attrs.get("baseline")) for t in trials] == [
            ("COMPLETE", "trial-0000", True)
        ]


def test_a_database_gone_in_the_middle_of_a_search_is_found_behind_optunas_own_failure():
    # the server away, Optuna's handling of the trial fails in turn (UnboundLocalError: ... 'updated_state'); the
    # slow tier stops a real PostgreSQL server in the middle of `foodvit tune` (test_tune_postgres.py)
    import sqlalchemy.exc

    from foodvit.tuning.storage import database_error, storage_lost

    gone = sqlalchemy.exc.OperationalError(
        "UPDATE trials",
        {},
        Exception("server closed the connection unexpectedly\n\tThis probably means the server terminated"),
    )
    optunas = UnboundLocalError("cannot access local variable 'updated_state' where it is not associated with a value")
    optunas.__context__ = gone
    assert database_error(optunas) is gone and database_error(RuntimeError("a bug")) is None
    assert storage_lost(Path("s"), "postgresql://u:secret@h/db", gone) == (
        "the study's database, --storage postgresql://u:***@h/db, went away during the search (server closed the "
        "connection unexpectedly): once its server is up again, run the same command to go on; the trial that was "
        "running is run again, its finished folds kept"
    )
