"""Bad input to the studies, predict, data and explain gets one line that says what was expected and
what to do, never a traceback, and the advice is true: each case through the command line."""

import contextlib
import errno
import io
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import damaged_exif_photo, make_photo_folder

from foodvit.cli.main import main

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"foodvit {command}: error: ") and "Traceback" not in err, err
    return err


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("command", ["cv", "tune"])
@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_a_study_out_that_is_a_file_or_under_one_is_one_line(photos, tmp_path, capsys, command, where):
    pytest.importorskip("optuna")
    out = a_file(tmp_path) if where == "file" else a_file(tmp_path) / "sub"
    assert main([command, "--data", str(photos), "--out", str(out), "--folds", "2", *TINY]) == 2
    assert "a-file is a file" in one_line(capsys, command)
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_train_out_under_a_file_is_one_line(photos, tmp_path, capsys):
    out = a_file(tmp_path) / "run"
    assert main(["train", "--data", str(photos), "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err  # the run directory's name, then the error
    assert "Traceback" not in err and "a-file is a file; a run directory is a folder" in err.splitlines()[-1]


@pytest.mark.parametrize("damage", ["folder", "garbage", "list", "dangling"])
def test_a_damaged_study_json_is_one_line(photos, tmp_path, capsys, damage):
    study = tmp_path / "study"
    study.mkdir()
    target = study / "study.json"
    if damage == "folder":
        target.mkdir()
    elif damage == "garbage":
        target.write_bytes(b"\x00\xff{not json")
    elif damage == "list":
        target.write_text("[1, 2]")
    else:
        target.symlink_to(tmp_path / "nowhere.json")
    assert main(["cv", "--data", str(photos), "--out", str(study), "--folds", "2", *TINY]) == 2
    assert "study.json" in one_line(capsys, "cv")


@pytest.mark.parametrize(
    "url, says",
    [
        ("bogus://x", "not a database URL"),
        ("postgresql://u@127.0.0.1:1/db", "driver"),
        ("sqlite:////nonexistent-dir/x/y.db", "/nonexistent-dir/x does not exist"),
    ],
)
def test_a_storage_that_cannot_be_used_is_one_line(photos, tmp_path, capsys, monkeypatch, url, says):
    pytest.importorskip("optuna")
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # the driver missing, whether or not it is installed here
    monkeypatch.setitem(sys.modules, "psycopg", None)
    assert (
        main(["tune", "--data", str(photos), "--out", str(tmp_path / "s"), "--storage", url, "--folds", "2", *TINY])
        == 2
    )
    assert says in one_line(capsys, "tune")


@pytest.mark.parametrize("password", ["SECRET@TAIL", "SE:CRET@TAIL", "SE/CRET@TAIL", "SECRET@TA/IL@END"])
def test_a_password_with_an_unencoded_at_sign_is_told_to_be_percent_encoded_and_never_shown(
    photos, tmp_path, capsys, password
):
    pytest.importorskip("optuna")
    from helpers import free_port

    # it had read the password's end as the host: "cannot reach ... u:***@TAIL@127.0.0.1 ...: start its server"
    url = f"postgresql://u:{password}@127.0.0.1:{free_port()}/db"
    out = tmp_path / "s"
    assert main(["tune", "--data", str(photos), "--out", str(out), "--storage", url, "--folds", "2", *TINY]) == 2
    err = one_line(capsys, "tune")
    assert not any(part in err for part in ("SE", "CRET", "TA", "IL", "END")), err
    assert "percent-encode" in err and "%40" in err and "start its server" not in err, err
    assert not out.exists()  # refused before the study folder is made


@pytest.mark.parametrize(
    "place, says",
    [
        ("folder", "is a folder; give a file's path"),
        ("missing/study.db", "missing does not exist"),
        ("a-file/study.db", "a-file is a file, not a folder"),
        ("/proc/foodvit-study.db", "cannot create /proc/foodvit-study.db"),
    ],
)
def test_a_sqlite_storage_that_cannot_be_made_names_the_path_and_what_is_wrong(photos, tmp_path, capsys, place, says):
    pytest.importorskip("optuna")
    if place.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    (tmp_path / "folder").mkdir()
    a_file(tmp_path)
    path = place if place.startswith("/") else tmp_path / place
    url = f"sqlite:///{path}"
    assert main(["tune", "--data", str(photos), "--out", str(tmp_path / "s"), "--storage", url, "--folds", "2"]) == 2
    err = one_line(capsys, "tune")
    # it had said "... is not a study database foodvit can use (unable to open database file): choose a new --out"
    assert f"--storage {url}" in err and says in err and "--out" not in err, err
    assert (tmp_path / "a-file").read_text() == "not a folder" and not (tmp_path / "missing").exists()


def test_folds_advice_says_what_a_class_needs(tmp_path, capsys):
    root = make_photo_folder(tmp_path / "p", n_train=3, n_test=1)
    for extra in (root / "train" / "sushi").glob("00[12].jpg"):
        extra.unlink()  # one sushi photo
    assert main(["cv", "--data", str(root), "--out", str(tmp_path / "s"), "--folds", "2", *TINY]) == 2
    err = one_line(capsys, "cv")
    assert "sushi has 1 training photo" in err and "--folds 2 or fewer" not in err and "at least 2 photos" in err
    root3 = make_photo_folder(tmp_path / "q", n_train=2, n_test=1)
    assert main(["cv", "--data", str(root3), "--out", str(tmp_path / "t"), "--folds", "3", *TINY]) == 2
    assert "--folds 2" in one_line(capsys, "cv")  # a smaller number of folds that works is still advised


def test_a_recipe_file_that_does_not_exist_says_so(tmp_path, capsys):
    assert main(["train", "--recipe", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "r")]) == 2
    err = one_line(capsys, "train")
    assert "does not exist" in err and "unknown recipe" not in err


def test_resume_of_a_folder_that_is_no_run_does_not_advise_what_would_be_refused(tmp_path, capsys):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert main(["train", "--resume", str(folder)]) == 2
    err = one_line(capsys, "train")
    assert f"--out {folder}" not in err and "train --out" not in err.replace("another", "") or "new" in err


def test_data_takes_data_like_every_command_and_refuses_a_folder_of_no_photos(photos, tmp_path, capsys):
    assert main(["data", "--data", str(photos)]) == 0
    out = capsys.readouterr().out
    assert "train: 12 photos, 3 classes" in out and "test: 6 photos" in out
    assert main(["data", str(photos), "--print-path"]) == 0  # the positional still works
    assert capsys.readouterr().out.strip() == str(photos.resolve())
    empty = tmp_path / "no-data"
    (empty / "docs").mkdir(parents=True)
    (empty / "docs" / "readme.txt").write_text("nothing")
    assert main(["data", "--data", str(empty)]) == 2
    assert "no-data" in one_line(capsys, "data")
    assert main(["evaluate", "--help"] if False else ["data", "--data", str(photos), str(photos)]) == 2
    assert "--data" in one_line(capsys, "data")


def test_explain_refuses_an_out_that_names_another_format(shared_run, tmp_path, capsys):
    run, photos = shared_run
    photo = next((photos / "test").rglob("*.jpg"))
    assert main(["explain", str(run), str(photo), "--out", str(tmp_path / "ex.txt")]) == 2
    assert ".png" in one_line(capsys, "explain") and not (tmp_path / "ex.txt").exists()
    assert main(["patches", str(photo), "--out", str(tmp_path / "p.jpg")]) == 2
    assert ".png" in one_line(capsys, "patches")


def test_compare_with_a_tune_study_says_it_is_no_cv_study(tmp_path, capsys):
    import json

    a, b = tmp_path / "a", tmp_path / "b"
    for folder, kind in ((a, "cv"), (b, "tune")):
        folder.mkdir()
        (folder / "study.json").write_text(json.dumps({"kind": kind, "data": "x", "classes": [], "folds": 2}))
    assert main(["cv", "--compare", str(a), str(b)]) == 2
    err = one_line(capsys, "cv")
    assert "in common yet" not in err and "tune" in err


def test_one_limit_and_one_wording_for_an_oversized_photo_in_predict_and_explain(shared_run, tmp_path, capsys):
    from PIL import Image

    from foodvit.deploy.service import DEFAULT_MAX_MEGAPIXELS

    run, _ = shared_run
    big = tmp_path / "big.png"
    Image.new("1", (8_000, 7_500)).save(big)  # 60 megapixels in a few kilobytes: over the limit of 50 that serve keeps
    assert DEFAULT_MAX_MEGAPIXELS == 50
    assert main(["explain", str(run), str(big), "--out", str(tmp_path / "e.png")]) == 2
    assert "60 megapixels, over the limit of 50 megapixels" in one_line(capsys, "explain")
    assert main(["predict", str(run), str(big)]) == 1
    assert "60 megapixels, over the limit of 50 megapixels" in capsys.readouterr().err


def test_resume_and_out_agree_on_a_run_stopped_before_its_first_checkpoint(shared_run, tmp_path, capsys):
    import shutil

    run, photos = shared_run
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    shutil.copy(run / "config.json", stopped / "config.json")  # what a kill -9 before the first checkpoint leaves
    assert main(["train", "--resume", str(stopped)]) == 2
    resumed = capsys.readouterr().err.strip().splitlines()[-1]  # after the "run directory:" line
    assert main(["train", "--data", str(photos), "--out", str(stopped), *TINY]) == 2
    started = capsys.readouterr().err.strip().splitlines()[-1]
    for err in (resumed, started):
        assert "stopped before its first checkpoint" in err and f"remove {stopped}" in err


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "list",
        "no-predictions",
        "folder",
        "null",
        "answer not true or false",
        "a run without its fold",
        "runs",
    ],
)
@pytest.mark.parametrize("where", ["fold-0.json", "cv.json"])
def test_compare_with_a_damaged_result_file_is_one_line(tmp_path, capsys, damage, where):
    good = {"seed": 0, "fold": 0, "predictions": [{"photo": "pizza/1.jpg", "right": True}]}
    studies = []
    for name in ("a", "b"):
        study = tmp_path / name
        study.mkdir()
        (study / "study.json").write_text("{}")
        (study / "fold-0.json").write_text(__import__("json").dumps(good))
        studies.append(study)
    target = studies[1] / where
    if damage == "folder":
        target.unlink(missing_ok=True)
        target.mkdir()
    elif damage == "garbage":
        target.write_bytes(b"\x00\xff{not json")
    elif damage == "list":
        target.write_text("[1, 2]")
    elif damage == "null":  # valid JSON of the wrong shape once failed with a TypeError
        target.write_text('{"photos": null}' if where == "cv.json" else '{"seed": 0, "fold": 0, "predictions": null}')
    elif damage in ("a run without its fold", "runs"):  # cv.json's list of runs: a KeyError, a TypeError traceback
        runs = '[{"seed": 1}]' if damage == "a run without its fold" else "7"
        target.write_text(f'{{"photos": {{"s0/pizza/1.jpg": true}}, "folds": {runs}}}' if where == "cv.json" else "[]")
    elif damage == "answer not true or false":
        answer = '{"photo": "pizza/1.jpg", "right": "yes"}'
        target.write_text(
            '{"photos": {"s0/pizza/1.jpg": "yes"}}'
            if where == "cv.json"
            else f'{{"seed": 0, "fold": 0, "predictions": [{answer}]}}'
        )
    else:
        target.write_text('{"seed": 0, "fold": 0}')
    if where == "cv.json":  # both finished, so cv.json is what is read
        (studies[0] / "cv.json").write_text('{"photos": {"s0/pizza/1.jpg": true}}')
    assert main(["cv", "--compare", str(studies[0]), str(studies[1])]) == 2
    err = one_line(capsys, "cv")
    assert str(target) in err and "damaged" in err


