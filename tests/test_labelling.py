"""`foodvit predict RUN FOLDER --out predictions.csv`: a collection labelled in batches into CSV or
JSON Lines, resumable after a kill, refused when the file holds another model's rows."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import make_photo, run_without_torch

from foodvit.cli.main import main
from foodvit.deploy.predictor import Predictor


@pytest.fixture(scope="module")
def run(shared_run):
    """The suite's trained tiny run (the tests read it, never change it)."""
    return shared_run[0]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Photos in nested folders, with what a folder walk must leave out (hidden files and folders,
    files of other kinds) and one damaged photo, which must get an error row."""
    root = tmp_path_factory.mktemp("tree")
    for i, name in enumerate(["a/1.jpg", "a/b/2.png", "a/b/3.JPG", "c.jpeg", "z/4.webp"]):
        make_photo(root / name, (40 * i, 120, 200 - 30 * i), size=(20, 24), seed=i)
    make_photo(root / ".hidden.jpg", (1, 2, 3), size=(20, 24))
    make_photo(root / ".cache" / "5.jpg", (1, 2, 3), size=(20, 24))
    (root / "notes.txt").write_text("not a photo")
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return root


EXPECTED = [
    "a/1.jpg",
    "a/b/2.png",
    "a/b/3.JPG",
    "a/broken.jpg",
    "c.jpeg",
    "z/4.webp",
]  # sorted by path, as training lists


def read_rows(path):
    """The rows of a CSV or JSONL predictions file as dicts (top_k parsed, empty CSV cells left out)."""
    if str(path).endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines()]
    rows = []
    for row in csv.DictReader(io.StringIO(path.read_text(), newline="")):
        row = {k: v for k, v in row.items() if v != ""}
        if "probability" in row:
            row["probability"], row["top_k"] = float(row["probability"]), json.loads(row["top_k"])
        rows.append(row)
    return rows


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_folder_tree_is_labelled_row_by_row_as_classify_labels_each_photo(run, tree, tmp_path, suffix, capsys):
    out = tmp_path / f"predictions{suffix}"
    assert (
        main(
            [
                "predict",
                str(run),
                str(tree),
                "--out",
                str(out),
                "--batch-size",
                "4",
                "--workers",
                "2",
                "--top-k",
                "2",
                "--quiet",
            ]
        )
        == 1
    )  # a photo could not be read: reported, the rest labelled
    err = capsys.readouterr().err
    assert f"{out}: 5 photos labelled, 1 could not be read" in err and "Traceback" not in err
    rows = read_rows(out)
    assert [r["path"] for r in rows] == [str(tree / p) for p in EXPECTED]
    predictor = Predictor.open(run)
    for row in rows:
        if row["path"].endswith("broken.jpg"):
            assert set(row) == {"path", "error"} and row["error"].startswith(
                f"{tree / 'a' / 'broken.jpg'} is not an image"
            )
            continue
        alone = predictor.classify(row["path"], top_k=2)
        assert "error" not in row and row["label"] == alone["label"]
        assert row["probability"] == pytest.approx(alone["probability"], abs=1e-6)
        assert [label for label, _ in row["top_k"]] == [label for label, _ in alone["top_k"]]
        assert [p for _, p in row["top_k"]] == pytest.approx([p for _, p in alone["top_k"]], abs=1e-6)


def test_list_files_and_standard_input_name_photos_and_missing_ones_get_error_rows(
    run, tree, tmp_path, monkeypatch, capsys
):
    listed = tmp_path / "list.txt"
    listed.write_text(f"{tree / 'c.jpeg'}\n\n{tmp_path / 'missing.jpg'}\n{tree / 'a' / '1.jpg'}\n")
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(run), "--files-from", str(listed), "--out", str(out), "--quiet"]) == 1
    rows = read_rows(out)
    assert [r["path"] for r in rows] == [str(tree / "c.jpeg"), str(tmp_path / "missing.jpg"), str(tree / "a" / "1.jpg")]
    assert rows[1] == {"path": str(tmp_path / "missing.jpg"), "error": f"{tmp_path / 'missing.jpg'} does not exist"}
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{tree / 'z' / '4.webp'}\n"))
    # the new photo labelled; the file still holds the missing photo's error row, so the status is still 1
    assert main(["predict", str(run), "--files-from", "-", "--out", str(out), "--quiet"]) == 1
    assert [r["path"] for r in read_rows(out)][-1] == str(tree / "z" / "4.webp")
    capsys.readouterr()
    # without --out a folder is expanded too, and printed as a few photos always were
    assert main(["predict", str(run), str(tree / "a" / "b")]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        str(tree / "a/b/2.png"),
        str(tree / "a/b/3.JPG"),
    ]


def test_a_rerun_skips_what_is_done_and_drops_a_partial_last_row(run, tree, tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(tree / "a"), "--out", str(out), "--quiet"]) == 1
    whole = out.read_text()
    lines = whole.splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][:15])  # as a kill in the middle of the last write would leave it
    capsys.readouterr()
    assert (
        main(["predict", str(run), str(tree / "a"), "--out", str(out), "--quiet"]) == 1
    )  # the last photo is the damaged one
    assert (
        "0 photos labelled, 1 could not be read, 3 already there; 1 photo whose row is an error (--retry-errors "
        "reads them again)" in capsys.readouterr().err
    )
    assert out.read_text() == whole


def test_retry_errors_reads_again_the_photos_whose_row_is_an_error(run, tmp_path, capsys):
    """A photo that failed (still being copied) kept its error row for good: every later run skipped it as done
    and exited 1. With --retry-errors it gets a new row, the last a photo has being its answer."""
    import shutil

    photos = tmp_path / "photos"
    make_photo(photos / "good.jpg", (200, 40, 40), size=(20, 24))
    (photos / "late.jpg").write_bytes(b"\xff\xd8 half copied")
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(run), str(photos), "--out", str(out), "--quiet"]) == 1
    shutil.copy(photos / "good.jpg", photos / "late.jpg")  # the copy finishes
    assert main(["predict", str(run), str(photos), "--out", str(out), "--quiet"]) == 1  # skipped as done
    capsys.readouterr()
    assert main(["predict", str(run), str(photos), "--out", str(out), "--quiet", "--retry-errors"]) == 0
    assert "1 photos labelled, 0 could not be read, 1 already there; 0 photos whose row is an error" in (
        capsys.readouterr().err
    )
    rows = read_rows(out)
    assert [(os.path.basename(r["path"]), "error" in r) for r in rows] == [
        ("good.jpg", False),
        ("late.jpg", True),
        ("late.jpg", False),
    ]
    assert main(["predict", str(run), str(photos), "--out", str(out), "--quiet", "--retry-errors"]) == 0
    assert len(read_rows(out)) == 3  # nothing left to read again


def test_a_photo_is_known_by_where_it_is_not_by_how_its_path_was_spelt(run, tree, tmp_path, monkeypatch, capsys):
    """A re-run naming the same photos another way (./a, then the absolute path, then from inside the folder)
    labelled them all again; and one naming other photos by the same relative path, from another folder, skipped
    them as done."""
    out = tmp_path / "p.csv"
    monkeypatch.chdir(tree)
    assert main(["predict", str(run), "a", "--out", str(out), "--quiet"]) == 1  # a/broken.jpg
    first = read_rows(out)
    assert [r["path"] for r in first] == ["a/1.jpg", "a/b/2.png", "a/b/3.JPG", "a/broken.jpg"]  # as given
    for spelt in ("./a", str(tree / "a"), str(tree / "a" / ".." / "a" / "b")):
        capsys.readouterr()
        assert main(["predict", str(run), spelt, "--out", str(out), "--quiet"]) == 1
        assert "0 photos labelled, 0 could not be read" in capsys.readouterr().err
    monkeypatch.chdir(tree / "a")
    assert main(["predict", str(run), "1.jpg", "b", "--out", str(out), "--quiet"]) == 1  # the file's one error
    assert "0 photos labelled, 0 could not be read, 3 already there" in capsys.readouterr().err
    other = tmp_path / "elsewhere" / "a"
    make_photo(other / "1.jpg", (9, 9, 9), size=(20, 24))
    monkeypatch.chdir(other.parent)
    assert main(["predict", str(run), "a/1.jpg", "--out", str(out), "--quiet"]) == 1
    assert "1 photos labelled, 0 could not be read, 0 already there" in capsys.readouterr().err
    rows = read_rows(out)
    assert rows[:4] == first and [r["path"] for r in rows[4:]] == [str(other / "1.jpg")]  # another folder's: absolute
    monkeypatch.chdir(tree)
    capsys.readouterr()
    assert main(["predict", str(run), str(other / "1.jpg"), "a", "--out", str(out), "--quiet"]) == 1
    assert "0 photos labelled, 0 could not be read, 5 already there" in capsys.readouterr().err
    # an address is kept as given, from any folder (it was made a path: <folder>/https:/example.org/x.jpg)
    monkeypatch.chdir(other)
    assert main(["predict", str(run), "https://example.org/x.jpg", "--out", str(out), "--quiet"]) == 1
    assert read_rows(out)[-1]["path"] == "https://example.org/x.jpg"


def test_a_predictions_file_moved_with_its_photos_goes_on_where_it_stopped(run, tmp_path, monkeypatch, capsys):
    """The sidecar kept the working folder as an absolute path: a project moved or mounted elsewhere, file and
    photos together, labelled every photo again on the same command."""
    project = tmp_path / "project"
    make_photo(project / "imgs" / "a.jpg", (200, 40, 40), size=(20, 24))
    monkeypatch.chdir(project)
    assert main(["predict", str(run), "imgs", "--out", "out/p.csv", "--quiet"]) == 0
    project.rename(tmp_path / "moved")
    make_photo(tmp_path / "moved" / "imgs" / "b.jpg", (40, 200, 40), size=(20, 24))
    monkeypatch.chdir(tmp_path / "moved")
    capsys.readouterr()
    assert main(["predict", str(run), "imgs", "--out", "out/p.csv", "--quiet"]) == 0
    assert "1 photos labelled, 0 could not be read, 1 already there" in capsys.readouterr().err
    assert [r["path"] for r in read_rows(tmp_path / "moved" / "out" / "p.csv")] == ["imgs/a.jpg", "imgs/b.jpg"]


def test_a_predictions_file_moved_alone_or_named_through_a_link_goes_on(run, tmp_path, monkeypatch, capsys):
    """A sidecar that kept only the way from the file to its folder lost the photos when the file moved on its own
    to another depth, or when --out was named through a symbolic link one time and not the next."""
    import shutil

    project = tmp_path / "real" / "project"
    make_photo(project / "a.jpg", (200, 40, 40), size=(20, 24))
    (tmp_path / "alias").symlink_to(project)
    monkeypatch.chdir(project)
    assert main(["predict", str(run), "a.jpg", "--out", str(tmp_path / "alias" / "out" / "p.jsonl"), "--quiet"]) == 0
    for out in ("out/p.jsonl", str(tmp_path / "alias" / "out" / "p.jsonl")):
        capsys.readouterr()
        assert main(["predict", str(run), "a.jpg", "--out", out, "--quiet"]) == 0
        assert "0 photos labelled, 0 could not be read, 1 already there" in capsys.readouterr().err
    archive = tmp_path / "archive" / "2026"
    archive.mkdir(parents=True)
    for name in ("p.jsonl", "p.jsonl.meta.json"):
        shutil.move(project / "out" / name, archive / name)
    capsys.readouterr()
    assert main(["predict", str(run), "a.jpg", "--out", str(archive / "p.jsonl"), "--quiet"]) == 0
    assert "0 photos labelled, 0 could not be read, 1 already there" in capsys.readouterr().err


def test_two_runs_writing_one_out_file_at_once_are_refused_not_doubled(run, tree, tmp_path, capsys):
    """Two `predict --out` on one file at once each labelled every photo: every row twice."""
    import fcntl

    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(tree / "c.jpeg"), "--out", str(out), "--quiet"]) == 0
    before = out.read_bytes()
    with open(out, "ab") as other:  # as a second foodvit predict holds it while it writes
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        capsys.readouterr()
        assert main(["predict", str(run), str(tree / "a"), "--out", str(out), "--quiet"]) == 2
        assert f"another foodvit predict is writing {out} now; wait for it to finish" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["predict", str(run), str(tree / "a"), "--out", str(out), "--quiet"]) == 1  # free again: goes on


def test_an_out_file_of_another_model_or_top_k_is_refused_not_mixed(run, tree, tmp_path, capsys):
    import shutil

    from foodvit.rundir.trained import save_model

    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(tree / "c.jpeg"), "--out", str(out), "--quiet"]) == 0
    before = out.read_text()
    other = tmp_path / "other"
    shutil.copytree(run, other)
    predictor = Predictor.from_run(run)
    with __import__("torch").no_grad():
        next(predictor.model.parameters()).add_(0.5)  # the same architecture and classes, other weights
    save_model(other, predictor.model, predictor.classes, predictor.preprocess)
    capsys.readouterr()
    assert main(["predict", str(other), str(tree / "z"), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"foodvit predict: error: {out} holds predictions of another model ({run}, weights sha256" in err
    assert err.count("\n") == 1
    assert main(["predict", str(run), str(tree / "z"), "--out", str(out), "--top-k", "1", "--quiet"]) == 2
    assert f"{out} was written with --top-k 3; use the same --top-k" in capsys.readouterr().err
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("name,score\nx,1\n")
    assert main(["predict", str(run), str(tree / "z"), "--out", str(foreign), "--quiet"]) == 2
    assert f"{foreign} exists and was not written by foodvit predict" in capsys.readouterr().err
    (tmp_path / "foreign.csv.meta.json").write_text("[1, 2]")  # JSON, but not the object predict writes
    assert main(["predict", str(run), str(tree / "z"), "--out", str(foreign), "--quiet"]) == 2
    assert f"{foreign} exists and was not written by foodvit predict" in capsys.readouterr().err
    assert out.read_text() == before and foreign.read_text() == "name,score\nx,1\n"


@pytest.mark.slow  # a second process that imports PyTorch: several seconds
def test_a_run_killed_mid_way_and_run_again_labels_every_photo_exactly_once(run, tmp_path):
    photos = tmp_path / "many"
    for i in range(240):
        make_photo(photos / f"{i // 60}" / f"{i:03d}.png", (i, 100, 200), size=(8, 8), seed=i, fmt="PNG")
    out = tmp_path / "p.csv"
    argv = ["predict", str(run), str(photos), "--out", str(out), "--batch-size", "4", "--workers", "1", "--quiet"]
    # each forward pass slowed down, so that the kill lands in the middle of the run whatever the machine
    script = (
        "import sys, time\n"
        "from foodvit.deploy.predictor import Predictor\n"
        "forward = Predictor.probabilities\n"
        "Predictor.probabilities = lambda self, batch: (time.sleep(0.03), forward(self, batch))[1]\n"
        "from foodvit.cli.main import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline and child.poll() is None and (not out.exists() or out.read_text().count("\n") < 60)
    ):
        time.sleep(0.02)
    assert child.poll() is None, f"the run ended before it was killed: {child.stderr.read().decode()[-2000:]}"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stderr.close()
    killed = out.read_bytes()
    assert 60 <= killed.count(b"\n") < 241 and killed.endswith(b"\n")  # whole lines only: one write a batch
    assert main(argv) == 0
    paths = [r["path"] for r in read_rows(out)]
    assert paths[: killed.count(b"\n") - 1] == [r["path"] for r in read_rows_bytes(killed)]
    assert sorted(paths) == sorted(str(p) for p in photos.rglob("*.png")) and len(set(paths)) == 240


def assert_same_rows(got, expected, tolerance):
    """The same photos in the same order with the same labels and errors, probabilities within tolerance
    (a photo's logits differ in the last bits with the batch it was in)."""
    assert [r["path"] for r in got] == [r["path"] for r in expected]
    for a, b in zip(got, expected, strict=True):
        assert set(a) == set(b) and a.get("label") == b.get("label") and a.get("error") == b.get("error")
        assert [label for label, _ in a.get("top_k", [])] == [label for label, _ in b.get("top_k", [])]
        assert [a.get("probability", 0)] + [p for _, p in a.get("top_k", [])] == pytest.approx(
            [b.get("probability", 0)] + [p for _, p in b.get("top_k", [])], abs=tolerance
        )


def read_rows_bytes(data: bytes):
    return list(csv.DictReader(io.StringIO(data.decode(), newline="")))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        (["--batch-size", "nan"], "argument --batch-size: expected a whole number, got 'nan'"),
        (["--workers", "-1"], "argument --workers: must be >= 0, got -1"),
        (["--dist-timeout", "nan"], "argument --dist-timeout: must be > 0, got nan"),
    ],
)
def test_bad_options_are_one_line(run, tree, tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(run), str(tree), "--out", str(tmp_path / "p.csv"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "p.csv").exists()


def test_bad_inputs_and_outputs_are_one_line_and_write_nothing(run, tree, tmp_path, capsys):
    empty = tmp_path / "empty"
    make_photo(empty / ".hidden" / "1.jpg", (1, 2, 3), size=(8, 8))
    (empty / "readme.txt").parent.mkdir(exist_ok=True)
    (empty / "readme.txt").write_text("x")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = str(tmp_path / "p.csv")
    for argv, message in [
        ([str(empty), "--out", out], f"{empty} holds no photos (files named .jpg"),
        ([str(empty)], f"{empty} holds no photos"),
        (
            ["--files-from", str(tmp_path / "nope.txt"), "--out", out],
            f"the list file {tmp_path / 'nope.txt'} does not exist",
        ),
        (["--out", out], "no photos given; name photo files or folders, or a list file with --files-from"),
        (
            [str(tree), "--out", str(blocker / "p.csv")],
            f"cannot write p.csv into {blocker}: it is a file, not a folder",
        ),
        ([str(tree), "--out", str(tmp_path / "p.txt")], "predictions are written as .csv or .jsonl"),
        ([str(tree), "--out", str(tmp_path)], f"--out {tmp_path} is a folder"),
        ([str(tree), "--out", out, "--json"], "--json is for a few photos"),
    ]:
        assert main(["predict", str(run), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("foodvit predict: error: ") and message in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.txt").exists()


@pytest.fixture(scope="module")
def onnx_file(request):
    """`foodvit export` of the run: the suite's shared export of it."""
    pytest.importorskip("onnxruntime", reason="the .onnx test needs the export extra: pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="the .onnx test needs the export extra: pip install -e '.[export]'")
    return request.getfixturevalue("shared_onnx")  # exported only once the extra is known to be there


@pytest.mark.slow  # a second Python, without torch
def test_an_onnx_file_labels_a_folder_without_torch_and_gives_the_runs_rows(run, onnx_file, tree, tmp_path):
    out, reference = tmp_path / "onnx.jsonl", tmp_path / "run.jsonl"
    result = run_without_torch(["predict", onnx_file, tree, "--out", out, "--workers", "2", "--quiet"])
    assert result.returncode == 1, result.stderr  # the damaged photo: an error row, the others labelled
    assert main(["predict", str(run), str(tree), "--out", str(reference), "--quiet"]) == 1
    assert [r["path"] for r in read_rows(out)] == [str(tree / p) for p in EXPECTED]
    assert_same_rows(read_rows(out), read_rows(reference), 1e-5)
    assert json.loads((tmp_path / "onnx.jsonl.meta.json").read_text())["model"] == str(onnx_file)


@pytest.mark.slow  # torchrun and two processes that import PyTorch
def test_two_processes_under_torchrun_write_the_rows_of_one(run, tree, tmp_path):
    one, two = tmp_path / "one.csv", tmp_path / "two.csv"
    assert main(["predict", str(run), str(tree), "--out", str(one), "--quiet"]) == 1  # the damaged photo
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "foodvit",
        "predict",
        str(run),
        str(tree),
        "--out",
        str(two),
        "--batch-size",
        "2",
        "--quiet",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 1 and f"{two}: 5 photos labelled, 1 could not be read" in done.stderr, done.stderr[-3000:]
    assert [r["path"] for r in read_rows(two)] == [str(tree / p) for p in EXPECTED]  # the input's order
    assert_same_rows(read_rows(two), read_rows(one), 1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "one.csv",
        "one.csv.meta.json",
        "two.csv",
        "two.csv.meta.json",
    ]  # parts merged and gone


def test_the_parts_of_an_interrupted_many_process_run_are_merged_not_labelled_again(run, tree, tmp_path):
    import threading

    from foodvit.deploy.labelling import PhotoList, label, label_share, part_path
    from foodvit.deploy.predictions import Predictions, model_identity

    predictor = Predictor.open(run)
    identity = model_identity(run, predictor.classes)
    one = Predictions(tmp_path / "one.jsonl", identity, 3)
    label(predictor, PhotoList([tree]), one, workers=0, quiet=True)
    one.close()
    out = tmp_path / "two.jsonl"
    # an earlier run on 3 processes was killed after rank 2 wrote its share (photos 2 and 5) and a partial row
    stale = Predictions(part_path(out, 2, 3), identity, 3)
    stale.write([{"index": i, **row} for i, row in enumerate(read_rows(tmp_path / "one.jsonl")) if i % 3 == 2])
    stale.file.write(b'{"index": 8, "pa')
    stale.close()
    calls = []
    forward = predictor.probabilities
    predictor.probabilities = lambda batch: calls.append(len(batch)) or forward(batch)
    results = {}

    def rank(r):
        results[r] = label_share(
            predictor,
            PhotoList([tree]),
            out,
            identity,
            rank=r,
            world=2,
            batch_size=2,
            workers=1,
            quiet=True,
            timeout=60,
        )

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(calls) == 3  # of the 6 photos: 2 were in the stale part, 1 cannot be read
    assert (results[0].written, results[0].failed, results[0].skipped) == (5, 1, 0)
    assert_same_rows(read_rows(out), read_rows(tmp_path / "one.jsonl"), 1e-6)  # in the input's order, each photo once
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "one.jsonl",
        "one.jsonl.meta.json",
        "two.jsonl",
        "two.jsonl.meta.json",
    ]


def test_rank_0_times_every_ranks_photos_up_to_the_merge(run, tree, tmp_path):
    """Rank 0 reports all ranks' photos: its seconds run until the last of them is merged, not only
    over its own share (the photos/s printed under torchrun was twice the truth on 2 processes)."""
    import threading

    from foodvit.deploy.labelling import PhotoList, label_share
    from foodvit.deploy.predictions import model_identity

    predictor = Predictor.open(run)
    identity = model_identity(run, predictor.classes)
    out, results = tmp_path / "p.jsonl", {}

    def rank(r, delay):
        time.sleep(delay)  # rank 1 starts late: rank 0 waits for its rows
        results[r] = label_share(
            predictor, PhotoList([tree]), out, identity, rank=r, world=2, workers=0, quiet=True, timeout=60
        )

    threads = [threading.Thread(target=rank, args=(1, 1.5)), threading.Thread(target=rank, args=(0, 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (results[0].written, results[0].failed) == (5, 1)
    assert results[0].seconds >= 1.5 > results[1].seconds


def test_ctrl_c_says_the_finished_batches_are_kept_and_how_to_go_on(run, tree, tmp_path, monkeypatch, capsys):
    import foodvit.deploy.labelling as labelling

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(labelling, "label", interrupted)
    out = tmp_path / "p.csv"
    assert main(["predict", str(run), str(tree), "--out", str(out), "--quiet"]) == 130
    assert capsys.readouterr().err == (
        f"\ninterrupted: every finished batch is kept in {out}; run the same command again to label the rest\n"
    )


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_name_that_is_not_utf8_is_labelled_and_skipped_on_a_rerun(run, tmp_path, suffix, capsys):
    folder = tmp_path / "photos"
    make_photo(folder / "a.jpg", (200, 40, 40), size=(20, 24))
    odd = os.path.join(os.fsencode(folder), b"caf\xe9.jpg")  # Latin-1 bytes: no UTF-8 name
    os.rename(os.fsencode(folder / "a.jpg"), odd)
    make_photo(folder / "b.jpg", (40, 200, 40), size=(20, 24))
    out = tmp_path / f"predictions{suffix}"
    assert main(["predict", str(run), str(folder), "--out", str(out), "--quiet"]) == 0
    assert main(["predict", str(run), str(folder), "--out", str(out), "--quiet"]) == 0  # nothing left to label
    lines = out.read_bytes().splitlines()
    assert len(lines) == 2 + (suffix == ".csv")  # a row each (and the CSV's header), none added by the re-run
    assert any(b"caf\xe9.jpg" in line or b"caf\\udce9.jpg" in line for line in lines)


@pytest.mark.parametrize("out", [None, "labels.csv"])
def test_a_link_to_itself_or_to_nothing_in_a_folder_is_that_photos_error_and_the_rest_is_labelled(
    shared_run, tmp_path, capsys, out
):
    folder = tmp_path / "photos"
    for i, name in enumerate(["a.jpg", "z.jpg"]):
        make_photo(folder / name, (60 * i, 120, 200), size=(20, 24), seed=i)
    (folder / "loop.jpg").symlink_to("loop.jpg")  # "Too many levels of symbolic links" had stopped the whole command
    (folder / "gone.jpg").symlink_to("deleted.jpg")  # had been left out without a word
    argv = ["predict", str(shared_run[0]), str(folder)]
    assert main(argv + (["--out", str(tmp_path / out), "--quiet"] if out else [])) == 1
    captured = capsys.readouterr()
    if out:
        rows = {row["path"]: row for row in read_rows(tmp_path / out)}
    else:
        rows = {line.split(":")[0]: {"label": line} for line in captured.out.splitlines()}
        rows |= {line.split(" ")[3]: {"error": line.split(" ", 3)[3]} for line in captured.err.splitlines()}
    assert sorted(rows) == [str(folder / n) for n in ("a.jpg", "gone.jpg", "loop.jpg", "z.jpg")], captured
    assert "label" in rows[str(folder / "a.jpg")] and "label" in rows[str(folder / "z.jpg")]
    gone, loop = rows[str(folder / "gone.jpg")]["error"], rows[str(folder / "loop.jpg")]["error"]
    assert gone == f"{folder / 'gone.jpg'} is a symbolic link to deleted.jpg, which does not exist"
    assert loop.startswith(f"{folder / 'loop.jpg'} is a symbolic link that leads back to itself")
    assert "Traceback" not in captured.err
