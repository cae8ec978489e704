"""The file `foodvit predict --out` writes: a row per photo (CSV or JSONL, by its suffix), written
a batch at a time as complete lines (one write, flush and fsync), read back to skip the photos
already done, and named for its model by a sidecar `<out>.meta.json` (classes and a hash of the
weights), so that two models' predictions are never mixed in one file. No PyTorch here."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path

from foodvit.errors import RunError
from foodvit.files import write_text

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
    if out.suffix.lower() not in FORMATS:
        raise RunError(f"--out {out}: predictions are written as .csv or .jsonl (chosen by the suffix); "
                       f"use e.g. --out {out.with_suffix('.csv')}")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise RunError(f"cannot write {out.name} into {folder}: it is a file, not a folder; choose another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot create the folder {folder} for {out.name} ({err.strerror or err}); choose another --out") from None
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise RunError(f"cannot write {out} (read-only or not yours); choose another --out")
    return out


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def check_written_by(path: Path, identity: dict, top_k: int) -> bool:
    """Whether a predictions file already holds rows; a RunError if they are not this model's and
    this --top-k's (its sidecar meta says whose they are), so that two models' rows never mix."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    meta_file = meta_path(path)
    try:
        stored = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        raise RunError(f"{path} exists and was not written by foodvit predict (no readable {meta_file.name} beside it); "
                       "choose another --out, or delete it") from None
    if [stored.get("classes"), stored.get("sha256")] != [identity["classes"], identity["sha256"]]:
        raise RunError(f"{path} holds predictions of another model ({stored.get('model')}, weights sha256 "
                       f"{str(stored.get('sha256'))[:12]}...); choose another --out for {identity['model']}, or delete it to start over")
    if stored.get("top_k") != top_k:
        raise RunError(f"{path} was written with --top-k {stored.get('top_k')}; use the same --top-k to continue it, or another --out")
    return True


def complete_lines(path: Path) -> str:
    """The text of a file up to its last newline: a row cut short by a kill is not a row."""
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].decode("utf-8")


def read_done(path: Path) -> set[str]:
    """The paths of the complete rows of a predictions file (CSV or JSONL); set() if there is none."""
    if not path.exists():
        return set()
    text = complete_lines(path)
    if path.suffix.lower() == ".csv":
        rows = csv.reader(io.StringIO(text, newline=""))
        header = next(rows, None)
        if header is not None and tuple(header) != COLUMNS:
            raise RunError(f"{path} is not a foodvit predictions file (its header is not {','.join(COLUMNS)}); choose another --out")
        return {row[0] for row in rows if row}
    return {json.loads(line)["path"] for line in text.splitlines() if line}


class Predictions:
    """A predictions file opened for appending: one row a photo, CSV (a header, then COLUMNS;
    top_k as JSON text) or JSON Lines (an object a line, "error" only for a photo that could not
    be read). Opening it refuses a file of another model or --top-k (check_written_by), drops a
    partial last line (what a killed run may leave) and reads the paths already in it (done)."""

    def __init__(self, out: Path, identity: dict, top_k: int) -> None:
        self.path, self.csv = Path(out), Path(out).suffix.lower() == ".csv"
        if check_written_by(self.path, identity, top_k):
            keep = len(complete_lines(self.path).encode("utf-8"))
            if keep < self.path.stat().st_size:
                os.truncate(self.path, keep)
        else:
            write_text(meta_path(self.path), json.dumps({**identity, "top_k": top_k}, indent=1) + "\n")
        self.done = read_done(self.path)
        self.file = open(self.path, "ab")
        if self.file.tell() == 0 and self.csv:
            self._write(self._encode([dict(zip(COLUMNS, COLUMNS))]))

    def _encode(self, rows: list[dict]) -> bytes:
        if not self.csv:
            return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
        text = io.StringIO(newline="")
        writer = csv.writer(text, lineterminator="\n")
        for row in rows:
            top = row.get("top_k")
            writer.writerow([row["path"], row.get("label", ""), row.get("probability", ""),
                             json.dumps(top) if isinstance(top, list) else (top or ""), row.get("error", "")])
        return text.getvalue().encode("utf-8")

    def _write(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        os.fsync(self.file.fileno())  # on disk before the next batch starts: a crash loses at most the batch in flight

    def write(self, rows: list[dict]) -> None:
        """Append rows as complete lines, in one write."""
        if rows:
            self._write(self._encode(rows))

    def close(self) -> None:
        self.file.close()
