"""Writing files safely: atomically, with the user's umask; downloads that appear only when complete. And
reading the JSON files foodvit writes, whose damage every reader names in one line.

No PyTorch here: the data layer, the run directory and the command line all use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import IO

from foodvit.errors import RunError


def parse_json(text: str | bytes):
    """JSON text's value. Text nested past what Python's parser can follow raises ValueError, as any other text
    that is not JSON does (json itself raises RecursionError there), so that a reader's except clause for damaged
    JSON, ValueError, covers it too."""
    try:
        return json.loads(text)
    except RecursionError as err:
        raise ValueError(str(err)) from None


def address_scheme(text: str) -> str | None:
    """The scheme of an address given where a path may stand ("https" of https://host/x.jpg, "file", "s3"), in lower
    case; None for a path."""
    found = ADDRESS.match(text)
    return found.group(1).lower() if found else None


ADDRESS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def read_json(path: str | os.PathLike):
    """A JSON file's value (parse_json): its reader's except clause for a damaged file is (OSError, ValueError)."""
    return parse_json(Path(path).read_text())


def current_umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary_name(path: Path, suffix: str = ".tmp") -> Path:
    """A hidden name beside `path` for its file while it is written: its name's first 64 bytes at most (a name of 250
    bytes, which the file system takes, would make one it refuses), a random part, and `suffix`."""
    start = path.name
    while len(os.fsencode(start)) > 64:  # cut at a character, never inside one
        start = start[:-1]
    return path.with_name(f".{start}.{secrets.token_hex(4)}{suffix}")


def check_name_length(path: Path, what: str = "--out") -> None:
    """A check, before any work, that the file system takes `path`'s name (255 bytes on most; a longer one was
    refused only when the file was written, after the work): a RunError that says so."""
    try:
        most = os.pathconf(path.parent if path.parent.exists() else ".", "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # a system that does not say (Windows): 255, as NTFS and ext4
        most = 255
    length = len(os.fsencode(path.name))
    if length > most:
        raise RunError(
            f"{what} {path}: its name is {length} bytes long, and the file system takes {most} at most; choose a "
            "shorter name"
        )


def _as_target(err: OSError, tmp: Path, target: Path) -> OSError:
    """An error on the temporary file or folder (or in it), or on no file named (a full disk, a quota), as one on what
    it stands for: the user named the target, never the other. An error on another file (one the writer reads) is
    left as it is."""
    if err.errno is None:
        return err  # not the system's (a URL's error, say): as it is
    if err.filename is None:
        return type(err)(err.errno, err.strerror, os.fspath(target))
    name, inside = os.fspath(err.filename), os.fspath(tmp)
    if name == inside or name.startswith(inside + os.sep):  # the temporary file, or a file in the temporary folder
        return type(err)(err.errno, err.strerror, os.fspath(target) + name[len(inside) :])
    return err


def atomic_write(path: str | os.PathLike, write, suffix: str = ".tmp", *, replace: bool = True) -> Path:
    """Call write(tmp_path), then rename over `path`: readers never see a half-written file, and a
    failure (or Ctrl-C) leaves neither a partial file nor the temporary one. The file gets the
    permissions any other tool would give it (0666 less the umask). replace=False: the file is
    created only if absent (FileExistsError otherwise), so of two concurrent writers one wins whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path, suffix)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as err:
        raise _as_target(err, tmp, path) from None
    except BaseException:  # Ctrl-C once the file was made, before the block below could remove it
        tmp.unlink(missing_ok=True)
        raise
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # whatever the writer did (some write 0600 and rename)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists, unlike a rename
            tmp.unlink()
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _as_target(err, tmp, path) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str, *, replace: bool = True) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text), replace=replace)


def open_url(request, *, timeout: float):
    """urllib's urlopen through an opener made now: the proxy settings (HTTP_PROXY, NO_PROXY, ...) are
    the environment's at this call. urllib.request.urlopen keeps the opener of its first call, and the
    proxies of that moment, for the rest of the process (set by whichever library called it first)."""
    import urllib.request

    return urllib.request.build_opener().open(request, timeout=timeout)


def download(url: str, target: Path, *, timeout: float, quiet: bool = False, sha256_prefix: str | None = None) -> Path:
    """Download url to target with a progress bar; the connection times out by itself (nothing
    process-wide changes), the file appears only when complete and, with sha256_prefix, only if its
    SHA-256 starts so. Errors are the network's (OSError) or a ValueError for a damaged file.

    Our own rather than torch.hub.download_url_to_file, which does the same hash check: that one
    has no connection time-out (offline it can hang instead of failing in seconds) and would load
    PyTorch into the data layer, which stays torch-free."""
    import hashlib

    from tqdm.auto import tqdm

    def fetch(tmp: Path) -> None:
        digest, size = hashlib.sha256(), 0
        with tmp.open("wb") as out, open_url(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=f"downloading {Path(target).name}", disable=quiet
            ) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
        if total is not None and size != total:  # the connection closed early: the file is not kept
            raise ConnectionError(f"the connection closed after {size:,} of the {total:,} bytes announced; try again")
        if sha256_prefix and not digest.hexdigest().startswith(sha256_prefix):
            raise ValueError(f"{url} arrived damaged (its SHA-256 does not start with {sha256_prefix}); try again")

    return atomic_write(target, fetch, suffix=".part")


@contextlib.contextmanager
def exclusive(path: Path):
    """The existing file `path` open (binary, never written), its handle yielded, for a block run holding an
    exclusive lock on it: flock, which the OS drops however the process ends, so no lock outlives its holder;
    another process's block on the same file waits for this one. Read the file through the handle: where a lock is
    mandatory (SMB), another handle of this process could not. Opened for writing where it may be, as NFS wants
    for an exclusive lock; where there is no flock (Windows, a file system without locks), the block runs
    unlocked."""
    handle: IO[bytes]
    try:
        handle = open(path, "r+b")
    except OSError:  # read-only, not the user's
        handle = open(path, "rb")
    with handle:
        try:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except (ImportError, OSError):  # no flock here, or ENOLCK and the like: the file system keeps no locks
            pass
        yield handle


def file_above(path: Path) -> Path | None:
    """The first of `path`'s parents that exists and is not a folder (where no folder can be made), else None."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def atomic_folder(target: Path, fill) -> Path:
    """Call fill(tmp_folder), then rename it to `target`; on failure nothing is left behind. The
    folder gets 0777 less the umask, as mkdir gives. A `target` that is a symbolic link to a folder is written
    where it points (the rename would otherwise meet the link, not the folder); returns `target` as given."""
    given = target = Path(target)
    if target.is_symlink() and target.is_dir():  # a dangling link, or one in a loop, is no folder: refused below
        target = Path(os.path.realpath(target))
    blocker = file_above(target)
    if blocker is not None:  # an OSError as mkdir's own, with the file that stands in the way named
        raise NotADirectoryError(errno.ENOTDIR, f"{blocker} is a file, so no folder can be made under it", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(target, "")
    try:
        tmp.mkdir(mode=0o777)
    except OSError as err:
        raise _as_target(err, tmp, target) from None
    except BaseException:  # Ctrl-C once the folder was made, before the block below could remove it
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        fill(tmp)
        os.replace(tmp, target)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _as_target(err, tmp, target) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return given
