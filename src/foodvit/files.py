"""Writing files safely: atomically, with the user's umask, and one writer per run directory.

No PyTorch here: the data layer, the run directory and the command line all use it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
from pathlib import Path

from foodvit.errors import RunError


def current_umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary_name(path: Path, suffix: str = ".tmp") -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{suffix}")


def atomic_write(path: str | os.PathLike, write, suffix: str = ".tmp") -> Path:
    """Call write(tmp_path), then rename over `path`: readers never see a half-written file, and a
    failure (or Ctrl-C) leaves neither a partial file nor the temporary one. The file gets the
    permissions any other tool would give it (0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path, suffix)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # whatever the writer did (some write 0600 and rename)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def download(url: str, target: Path, *, timeout: float, quiet: bool = False, sha256_prefix: str | None = None) -> Path:
    """Download url to target with a progress bar; the connection times out by itself (nothing
    process-wide changes), the file appears only when complete and, with sha256_prefix, only if its
    SHA-256 starts so. Errors are the network's (OSError) or a ValueError for a damaged file."""
    import hashlib
    import urllib.request

    from tqdm.auto import tqdm

    def fetch(tmp: Path) -> None:
        digest = hashlib.sha256()
        with tmp.open("wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {Path(target).name}", disable=quiet) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if sha256_prefix and not digest.hexdigest().startswith(sha256_prefix):
            raise ValueError(f"{url} arrived damaged (its SHA-256 does not start with {sha256_prefix}); try again")

    return atomic_write(target, fetch, suffix=".part")


def atomic_folder(target: Path, fill) -> Path:
    """Call fill(tmp_folder), then rename it to `target`; on failure nothing is left behind. The
    folder gets 0777 less the umask, as mkdir gives."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(target, "")
    tmp.mkdir(mode=0o777)
    try:
        fill(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


class LockedError(RunError):
    """Another live process holds the lock."""


class RunLock:
    """One writer per run directory: a lock file holding the owner's pid and host, created
    exclusively. A lock whose process is gone (same host) is stale and taken over."""

    NAME = ".foodvit.lock"

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / self.NAME
        self.held = False

    def acquire(self) -> "RunLock":
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and self._alive(*owner):
                    pid, host = owner
                    raise LockedError(
                        f"{self.path.parent} is in use by another foodvit process (pid {pid} on {host}); "
                        f"wait for it to finish or choose another --out (if no process writes there, delete {self.path})"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            self.held = True
            return self
        raise LockedError(f"could not lock {self.path.parent}: another process keeps taking {self.path.name}")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _owner(self) -> tuple[int, str] | None:
        try:
            pid, host = self.path.read_text().split()
            return int(pid), host
        except (OSError, ValueError):
            return None  # unreadable or half-written: treat as stale

    @staticmethod
    def _alive(pid: int, host: str) -> bool:
        if host != socket.gethostname():
            return True  # another machine's process: cannot tell, so respect it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # exists, owned by someone else
        return True