@pytest.mark.parametrize("command", ["export-web", "export-space"])
def test_an_export_folder_under_a_file_is_one_line(shared_run, tmp_path, capsys, command):
    out = a_file(tmp_path) / "site"
    assert (
        main(
            [
                command,
                str(shared_run[0]),
                "--out" if command == "export-web" else str(out),
                *([str(out), "--ort-web", str(tmp_path / "no-such-ort")] if command == "export-web" else []),
            ]
        )
        == 2
    )
    assert "a-file is a file" in one_line(capsys, command)
    assert (tmp_path / "a-file").read_text() == "not a folder"


REFUSED = Path("/proc")  # Linux makes no files here, whoever asks (root included)
linux_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")


@linux_proc
@pytest.mark.parametrize("command", ["cv", "tune", "predict --out", "predict --plot"])
def test_a_place_the_system_refuses_is_one_line_naming_the_place_asked_for(photos, shared_run, capsys, command):
    if command == "tune":
        pytest.importorskip("optuna")
    name, _, option = command.partition(" ")
    if name in ("cv", "tune"):
        target = REFUSED / "foodvit-study"
        argv = [name, "--data", str(photos), "--out", str(target), "--folds", "2", *TINY]
    else:
        target = REFUSED / ("labels.csv" if option == "--out" else "plot.png")
        photo = next((photos / "test" / "pizza").iterdir())
        argv = ["predict", str(shared_run[0]), str(photo), option, str(target)]
    assert main(argv) == 2
    err = one_line(capsys, name)
    # the place the user named, never the temporary file beside it that the write goes through
    assert f"cannot use {target}" in err and "(No such file or directory); check the path" in err
    assert ".tmp" not in err and not target.exists()


