"""The file `foodvit predict --out` writes: a row per photo (CSV or JSONL, by its suffix), written
a batch at a time as complete lines (one write, flush and fsync), read back to skip the photos
already done, and named for its model by a sidecar `<out>.meta.json` (classes and a hash of the
weights), so that two models' predictions are never mixed in one file. The sidecar also keeps the
working folder the file was started in, and the way there from the file's own folder (a project
moved or mounted elsewhere, file and photos together, goes on): a row's path is kept as it was
given, and a photo is known by that path made absolute against that folder (photo_key), so
`imgs/a.jpg`, `./imgs/a.jpg` and `/home/me/imgs/a.jpg` are one photo, and `a.jpg` given in two
folders is two. No PyTorch here."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from pathlib import Path

from foodvit.errors import RunError
from foodvit.files import address_scheme, check_name_length, parse_json, read_json, write_text

COLUMNS = ("path", "label", "probability", "top_k", "error")
FORMATS = (".csv", ".jsonl")


def model_identity(where: str | os.PathLike, classes) -> dict:
    """What makes two runs of `predict` the same model: its classes and the SHA-256 of its weights
    file (a run directory's model.safetensors, or the .onnx / .safetensors file itself)."""
    where = Path(where)
    weights = where / "model.safetensors" if where.is_dir() else where
    digest = hashlib.sha256()
    with open(weights, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return {"model": str(where), "classes": list(classes), "sha256": digest.hexdigest()}


def check_out(out: str | os.PathLike) -> Path:
    """The --out path if it can be written as predictions (.csv or .jsonl, a file, in a folder that
    can be written), else a RunError that says what to do; checked before the model is opened."""
    out = Path(out)
    if out.is_dir():
        raise RunError(f"--out {out} is a folder; give a file name, e.g. {out / 'predictions.csv'}")
    for path in (out, meta_path(out)):
        if path.is_symlink() or path.exists():
            try:
                regular = stat.S_ISREG(path.stat().st_mode)
            except OSError:  # a link to nowhere
                regular = False
            if not regular:
                raise RunError(
                    f"{path} is not a regular file (a device, a pipe, or a link to one or to nowhere); "
                    "predictions are written to a regular file or a new path: choose another --out"
                )
    if out.suffix.lower() not in FORMATS:
        raise RunError(
            f"--out {out}: predictions are written as .csv or .jsonl (chosen by the suffix); "
            f"use e.g. --out {out.with_suffix('.csv')}"
        )
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise RunError(f"cannot write {out.name} into {folder}: it is a file, not a folder; choose another --out")
    check_name_length(meta_path(out), "--out's sidecar")  # the longer of the two names written
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(
            f"cannot create the folder {folder} for {out.name} ({err.strerror or err}); choose another --out"
        ) from None
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise RunError(f"cannot write {out} (read-only or not yours); choose another --out")
    return out


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def photo_key(path: str, folder: str) -> str:
    """What names one photo however it was spelt: its path made absolute against the working folder it was given
    in, and normalised (no file system call: a link is not followed); an address (https://...) as it is."""
    if address_scheme(path):
        return path
    return os.path.normpath(os.path.join(folder, path))


def folder_note(out: Path) -> dict[str, str]:
    """This process's working folder as the sidecar records it: the folder itself, and the way there from the
    predictions file's folder (links resolved, as the working folder is), or none where there is no way (another
    drive)."""
    here = os.getcwd()
    try:
        return {"folder": here, "folder_from_file": os.path.relpath(here, os.path.realpath(out.parent))}
    except ValueError:
        return {"folder": here}


def started_in(path: Path) -> str:
    """The working folder a predictions file's relative paths are relative to, as its sidecar records it: the folder
    itself while it is there (the file may have moved on its own), else the way there from the file's folder (file
    and photos moved or mounted elsewhere together); this process's for a file whose sidecar records neither
    (written by an earlier version)."""
    try:
        note = read_json(meta_path(path))
        folder, way = note.get("folder"), note.get("folder_from_file")
    except (OSError, ValueError, AttributeError):
        folder = way = None
    if isinstance(folder, str) and os.path.isabs(folder) and os.path.isdir(folder):
        return folder
    if isinstance(way, str) and way:
        return os.path.normpath(os.path.join(os.path.realpath(path.parent), way))
    return os.getcwd()


def check_written_by(path: Path, identity: dict, top_k: int) -> bool:
    """Whether a predictions file already holds rows; a RunError if they are not this model's and
    this --top-k's (its sidecar meta says whose they are), so that two models' rows never mix."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    meta_file = meta_path(path)
    try:
        stored = read_json(meta_file)
        if not isinstance(stored, dict):
            raise ValueError("not the JSON object foodvit predict writes")
    except (OSError, ValueError):
        raise RunError(
            f"{path} exists and was not written by foodvit predict (no readable {meta_file.name} beside it); "
            "choose another --out, or delete it"
        ) from None
    if [stored.get("classes"), stored.get("sha256")] != [identity["classes"], identity["sha256"]]:
        raise RunError(
            f"{path} holds predictions of another model ({stored.get('model')}, weights sha256 "
            f"{str(stored.get('sha256'))[:12]}...); choose another --out for {identity['model']}, or delete it to "
            "start over"
        )
    if stored.get("top_k") != top_k:
        raise RunError(
            f"{path} was written with --top-k {stored.get('top_k')}; use the same --top-k to continue it, or another "
            "--out"
        )
    return True


def complete_size(path: Path, block: int = 1 << 16, before: int | None = None) -> int:
    """The bytes of a file up to its last newline (before `before`), found from its end a block at a
    time: a row cut short by a kill is not a row, and only the tail is read to find it."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END) if before is None else before
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                return start + at + 1
            end = start
    return 0


class _Unfinished(Exception):
    """A CSV file ending inside a quoted field: a row (holding a newline) cut short by a kill."""


def complete_rows_size(path: Path) -> int:
    """The bytes of a predictions file up to the end of its last complete row: its last newline, or
    for a CSV file the newline before a row with a newline in its name that a kill cut short."""
    size = complete_size(path)
    while size > 0:
        try:
            read_rows(path, size)
            return size
        except _Unfinished:
            size = complete_size(path, before=size - 1)
    return size


def read_rows(path: Path, size: int | None = None) -> tuple[set[str], set[str]]:
    """The photos (photo_key) of the complete rows of a predictions file (CSV or JSONL; its first
    `size` bytes, default: up to its last newline), and of those among them whose last row is an
    error; read a row at a time (a file's rows, never the file, in memory at once)."""
    done: set[str] = set()
    failed: set[str] = set()
    if not path.exists():
        return done, failed
    folder = started_in(path)
    size = complete_size(path) if size is None else size
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(  # a name that is not UTF-8 is kept as its bytes (surrogateescape), as written;
            # a byte-order mark before the header (a spreadsheet's "CSV UTF-8") is read past
            io.BufferedReader(_Bounded(raw, size)),
            encoding="utf-8-sig",
            errors="surrogateescape",
            newline="",
        )
        try:
            if path.suffix.lower() == ".csv":
                rows = csv.reader(text, strict=True)
                header = next(rows, None)
                if header is not None and tuple(header) != COLUMNS:
                    raise RunError(
                        f"{path} is not a foodvit predictions file (its header is not {','.join(COLUMNS)}); "
                        "choose another --out"
                    )
                for row in rows:
                    if row:
                        key = photo_key(row[0], folder)
                        done.add(key)
                        if len(row) >= len(COLUMNS) and row[COLUMNS.index("error")]:
                            failed.add(key)
                        else:  # a photo read again (--retry-errors): its last row is its answer
                            failed.discard(key)
            else:
                for line in text:
                    if line.strip():
                        row = parse_json(line)
                        key = photo_key(row["path"], folder)
                        done.add(key)
                        if row.get("error"):
                            failed.add(key)
                        else:
                            failed.discard(key)
        except csv.Error as err:
            if "unexpected end of data" in str(err):
                raise _Unfinished from None
            raise RunError(
                f"{path} is not a foodvit predictions file (CSV: {err}); choose another --out, or delete it"
            ) from None
        except RunError:  # the header's refusal above, as it is (a RunError is a ValueError too)
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise RunError(
                f"{path} is not a foodvit predictions file ({type(err).__name__}: {str(err)[:100]}); "
                "choose another --out, or delete it"
            ) from None
    return done, failed


def read_done(path: Path) -> set[str]:
    """The photos (photo_key) of the complete rows of a predictions file (CSV or JSONL); set() if there is none."""
    return read_rows(path, complete_rows_size(path))[0] if path.exists() else set()


class _Bounded(io.RawIOBase):
    """The first `size` bytes of a binary file, as a raw stream."""

    def __init__(self, raw, size: int) -> None:
        self.raw, self.left = raw, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(memoryview(buffer)[: min(len(buffer), self.left)])
        self.left -= n
        return n


def _lock(file, path: Path) -> None:
    """An exclusive lock on the open predictions file (flock: the OS drops it when the process ends, however it
    ends), or a RunError if another process holds it. Where there is no flock (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:
        return
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise RunError(
            f"another foodvit predict is writing {path} now; wait for it to finish (then run this again to "
            "continue), or choose another --out"
        ) from None


class Predictions:
    """A predictions file opened for appending: one row a photo, CSV (a header, then COLUMNS;
    top_k as JSON text) or JSON Lines (an object a line, "error" only for a photo that could not
    be read). Opening it refuses a file of another model or --top-k (check_written_by), drops a
    partial last line (what a killed run may leave) and reads the photos already in it (done, by
    photo_key). A relative path given in another working folder than the file's is written absolute,
    so that every row reads against the one folder its sidecar records."""

    def __init__(self, out: Path, identity: dict, top_k: int, retry_errors: bool = False) -> None:
        self.path, self.csv = Path(out), Path(out).suffix.lower() == ".csv"
        written = check_written_by(self.path, identity, top_k)
        self.file = open(self.path, "ab")
        _lock(self.file, self.path)  # one writer a file: two runs appending would each label every photo
        if written:
            keep = complete_rows_size(self.path)
            if keep < self.path.stat().st_size:
                os.truncate(self.path, keep)
        else:
            meta = {**identity, "top_k": top_k, **folder_note(self.path)}
            write_text(meta_path(self.path), json.dumps(meta, indent=1) + "\n")
        self.folder = started_in(self.path)
        self.done, self.failed = read_rows(
            self.path, self.path.stat().st_size
        )  # failed: photos whose last row is an error, written by an earlier run
        if retry_errors:
            self.done -= self.failed  # read again: a later row, right or not, is the photo's answer
        if os.fstat(self.file.fileno()).st_size == 0 and self.csv:  # new, or a header cut short and dropped above
            self._write(self._encode([dict(zip(COLUMNS, COLUMNS, strict=False))]))

    def _encode(self, rows: list[dict]) -> bytes:
        if not self.csv:
            return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
        text = io.StringIO(newline="")
        # QUOTE_MINIMAL quotes a field with "\n" (the line terminator) but not one with a lone "\r", which a
        # reader splits a row at: a row holding one is quoted whole
        writer, quoted = (
            csv.writer(text, lineterminator="\n"),
            csv.writer(text, lineterminator="\n", quoting=csv.QUOTE_ALL),
        )
        for row in rows:
            top = row.get("top_k")
            fields = [
                row["path"],
                row.get("label", ""),
                row.get("probability", ""),
                json.dumps(top) if isinstance(top, list) else (top or ""),
                row.get("error", ""),
            ]
            (quoted if any("\r" in str(f) for f in fields) else writer).writerow(fields)
        return text.getvalue().encode(
            "utf-8", errors="surrogateescape"
        )  # a name's own bytes, as the file system has them

    def _write(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        os.fsync(self.file.fileno())  # on disk before the next batch starts: a crash loses at most the batch in flight

    def write(self, rows: list[dict], folder: str | None = None) -> None:
        """Append rows as complete lines, in one write; `folder`: the working folder their paths were
        given in (default this process's)."""
        folder = os.getcwd() if folder is None else folder
        if folder != self.folder:
            rows = [{**row, "path": photo_key(row["path"], folder)} for row in rows]
        if rows:
            self._write(self._encode(rows))

    def close(self) -> None:
        self.file.close()
