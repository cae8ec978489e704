"""Labelling a whole collection of photos: `foodvit predict RUN FOLDER --out predictions.csv`.

Photos stream through in batches: listed lazily (folders walked in sorted order, a list file read
line by line), decoded in a pool of threads (Pillow releases the GIL while it decodes, so threads
serve both backends and the ONNX path never needs PyTorch's DataLoader), classified with one
forward pass per batch by the Predictor, and written a batch at a time as complete lines with one
write, flush and fsync. An interrupted run so loses at most the batch in flight, never leaves half
a row behind, and a re-run of the same command skips the photos already in the file. A sidecar
`<out>.meta.json` names the model (predictions.py, the file itself). No PyTorch here.
"""

from __future__ import annotations

import codecs
import collections
import glob
import heapq
import io
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foodvit.data.folders import walk_photos
from foodvit.data.photos import IMAGE_EXTENSIONS
from foodvit.deploy.inference import local_photo
from foodvit.deploy.predictions import Predictions, check_written_by, meta_path, photo_key, read_done, started_in
from foodvit.errors import DataError, RunError
from foodvit.files import parse_json
from foodvit.torchrun import DEFAULT_TIMEOUT_S

AHEAD = 2  # batches decoded ahead of the forward pass: enough to keep it busy, and memory stays a few batches


class PhotoList:
    """The photos to label, in a fixed order: each input in turn (a photo file as given, a folder's
    photos walked in sorted path order by data/folders.py's rules), then the lines of a list file
    ('-': standard input). Iterated lazily, as text paths; an input that does not exist stays in
    the list and gets an error row. A folder without photos, or a list file that cannot be read,
    is refused here, before any work. A list file holds a path a line (split at "\n" alone, a CRLF
    line's "\r" dropped), or with nul=True paths ended by NUL bytes (find -print0), for names that
    hold a newline; its bytes are taken as the file system's names (os.fsdecode)."""

    def __init__(
        self, inputs: Iterable[str | os.PathLike] = (), list_file: str | os.PathLike | None = None, *, nul: bool = False
    ) -> None:
        self.inputs = [str(i) for i in inputs]
        self.list_file, self.nul = None if list_file is None else str(list_file), nul
        for item in self.inputs:
            if Path(item).is_dir() and next(walk_photos(Path(item)), None) is None:
                raise DataError(
                    f"{item} holds no photos (files named {', '.join(IMAGE_EXTENSIONS)}, hidden ones left out); "
                    "give a folder of photos or photo files"
                )
        if self.list_file not in (None, "-") and Path(self.list_file).is_dir():
            raise DataError(
                f"the list file {self.list_file} is a folder; give a text file with one photo path a line, or name "
                "the folder itself (without --files-from) to label every photo in it"
            )
        if self.list_file not in (None, "-") and not os.access(self.list_file, os.R_OK):
            why = "does not exist" if not Path(self.list_file).exists() else "cannot be read"
            raise DataError(
                f"the list file {self.list_file} {why}; give a text file with one photo path a line (or - for "
                "standard input)"
            )
        if self.list_file not in (None, "-"):
            with open(self.list_file, "rb") as listed:
                head = listed.read(1 << 16)
                if not nul and head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                    raise DataError(  # PowerShell 5's `>` writes UTF-16
                        f"the list file {self.list_file} is UTF-16 text; save it as UTF-8 (in PowerShell: "
                        "Out-File -Encoding utf8) with one photo path a line"
                    )
                if not nul and b"\0" in head:
                    raise DataError(
                        f"the list file {self.list_file} holds binary data (a photo?); give a text file with one "
                        "photo path a line (--files-from0 for NUL-separated names)"
                    )
                if not self.inputs and not head.replace(b"\0", b"").strip() and not listed.read(1):
                    raise DataError(
                        f"the list file {self.list_file} names no photos; give a text file with one photo path a line"
                    )
        if not self.inputs and self.list_file is None:
            raise DataError("no photos given; name photo files or folders, or a list file with --files-from")

    def __iter__(self) -> Iterator[str]:
        for item in self.inputs:
            if Path(item).is_dir():
                yield from (str(p) for p in walk_photos(Path(item)))
            else:
                yield item
        if self.list_file == "-":
            # standard input's bytes; a text stream put in its place (an embedding program's) is read as text
            stream = getattr(sys.stdin, "buffer", None) or io.BytesIO(os.fsencode(sys.stdin.read()))
            yield from _names(stream, self.nul)
        elif self.list_file is not None:
            with open(self.list_file, "rb") as names:
                yield from _names(names, self.nul)

    def count(self) -> int | None:
        """How many photos (one more pass over the folders and the list file); None when the list
        comes from standard input, which can be read once only."""
        return None if self.list_file == "-" else sum(1 for _ in self)