@linux_proc
def test_atomic_writes_name_their_target_when_the_system_refuses_them():
    from foodvit.files import atomic_folder, atomic_write

    with pytest.raises(OSError) as refused:
        atomic_write(REFUSED / "x.txt", lambda tmp: Path(tmp).write_text("x"))
    assert refused.value.filename == str(REFUSED / "x.txt")
    with pytest.raises(OSError) as refused:
        atomic_folder(REFUSED / "site", lambda tmp: None)
    assert refused.value.filename == str(REFUSED / "site")


def test_ctrl_c_just_after_an_atomic_writes_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    # the temporary file was made outside the block that removes it: a .model.json.*.tmp was left in a run
    from foodvit import files

    def close_then_interrupt(fd):
        os.close(fd)
        raise KeyboardInterrupt

    # the module's os alone: every other close in this process stays the real one
    monkeypatch.setattr(files, "os", types.SimpleNamespace(**{**vars(os), "close": close_then_interrupt}))
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "model.json", lambda tmp: Path(tmp).write_text("{}"))
    assert list(tmp_path.iterdir()) == []
    made = Path.mkdir

    def make_then_interrupt(self, *args, **kwargs):  # the same moment for a folder (export-space, export-web)
        made(self, *args, **kwargs)
        if self.name.startswith(".site."):
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", make_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        files.atomic_folder(tmp_path / "site", lambda tmp: None)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_and_a_file_inside_a_folder_being_written_are_named_as_the_user_named_them(tmp_path):
    import errno

    from foodvit.cli.main import place_refused
    from foodvit.files import atomic_folder, atomic_write

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write or flush raises it: no file named

    with pytest.raises(OSError) as refused:
        atomic_write(tmp_path / "model.onnx", full)
    assert refused.value.filename == str(tmp_path / "model.onnx") and not list(tmp_path.iterdir())
    assert place_refused(refused.value).endswith(
        "(No space left on device); free some space there, or choose another place"
    )

    def denied(tmp):
        raise PermissionError(errno.EACCES, "Permission denied", str(Path(tmp) / "ort" / "ort.wasm"))

    with pytest.raises(PermissionError) as refused:
        atomic_folder(tmp_path / "site", denied)
    assert refused.value.filename == str(tmp_path / "site" / "ort" / "ort.wasm") and not list(tmp_path.iterdir())
    assert "choose a place you can write to, or check its permissions" in place_refused(refused.value)

    def reads_another(tmp):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "source.bin"))

    with pytest.raises(FileNotFoundError) as refused:
        atomic_write(tmp_path / "copy.bin", reads_another)
    assert refused.value.filename == str(tmp_path / "source.bin")  # another file's error stays that file's


