"""`foodvit predict --out`: only a regular file (or a new path) is an output; names with a carriage
return or a newline are rows like any other, read back as one; --files-from splits on newlines
only and --files-from0 on NULs; a re-run exits 1 while the file still holds error rows."""

import csv
import os
import shutil
from pathlib import Path

import pytest
from helpers import make_photo

from foodvit.cli.main import main


def one_line(capsys, command: str = "predict") -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"foodvit {command}: error: ") and "Traceback" not in err, err
    return err


@pytest.fixture
def odd_names(tmp_path) -> Path:
    folder = tmp_path / "odd"
    for i, name in enumerate(["plain.jpg", "carriage\rreturn.jpg", "new\nline.jpg", 'comma, "quoted".jpg']):
        make_photo(folder / name, (200, 40 * i, 60), seed=i)
    return folder


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null", "fifo", "folder-link"])
def test_an_out_that_is_no_regular_file_is_refused(shared_run, tmp_path, capsys, target):
    run, photos = shared_run
    out = tmp_path / "out.csv"
    if target == "fifo":
        os.mkfifo(out)
    elif target == "folder-link":
        out.symlink_to(tmp_path)
    else:
        out.symlink_to(target)
    assert main(["predict", str(run), str(photos / "test"), "--out", str(out), "--quiet"]) == 2
    err = one_line(capsys)
    assert "regular file" in err or "is a folder" in err


def test_names_with_carriage_returns_and_newlines_are_one_row_each_and_a_rerun_adds_none(
    shared_run, odd_names, tmp_path, capsys
):
    run, _ = shared_run
    out = tmp_path / "labels.csv"
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(Path(r["path"]).name for r in rows) == sorted(p.name for p in odd_names.iterdir())
    assert all(r["label"] and not r["error"] for r in rows)
    first = out.read_bytes()
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    assert out.read_bytes() == first  # nothing labelled again, nothing appended
    assert "0 photos labelled" in capsys.readouterr().err


def test_files_from_splits_on_newlines_only_and_files_from0_on_nuls(shared_run, odd_names, tmp_path, capsys):
    run, _ = shared_run
    carriage = odd_names / "carriage\rreturn.jpg"
    listed = tmp_path / "list.txt"
    listed.write_bytes(  # a CRLF line too, and a byte-order mark (Notepad's; its first photo "did not exist")
        b"\xef\xbb\xbf" + os.fsencode(carriage) + b"\n" + os.fsencode(odd_names / "plain.jpg") + b"\r\n"
    )
    out = tmp_path / "a.jsonl"
    assert main(["predict", str(run), "--files-from", str(listed), "--out", str(out), "--quiet"]) == 0
    import json

    assert [json.loads(line)["path"] for line in out.read_text().splitlines()] == [
        str(carriage),
        str(odd_names / "plain.jpg"),
    ]
    nul = tmp_path / "list0"
    newline = odd_names / "new\nline.jpg"
    nul.write_bytes(os.fsencode(newline) + b"\0" + os.fsencode(carriage) + b"\0")
    out0 = tmp_path / "b.jsonl"
    assert main(["predict", str(run), "--files-from0", str(nul), "--out", str(out0), "--quiet"]) == 0
    assert [json.loads(line)["path"] for line in out0.read_text().splitlines()] == [str(newline), str(carriage)]
    capsys.readouterr()
    assert main(["predict", str(run), "--files-from", str(listed), "--files-from0", str(nul), "--out", str(out0)]) == 2
    assert "--files-from0" in one_line(capsys)


def test_a_rerun_exits_1_while_the_file_still_holds_error_rows(shared_run, tmp_path, capsys):
    run, photos = shared_run
    folder = tmp_path / "some"
    shutil.copytree(photos / "test" / "pizza", folder)
    (folder / "broken.jpg").write_bytes(b"not a photo")
    out = tmp_path / "labels.csv"
    assert main(["predict", str(run), str(folder), "--out", str(out), "--quiet"]) == 1
    assert main(["predict", str(run), str(folder), "--out", str(out), "--quiet"]) == 1
    assert "1 photo whose row is an error" in capsys.readouterr().err.splitlines()[-1]
    (folder / "broken.jpg").unlink()
    out.write_text("".join(line for line in out.read_text().splitlines(keepends=True) if "broken.jpg" not in line))
    assert main(["predict", str(run), str(folder), "--out", str(out), "--quiet"]) == 0


def test_a_list_file_that_is_a_folder_is_one_line(shared_run, tmp_path, capsys):
    run, photos = shared_run
    for option in ("--files-from", "--files-from0"):
        assert main(["predict", str(run), option, str(photos), "--out", str(tmp_path / "x.csv")]) == 2
        assert "is a folder" in one_line(capsys)


def test_a_row_with_a_newline_cut_short_by_a_kill_is_dropped_and_labelled_again(shared_run, odd_names, tmp_path):
    run, _ = shared_run
    out = tmp_path / "labels.csv"
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    whole = out.read_bytes()
    cut = whole.index(b'"' + os.fsencode(odd_names / "new\nline.jpg")[:-4])  # the row of the name with a newline, cut
    rest = [line for line in whole[:cut].split(b"\n") if line]
    out.write_bytes(
        b"\n".join(rest) + b"\n" + whole[cut : cut + len(str(odd_names)) + 6]
    )  # ... up to just after its newline
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(Path(r["path"]).name for r in rows) == sorted(p.name for p in odd_names.iterdir())  # each once


def test_a_csv_whose_header_was_cut_short_gets_its_header_again(shared_run, odd_names, tmp_path, capsys):
    # the partial header was dropped but the file's append position was read before: every row went in without a
    # header, and every later run refused the file
    run, _ = shared_run
    out = tmp_path / "labels.csv"
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    whole = out.read_bytes()
    out.write_bytes(b"path,lab")  # a kill in the header's write
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    assert out.read_bytes() == whole
    # re-saved by a spreadsheet as "CSV UTF-8" (a byte-order mark before it): its rows are read, none labelled again
    out.write_bytes(b"\xef\xbb\xbf" + whole)
    capsys.readouterr()
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 0
    assert "0 photos labelled" in capsys.readouterr().err
    # a file that is no predictions file is refused in one sentence (it was wrapped in itself and cut mid-word)
    out.write_bytes(b"name,class\n")
    assert main(["predict", str(run), str(odd_names), "--out", str(out), "--quiet"]) == 2
    err = one_line(capsys)
    assert err == (
        f"foodvit predict: error: {out} is not a foodvit predictions file (its header is not "
        "path,label,probability,top_k,error); choose another --out"
    )


def test_a_world_size_left_in_the_environment_is_one_line_before_any_work(shared_run, tmp_path, capsys, monkeypatch):
    # a WORLD_SIZE left over from another session: half the photos labelled, then ten silent minutes waiting for
    # the other process, then advice to run the same command again
    run, photos = shared_run
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "labels.csv"
    assert main(["predict", str(run), str(photos / "test"), "--out", str(out), "--quiet"]) == 2
    err = one_line(capsys)
    assert "WORLD_SIZE=2 in the environment, but not MASTER_ADDR and MASTER_PORT" in err and "torchrun" in err
    assert list(tmp_path.iterdir()) == []