def _names(stream, nul: bool, block: int = 1 << 16) -> Iterator[str]:
    """The paths of a binary stream: NUL-ended (nul), else one a line ("\n"; a "\r" before it dropped, and a UTF-8
    byte-order mark before the first, as Notepad and PowerShell write a list)."""
    if not nul:
        for i, line in enumerate(stream):  # a binary stream's lines end at b"\n" alone
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if i == 0:
                line = line.removeprefix(codecs.BOM_UTF8)
            if line.strip():
                yield os.fsdecode(line)
        return
    rest = b""
    while chunk := stream.read(block):
        *names, rest = (rest + chunk).split(b"\0")
        yield from (os.fsdecode(name) for name in names if name)
    if rest:
        yield os.fsdecode(rest)


# ------------------------------------------------------------------------------ the work


@dataclass
class Labelled:
    """What a labelling run did: photos written (with a label), failed (an error row), skipped
    (already in the file), and the seconds it took."""

    written: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


def batches(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def prepared(
    predictor, chunks: Iterable[list[tuple[int, str]]], workers: int
) -> Iterator[tuple[list[tuple[int, str]], list]]:
    """For each batch of (index, path), (the batch, inputs): each input the model's array (3, S, S)
    or the DataError that says why the photo cannot be used. workers > 0: decoded by that many
    threads, up to AHEAD batches ahead of the caller; 0: decoded here, one at a time."""

    def prepare(item: tuple[int, str]):
        path = item[1]
        try:
            return predictor.prepare(local_photo(path), path)
        except DataError as err:
            return err

    if workers == 0:
        for chunk in chunks:
            yield chunk, [prepare(p) for p in chunk]
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="foodvit-decode")
    try:
        ahead: collections.deque = collections.deque()
        # AHEAD Nones after the last chunk: the chunks still decoding are yielded
        for coming in itertools.chain(chunks, [None] * AHEAD):
            if coming is not None:
                ahead.append((coming, [pool.submit(prepare, p) for p in coming]))
            if len(ahead) > AHEAD or (coming is None and ahead):
                done, futures = ahead.popleft()
                yield done, [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # interrupted: the decodes not yet started are dropped


def rows_of(predictor, paths: list[str], inputs: list, top_k: int) -> list[dict]:
    """One row a photo, in order: path, label, probability, top_k [[label, p], ...]; or path and
    error. One forward pass for the photos that could be decoded."""
    good = [x for x in inputs if isinstance(x, np.ndarray)]
    probabilities = iter(predictor.probabilities(np.stack(good)) if good else ())
    rows = []
    for path, x in zip(paths, inputs, strict=False):
        if isinstance(x, np.ndarray):
            answer = predictor.result(next(probabilities), 0.0, top_k)
            rows.append(
                {"path": path, "label": answer["label"], "probability": answer["probability"], "top_k": answer["top_k"]}
            )
        else:
            rows.append({"path": path, "error": str(x)})
    return rows


def label(
    predictor,
    photos: PhotoList,
    out: Predictions,
    *,
    top_k: int = 3,
    batch_size: int = 64,
    workers: int = 2,
    quiet: bool = False,
    share=None,
    done: set[str] | None = None,
) -> Labelled:
    """Label every photo of `photos` not already done, a batch at a time, into `out` (see the
    module's docstring). share(i): whether the i-th photo is this process's to label (default all);
    its rows then carry "index", the photo's place in the list, for the merge. done: the photos to
    skip, by photo_key (default: out's rows); a photo listed twice, however spelt, is labelled once."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    summary = Labelled()
    done = out.done if done is None else done
    total = (
        None if quiet or photos.list_file == "-" else sum(1 for i, _ in enumerate(photos) if share is None or share(i))
    )
    bar = tqdm(total=total, unit="photo", desc="labelling", disable=quiet, dynamic_ncols=True)

    here = os.getcwd()

    def todo() -> Iterator[tuple[int, str]]:
        for i, path in enumerate(photos):
            if share is not None and not share(i):
                continue
            key = photo_key(path, here)
            if key in done:
                summary.skipped += 1
                bar.update(1)  # already labelled: done, and tqdm's smoothed rate soon forgets the burst
                continue
            done.add(key)
            yield i, path

    with bar:
        for chunk, inputs in prepared(predictor, batches(todo(), batch_size), workers):
            rows = rows_of(predictor, [path for _, path in chunk], inputs, top_k)
            if share is not None:
                rows = [{"index": i, **row} for (i, _), row in zip(chunk, rows, strict=False)]
            out.write(rows, here)
            failed = sum("error" in r for r in rows)
            summary.failed += failed
            summary.written += len(rows) - failed
            bar.update(len(rows))
    summary.seconds = time.perf_counter() - started
    return summary


# ------------------------------------------------------------------------------ many processes


def part_path(out: Path, rank: int, world: int) -> Path:
    return out.with_name(f"{out.name}.part-{rank}-of-{world}.jsonl")


def part_files(out: Path) -> list[Path]:
    """Every process's part file of `out`, of this run or of an interrupted one (another world size too)."""
    return sorted(out.parent.glob(glob.escape(out.name) + ".part-*-of-*.jsonl"))


def label_share(
    predictor,
    photos: PhotoList,
    out: Path,
    identity: dict,
    *,
    rank: int,
    world: int,
    top_k: int = 3,
    batch_size: int = 64,
    workers: int = 2,
    quiet: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Labelled:
    """One of `world` processes (torchrun's RANK and WORLD_SIZE) labelling `photos` into `out`.

    The i-th photo is rank i % world's; each rank writes its rows (with their index) to its own
    part file, a batch at a time as label() does. Rank 0 then waits until every photo not already
    in `out` is in some part file (it reads them as they grow: no PyTorch needed, so the ONNX path
    works the same; a process that stops for good stops torchrun, and rank 0 with it), merges the
    parts into `out` in the photos' order and removes them. Rows already in `out`, or in the parts
    of an interrupted run, are not labelled again; so a merge cut short is finished by re-running.
    Returns rank 0's count of all that was merged; another rank's, of its own share."""
    started = time.perf_counter()
    out = Path(out)
    check_written_by(out, identity, top_k)  # every rank refuses another model's file alike
    main = Predictions(out, identity, top_k) if rank == 0 else None  # rank 0 alone writes out
    done = set(main.done) if main is not None else read_done(out)
    for part in part_files(out):
        check_written_by(part, identity, top_k)
        done |= read_done(part)
    mine = Predictions(part_path(out, rank, world), identity, top_k)
    try:
        own = label(
            predictor,
            photos,
            mine,
            top_k=top_k,
            batch_size=batch_size,
            workers=workers,
            quiet=quiet,
            share=lambda i: i % world == rank,
            done=done,
        )
    finally:
        mine.close()
    if main is None:
        return own
    try:
        listed, missing, here = 0, set(), os.getcwd()
        for path in photos:
            listed += 1
            if (key := photo_key(path, here)) not in main.done:
                missing.add(key)
        skipped = listed - len(missing)
        wait_for_parts(out, missing, timeout)
        merged = merge_parts(main, part_files(out))
    finally:
        main.close()
    merged.skipped, merged.seconds = (
        skipped,
        time.perf_counter() - started,
    )  # all ranks' photos: until the last is merged
    return merged


def wait_for_parts(out: Path, missing: set[str], timeout: float, poll: float = 0.1) -> None:
    """Until every photo of `missing` (photo_key) has a complete row in a part file of `out`; a
    RunError after `timeout` seconds. Each part is read on from where the last look stopped."""
    read: dict[Path, int] = {}
    folders: dict[Path, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        for part in part_files(out):
            if part not in folders:  # its sidecar read once, not at every look
                folders[part] = started_in(part)
            folder = folders[part]
            with open(part, "rb") as f:
                f.seek(read.get(part, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            read[part] = read.get(part, 0) + end
            for line in data[:end].splitlines():
                missing.discard(photo_key(parse_json(line)["path"], folder))
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RunError(
                f"{len(missing)} photos (e.g. {next(iter(missing))}) were not labelled by the other processes within "
                f"{timeout:g} s; run the same command again to continue (--dist-timeout waits longer)"
            )
        time.sleep(poll)


def merge_parts(out: Predictions, parts: list[Path], chunk: int = 1024) -> Labelled:
    """The part files' rows appended to `out` in the photos' order (each part is in that order:
    a k-way merge, one row of each part in memory), a photo already in `out` left out; then the
    parts are removed. A part's paths read against the working folder it was started in (all one
    run's parts were, unless its processes ran in different folders)."""

    def rows(part: Path) -> Iterator[dict]:
        folder = started_in(part)
        with open(part, encoding="utf-8") as lines:
            for line in lines:
                if line.endswith("\n"):
                    row = parse_json(line)
                    row["path"] = photo_key(row["path"], folder) if folder != out.folder else row["path"]
                    yield row

    summary, buffer = Labelled(), []
    for row in heapq.merge(*(rows(p) for p in parts), key=lambda r: r["index"]):
        key = photo_key(row["path"], out.folder)
        if key in out.done:
            continue
        del row["index"]
        out.done.add(key)
        buffer.append(row)
        summary.failed += "error" in row
        summary.written += "error" not in row
        if len(buffer) >= chunk:
            out.write(buffer, out.folder)
            buffer = []
    out.write(buffer, out.folder)
    for part in parts:
        part.unlink(missing_ok=True)
        meta_path(part).unlink(missing_ok=True)
    return summary