@pytest.mark.parametrize("command", ["train", "cv"])
def test_photos_of_one_class_are_refused_before_anything_is_made(tmp_path, capsys, command):
    one = make_photo_folder(tmp_path / "one", n_train=4, n_test=2, classes=("pizza",))
    out = tmp_path / "out"
    extra = ["--folds", "2"] if command == "cv" else []
    assert main([command, "--data", str(one), "--out", str(out), *extra, *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # train names its run directory first
    assert "Traceback" not in "".join(err) and err[-1].startswith(f"foodvit {command}: error: ")
    assert "holds one class (pizza)" in err[-1] and not out.exists()


def test_a_truncated_photo_is_skipped_by_evaluate_and_counted_so_by_data(shared_run, tmp_path, capsys):
    import json
    import shutil

    folder = tmp_path / "photos"
    shutil.copytree(shared_run[1] / "test", folder)
    whole = next((folder / "pizza").iterdir()).read_bytes()
    (folder / "pizza" / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # its header reads, its pixels end early
    n = sum(1 for _ in folder.rglob("*.jpg"))

    assert main(["evaluate", str(shared_run[0]), "--data", str(folder), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["n"] == n - 1 and len(result["skipped"]) == 1
    assert result["skipped"][0].startswith(f"{folder / 'pizza' / 'cut.jpg'}: cannot be read (image file is truncated")
    assert "skipped 1 unreadable file(s)" in captured.err and "cut.jpg" in captured.err

    assert main(["evaluate", str(shared_run[0]), "--data", str(folder), "--strict"]) == 2
    assert "cut.jpg" in one_line(capsys, "evaluate")

    assert main(["data", "--data", str(folder)]) == 0  # counted as training would count it: skipped
    out = capsys.readouterr().out
    assert f"photos: {n - 1} photos" in out and "skipped 1 unreadable file(s)" in out and "cut.jpg" in out

    for photo in (folder / "steak").iterdir():  # a class left with no photo whole: refused, as the split's check would
        photo.write_bytes(photo.read_bytes()[: photo.stat().st_size // 2])
    assert main(["evaluate", str(shared_run[0]), "--data", str(folder), "--json"]) == 2
    assert "steak has no photo that could be decoded" in one_line(capsys, "evaluate")


def test_data_reads_only_the_headers_of_a_split_past_its_decoding_bound(shared_run, tmp_path, capsys, monkeypatch):
    import shutil

    from foodvit.cli import data

    folder = tmp_path / "photos"
    shutil.copytree(shared_run[1] / "test", folder)
    whole = next((folder / "pizza").iterdir()).read_bytes()
    (folder / "pizza" / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    n = sum(1 for _ in folder.rglob("*.jpg"))
    monkeypatch.setattr(data, "DECODE_UP_TO", n - 1)
    assert main(["data", "--data", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"photos: {n} photos" in out and f"(headers checked, not whole photos: over {n - 1:,};" in out


def test_a_picture_is_written_over_only_when_foodvit_made_it(shared_run, tmp_path, capsys):
    photo = next((shared_run[1] / "test" / "pizza").iterdir())
    theirs = tmp_path / "holiday.png"
    theirs.write_bytes(b"the user's own picture")
    assert main(["predict", str(shared_run[0]), str(photo), "--plot", str(theirs)]) == 2
    assert "holiday.png exists and is not a picture foodvit made" in one_line(capsys, "predict")
    assert theirs.read_bytes() == b"the user's own picture"

    ours = tmp_path / "plot.png"
    assert main(["predict", str(shared_run[0]), str(photo), "--plot", str(ours)]) == 0
    first = ours.stat().st_ino
    assert main(["predict", str(shared_run[0]), str(photo), "--plot", str(ours)]) == 0  # run again: its own picture
    assert ours.stat().st_ino != first and ours.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # written anew, whole


def test_a_study_kept_in_a_storage_says_where_when_resumed_without_it(photos, tmp_path, capsys):
    pytest.importorskip("optuna")
    study, url = tmp_path / "study", f"sqlite:///{tmp_path / 'ext.db'}"
    tune = ["tune", "--data", str(photos), "--out", str(study), "--folds", "2", "--trials", "1", *TINY]
    assert main([*tune, "--storage", url]) == 0
    capsys.readouterr()
    assert main(tune) == 2  # it had said the folder's study.db was gone, though the trials were never there
    assert f"are in --storage {url}, not in the folder; give --storage {url} to go on" in one_line(capsys, "tune")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main([*tune, "--storage", other]) == 2
    assert f"are in --storage {url}, not in {other}" in one_line(capsys, "tune")
    assert not (tmp_path / "other.db").exists()


def test_a_study_of_its_own_database_is_not_opened_in_a_storage(tmp_path):
    from foodvit.errors import StudyError
    from foodvit.tuning.storage import check_database

    (tmp_path / "study.db").write_bytes(b"SQLite format 3\x00")
    with pytest.raises(
        StudyError, match="are in its own study.db, not in postgresql://u:\\*\\*\\*@h/db; leave out --storage"
    ):
        check_database(tmp_path, "postgresql://u:secret@h/db")


def test_a_selection_of_one_class_is_told_to_name_two(tmp_path):
    from foodvit.data.datasource import DataSource
    from foodvit.errors import DataError

    folder = make_photo_folder(tmp_path / "two", n_train=2, n_test=1, classes=("pizza", "steak"))
    with pytest.raises(
        DataError, match=r"the data names one class \(pizza\) of .*: .* so name two or more after the colon"
    ):
        DataSource.parse(f"{folder}:pizza").listed()
    assert DataSource.parse(f"{folder}:pizza,steak").listed().train.classes == ("pizza", "steak")


def test_a_studys_storage_note_never_holds_the_password(tmp_path):
    pytest.importorskip("sqlalchemy")
    from foodvit.tuning.storage import WHERE, record_storage

    record_storage(tmp_path, "postgresql://u:pa/ss:w%40rd@db.example:5432/studies")  # '/', ':' and '@' in it
    note = (tmp_path / WHERE).read_text()
    assert "pa/ss" not in note and "rd" not in note and "postgresql://u:***@db.example:5432/studies" in note


@pytest.mark.parametrize(
    "name, says",
    [
        ("checkpoint.pt", "the run cannot go on from it"),
        ("teacher-progress.pt", "the CNN teacher's training starts over"),
    ],
)
def test_a_damaged_checkpoint_says_what_to_do_in_one_line_without_pytorchs_advice(name, says, tmp_path):
    from foodvit.errors import RunError
    from foodvit.rundir.directory import load_checkpoint

    path = tmp_path / name
    path.write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(RunError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert f"{path} is damaged or not a foodvit checkpoint (" in message and says in message
    assert "\n" not in message and "weights_only" not in message and "file an issue" not in message


def test_compare_names_runs_of_one_name_by_their_paths_and_refuses_a_run_given_twice(shared_run, tmp_path, capsys):
    # both columns were headed "run" over different settings; one run given as run1, run1/ and ./run1 made three
    import shutil

    for folder, depth in (("a", "1"), ("b", "2")):
        shutil.copytree(shared_run[0], tmp_path / folder / "run")
        config = json.loads((tmp_path / folder / "run" / "config.json").read_text())
        config["vit"]["depth"] = int(depth)
        (tmp_path / folder / "run" / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == ["setting", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]
    assert main(["compare", str(tmp_path / "a" / "run"), f"{tmp_path / 'a' / 'run'}/"]) == 2
    assert "name one run; give each run once" in one_line(capsys, "compare")


@pytest.mark.parametrize("damage", ["metrics not text", "metrics not numbers", "config a list"])
def test_compare_with_a_damaged_run_is_one_line(shared_run, tmp_path, capsys, damage):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(shared_run[0], run)
    if damage == "metrics not text":
        (run / "metrics.csv").write_bytes(b"epoch,train_loss\n1,abc\n\x00\xff\n")
    elif damage == "metrics not numbers":
        (run / "metrics.csv").write_text("epoch,seconds\n1,soon\n")
    else:
        (run / "config.json").write_text("[]")
    assert main(["compare", str(shared_run[0]), str(run)]) == 2
    err = one_line(capsys, "compare")
    assert str(run) in err and "restore it, or leave that run out" in err


def test_a_name_the_system_refuses_in_a_list_is_that_photos_error_and_a_binary_list_is_refused(
    shared_run, tmp_path, capsys
):
    import csv

    photo = next((shared_run[1] / "test" / "pizza").iterdir())
    listing = tmp_path / "list.txt"
    listing.write_text(f"{photo}\n{'a' * 300}.jpg\n")  # a name too long for the file system
    out = tmp_path / "labels.csv"
    assert main(["predict", str(shared_run[0]), "--files-from", str(listing), "--out", str(out)]) == 1
    rows = list(csv.DictReader(out.open()))
    assert [bool(r["label"]) for r in rows] == [True, False] and "cannot be used (File name too long)" in rows[1][
        "error"
    ]
    capsys.readouterr()
    assert main(["predict", str(shared_run[0]), "--files-from", str(photo), "--out", str(tmp_path / "x.csv")]) == 2
    assert "holds binary data (a photo?)" in one_line(capsys, "predict") and not (tmp_path / "x.csv").exists()
    utf16 = tmp_path / "utf16.txt"  # PowerShell 5's `>`: it was called binary data (a photo?)
    utf16.write_text(f"{photo}\n", encoding="utf-16")
    assert main(["predict", str(shared_run[0]), "--files-from", str(utf16), "--out", str(tmp_path / "x.csv")]) == 2
    assert "is UTF-16 text; save it as UTF-8" in one_line(capsys, "predict") and not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("classes", '["a"]', "its foodvit metadata does not match the model it holds"),
        # a class named twice lost one class's probability from every answer, silently
        ("classes", '["a", "a", "b"]', "its foodvit metadata does not match the model it holds"),
        ("preprocess", '{"image_size": 0}', "its foodvit metadata does not match the model it holds"),
        (
            "preprocess",
            '{"image_size": 64, "resize_size": 73, "mean": [0, 0, 0], "std": [1, 1, 1]}',
            "its foodvit metadata does not match the model it holds",
        ),
        # serve read them for its page: a traceback
        ("card", '{"metrics": "x", "model": "y"}', 'its foodvit card is damaged: its model must be an object, got "y"'),
    ],
)
def test_an_onnx_whose_metadata_does_not_match_its_graph_is_one_line(shared_onnx, tmp_path, capsys, key, value, says):
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(shared_onnx))
    for prop in model.metadata_props:
        if prop.key == f"foodvit.{key}":
            prop.value = value  # one class for a graph of three; preprocessing cut short; another input size
    damaged = tmp_path / "damaged.onnx"
    onnx.save(model, str(damaged))
    photo = tmp_path / "photo.jpg"
    from PIL import Image

    Image.new("RGB", (48, 48), (120, 80, 40)).save(photo)
    assert main(["predict", str(damaged), str(photo)]) == 2
    assert says in one_line(capsys, "predict")


@pytest.mark.parametrize(
    "options, says",
    [
        (["--image-size", "100000", "--patch-size", "1000"], "must be in [1, 1024]"),
        (["--image-size", "1024", "--patch-size", "2"], "a grid of 512 x 512; patches draws at most 64 x 64"),
        (["--channels", "100000"], "more than the 192 channels"),
        # a grid of 16 px patches was drawn beside the model's maps of 8 px ones
        (["--channels", "1", "--patch-size", "16"], "which cuts 32 px photos into patches of 8 px; leave --image-size"),
    ],
)
def test_patches_refuses_sizes_past_a_picture_in_one_line(shared_run, tmp_path, capsys, options, says):
    photo = next((shared_run[1] / "test" / "pizza").iterdir())
    maps = ["--feature-maps", str(shared_run[0])] if "--channels" in options else []
    with pytest.raises(SystemExit) if "100000" in options and "--image-size" in options else contextlib.nullcontext():
        assert main(["patches", str(photo), "--out", str(tmp_path / "p.png"), *options, *maps]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "p.png").exists()


def test_plot_draws_thumbnails_and_refuses_more_photos_than_it_can_show(shared_run, tmp_path, capsys):
    from PIL import Image

    from foodvit.deploy.inference import PLOT_MOST, PLOT_SIDE, thumbnail

    big = tmp_path / "big.jpg"
    Image.new("RGB", (6000, 4000), (90, 140, 60)).save(big, quality=80)
    assert max(thumbnail(big).size) <= 2 * PLOT_SIDE  # decoded reduced, never at 24 megapixels
    photo = next((shared_run[1] / "test" / "pizza").iterdir())
    plot = tmp_path / "plot.png"
    assert main(["predict", str(shared_run[0]), *[str(photo)] * (PLOT_MOST + 1), "--plot", str(plot)]) == 2
    assert f"--plot draws at most {PLOT_MOST} photos, and {PLOT_MOST + 1} are given" in one_line(capsys, "predict")
    assert not plot.exists()
    assert main(["predict", str(shared_run[0]), str(big), str(photo), "--plot", str(plot)]) == 0 and plot.is_file()


@pytest.mark.parametrize("content", [b"", b"\n \n\r\n"])
def test_an_empty_list_file_is_refused_as_an_empty_folder_is(shared_run, tmp_path, capsys, content):
    listing = tmp_path / "list.txt"
    listing.write_bytes(content)
    out = tmp_path / "labels.csv"
    assert main(["predict", str(shared_run[0]), "--files-from", str(listing), "--out", str(out)]) == 2
    assert "names no photos" in one_line(capsys, "predict") and not out.exists()


class _FullDevice(io.RawIOBase):
    """A stream that refuses every write as a full disk does (what `> /dev/full` gives standard output)."""

    full = True

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)


@pytest.mark.parametrize("options", [[], ["--json"]])
def test_predict_into_a_full_standard_output_is_one_line(shared_run, capsys, monkeypatch, options):
    photo = next((shared_run[1] / "test" / "pizza").iterdir())
    device = _FullDevice()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(device)))
    try:
        assert main(["predict", str(shared_run[0]), str(photo), *options]) == 2
    finally:
        device.full = False  # what stays buffered goes nowhere when the stream is collected
    assert "cannot write to standard output (No space left on device)" in one_line(capsys, "predict")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_command_whose_standard_output_is_full_says_so_in_one_line_and_nothing_at_exit():
    import subprocess

    with open("/dev/full", "w") as full:  # `foodvit models > /dev/full`; models starts without PyTorch
        done = subprocess.run(
            [sys.executable, "-m", "foodvit", "models"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # nothing more at the interpreter's exit
    assert done.stderr.startswith("foodvit models: error: cannot write to standard output (No space left on device)")


@pytest.mark.parametrize("settings", ["null", "[1]", '"lr"'])
def test_compare_with_a_study_json_of_the_wrong_shape_is_one_line(tmp_path, capsys, settings):
    # a study.json whose settings were not a table once failed with an AttributeError
    good = {"seed": 0, "fold": 0, "predictions": [{"photo": "pizza/1.jpg", "right": True}]}
    for name in ("a", "b"):
        study = tmp_path / name
        study.mkdir()
        (study / "study.json").write_text('{"data": "abc", "folds": 2, "seeds": [0], "settings": {}}')
        (study / "fold-0.json").write_text(__import__("json").dumps(good))
    (tmp_path / "b" / "study.json").write_text(f'{{"data": "abc", "folds": 2, "seeds": [0], "settings": {settings}}}')
    assert main(["cv", "--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = one_line(capsys, "cv")
    assert str(tmp_path / "b" / "study.json") in err and "damaged" in err


def test_an_onnx_path_that_is_a_folder_says_so(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    photo = tmp_path / "photo.jpg"
    from PIL import Image

    Image.new("RGB", (48, 48), (120, 80, 40)).save(photo)
    assert main(["predict", str(folder), str(photo)]) == 2
    assert f"{folder} is a folder, not a file; give an .onnx file" in one_line(capsys, "predict")


def test_a_folder_written_through_a_symbolic_link_lands_where_it_points(tmp_path):
    # an export-web or export-space --out that linked to an empty folder was refused with "Not a directory"
    from foodvit.files import atomic_folder

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    written = atomic_folder(link, lambda tmp: (Path(tmp) / "index.html").write_text("page"))
    assert written == link and (real / "index.html").read_text() == "page"
    assert link.is_symlink() and (link / "index.html").read_text() == "page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no staging folder left
    for name, points_to in (("dangling", tmp_path / "nowhere" / "a"), ("loop", tmp_path / "loop")):
        (tmp_path / name).symlink_to(points_to)  # no folder: refused as before, nothing made where it points
        with pytest.raises(OSError) as refused:
            atomic_folder(tmp_path / name, lambda tmp: None)
        assert refused.value.filename == str(tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "loop", "real"]


def test_a_file_name_of_another_locales_bytes_prints_escaped_on_a_strict_output(tmp_path, monkeypatch):
    """Python's output is strict on a UTF-8 locale (lenient only under C.UTF-8): a name holding byte 0xff printed
    a UnicodeEncodeError traceback after the picture was written."""
    from PIL import Image

    photo = tmp_path / "a.jpg"
    Image.new("RGB", (40, 48), (200, 40, 40)).save(photo)
    out = tmp_path / os.fsdecode(b"p\xff.png")
    raw = io.BytesIO()
    strict = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", strict)
    assert main(["patches", str(photo), "--out", str(out)]) == 0
    strict.flush()
    assert out.is_file() and raw.getvalue().rstrip().endswith(b"p\\udcff.png")


def test_a_photo_with_a_damaged_exif_block_is_read_without_pillows_warning(tmp_path, recwarn):
    """Pillow warned "Corrupt EXIF data" or "Truncated File Read", with a line of its source, for a photo whose EXIF
    block is cut short (one of the seven-class test photos); the photo itself decodes."""
    photo = damaged_exif_photo(tmp_path / "exif.jpg")
    assert main(["patches", str(photo), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").is_file()
    assert not [w for w in recwarn if "EXIF" in str(w.message) or "Truncated" in str(w.message)]


def test_json_nested_past_pythons_limit_is_a_damaged_file_not_a_recursion_error(shared_run, tmp_path, capsys):
    """A config.json, model.json or study result nested 100,000 deep gave a RecursionError traceback: json's
    parser gives up on it, and foodvit said nothing of the file."""
    import shutil

    from foodvit.errors import FoodVitError
    from foodvit.rundir.directory import read_config
    from foodvit.tuning.compare import read_study

    out, _ = shared_run
    nested = "[" * 100_000 + "]" * 100_000
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    (damaged / "config.json").write_text(nested)
    with pytest.raises(FoodVitError, match=r"config.json is not valid JSON \(maximum recursion depth"):
        read_config(damaged / "config.json")
    capsys.readouterr()
    assert main(["compare", str(out), str(damaged)]) == 2
    assert "config.json (maximum recursion depth exceeded" in capsys.readouterr().err
    (damaged / "model.json").write_text(nested)
    assert main(["predict", str(damaged), str(tmp_path / "none.jpg")]) == 2
    assert "model.json is not readable JSON (maximum recursion depth" in capsys.readouterr().err
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "cv.json").write_text(nested)
    with pytest.raises(FoodVitError, match="cv.json"):
        read_study(tmp_path / "study")
    # the study's own notes, read beside its results, and a predictions file's rows
    from foodvit.deploy.predictions import read_rows
    from foodvit.tuning.study import claimed, held_seeds

    for name in ("arithmetic.json", "study.json"):
        (tmp_path / "study" / name).write_text(nested)
    assert claimed(tmp_path / "study") is None and held_seeds(tmp_path / "study") is None  # as any damaged note
    rows = tmp_path / "p.jsonl"
    rows.write_text(nested + "\n")
    with pytest.raises(
        FoodVitError, match=r"p.jsonl is not a foodvit predictions file \(ValueError: maximum recursion"
    ):
        read_rows(rows)


def test_class_and_file_names_print_as_one_line_each_with_control_characters_escaped(tmp_path, capsys):
    # folders named with a line break or a terminal's colour codes printed lines that read as foodvit's own
    # ("sushi: 0.999 (FAKE)") and coloured the rest of the terminal
    import torch
    from helpers import make_photo_folder

    import foodvit
    from foodvit.data.preprocess import make_preprocess
    from foodvit.rundir.trained import save_model

    classes = ["pizza\x1b[31mRED", "steak\nsushi: 0.999 (FAKE)"]
    torch.manual_seed(0)
    model = foodvit.create_model("ViT-Ti/8", num_classes=2, image_size=32, depth=1).eval()
    save_model(tmp_path / "run", model, classes, make_preprocess(32, (0.5,) * 3, (0.5,) * 3))
    photos = make_photo_folder(tmp_path / "photos", n_train=1, n_test=2, classes=classes)
    photo = next((photos / "test").rglob("*.jpg"))
    odd = photo.with_name("a\nb.jpg")
    odd.write_bytes(photo.read_bytes())
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "run"), str(odd), "--top-k", "2"]) == 0
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(photos)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\nsushi: 0.999" not in shown
    assert "a\\nb.jpg: " in shown and "steak\\nsushi: 0.999 (FAKE)" in shown and "pizza\\x1b[31mRED" in shown
    assert main(["predict", str(tmp_path / "run"), str(tmp_path / "no\nsuch.jpg")]) == 1
    assert "no\\nsuch.jpg" in capsys.readouterr().err
    (odd.parent / "cut\nFAKE: ok.jpg").write_bytes(photo.read_bytes()[:-200])  # skipped by inspect, named on stderr
    assert (
        main(["inspect", str(tmp_path / "run"), "--data", str(photos), "--images", "9", "--out", str(tmp_path / "i")])
        == 0
    )
    assert "cut\\nFAKE: ok.jpg" in capsys.readouterr().err


def test_a_device_this_machine_lacks_is_one_line(tmp_path, capsys, monkeypatch):
    # --device mps without Apple's GPU was PyTorch's RuntimeError ("not linked with support for mps devices")
    import torch

    from foodvit.errors import ConfigError
    from foodvit.training.distributed import pick_device

    photos = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    if not torch.backends.mps.is_available():
        out = tmp_path / "run"
        assert main(["train", "--data", str(photos), "--out", str(out), "--device", "mps", *TINY]) == 2
        err = capsys.readouterr().err
        assert "device 'mps' asked for, but PyTorch sees no Apple GPU (MPS) here" in err and "Traceback" not in err
    # cuda:N past the GPUs there are (two here, as PyTorch would see them)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"'cuda:2' asked for, but PyTorch sees 2 CUDA GPUs here \(cuda:0 to cuda:1\)"
    ):
        pick_device("cuda:2")
    assert pick_device("cuda", local_rank=1) == pick_device("auto", local_rank=1) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"'cuda:1' asked for, but PyTorch sees 1 CUDA GPU here \(cuda:0\); use"):
        pick_device("cuda:1")
    # more processes than GPUs on a machine: the second rank's GPU is none, with --device cuda or auto alike
    for name in ("cuda", "auto"):
        with pytest.raises(ConfigError, match=r"LOCAL_RANK=1 takes GPU cuda:1, and PyTorch sees 1 CUDA GPU here"):
            pick_device(name, local_rank=1)


def test_a_long_out_name_is_written_or_refused_before_any_work(shared_run, tmp_path, capsys):
    # a name of 250 characters (the file system takes 255) failed after the work, on the temporary name made from
    # it; predict's sidecar (<out>.meta.json) failed the same way, leaving an empty predictions file
    from foodvit.files import write_text

    long, wide = tmp_path / ("m" * 250 + ".txt"), tmp_path / ("\U0001f600" * 62 + ".txt")  # 250 and 252 bytes
    write_text(long, "kept")
    write_text(wide, "kept")
    assert long.read_text() == wide.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long.name, wide.name])
    run, photos = shared_run
    out = tmp_path / "labels" / ("p" * 248 + ".csv")
    assert main(["predict", str(run), str(photos / "test"), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("foodvit predict: error: --out's sidecar ") and err.endswith(
        "its name is 262 bytes long, and the file system takes 255 at most; choose a shorter name"
    )
    assert not out.exists()
    model = tmp_path / ("\U0001f600" * 62 + ".pt")  # TorchScript: the staging name of every format, seconds less
    assert main(["export", str(run), "--out", str(model), "--format", "torchscript"]) == 0
    # and no folder made for the refused predictions
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long.name, wide.name, model.name])
