"""ONNX Runtime Web's files for the static page: its JavaScript and its WebAssembly, copied into the
site so that the page needs no network when it runs (never a CDN link).

Where they come from, in this order:
    --ort-web PATH    a folder holding them (dist/ of the npm package, or a folder above it, e.g.
                      node_modules/onnxruntime-web or an unpacked `npm pack`), each file checked
                      against the pinned package's (SHA256), or the package's .tgz itself (checked
                      against the pinned hash)
    the cache         FOODVIT_CACHE/onnxruntime-web/VERSION/, filled by an earlier download (its
                      files checked as a folder's are; fetched again if they differ)
    the npm registry  the pinned version's tarball (https://registry.npmjs.org, or
                      $FOODVIT_NPM_REGISTRY), checked against its published sha512 integrity before
                      anything is unpacked, then kept in the cache

The files are the single-threaded-capable WebAssembly build (SIMD): its threads are used only
where the page is cross-origin isolated, which a plain static host is not, so it runs on one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import shutil
import tarfile
from pathlib import Path

from foodvit.errors import FoodVitError

VERSION = "1.31.1"
# the npm registry's "integrity" of onnxruntime-web-VERSION.tgz (npm view onnxruntime-web@VERSION dist.integrity)
INTEGRITY = "sha512-5GeH+bWQ+HxM10z7erGlsWqryrwMbSvm/1tkIsKTT48g0fI19VXVVC435t4t7VsPdSQeS7NmuZPXrQ73k82URw=="
REGISTRY = "https://registry.npmjs.org"
REGISTRY_ENV = "FOODVIT_NPM_REGISTRY"
# the WebAssembly-only build: its loader script, the module glue it imports and the binary
FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
# each of FILES as the pinned package holds it (package/dist/NAME in the .tgz of INTEGRITY): a folder is checked
# file by file, as the tarball is as a whole; a file changed by one byte is not the runtime the page was checked with
SHA256 = {
    "ort.wasm.min.js": "b8a78c408c40da65fdc8ba0846f7b2948e92a4c6d6b23cc8e4165e428ad95443",
    "ort-wasm-simd-threaded.mjs": "30ed0b5cd1182ede931fea448afb567d4dc705ec957af09f108a2be5f770dac3",
    "ort-wasm-simd-threaded.wasm": "4b884c203b0fa48d057be3332c65513ff85aa3c5bddd6946acc0fab7ecda001d",
}
TIMEOUT_S = 60.0
logger = logging.getLogger(__name__)
PACK = f"npm pack onnxruntime-web@{VERSION}"


class RuntimeFilesError(FoodVitError, RuntimeError):
    """ONNX Runtime Web's files are not at hand and cannot be fetched."""


def tarball_url(version: str = VERSION, registry: str | None = None) -> str:
    registry = (registry or os.environ.get(REGISTRY_ENV) or REGISTRY).rstrip("/")
    return f"{registry}/onnxruntime-web/-/onnxruntime-web-{version}.tgz"


def cached(version: str = VERSION) -> Path:
    """Where the files of `version` are kept once fetched."""
    from foodvit.data.sources import cache_dir

    return cache_dir() / "onnxruntime-web" / version


def runtime_files(
    local: str | Path | None = None,
    *,
    version: str = VERSION,
    integrity: str = INTEGRITY,
    registry: str | None = None,
    quiet: bool = False,
    hashes: dict[str, str] | None = None,
) -> Path:
    """A folder holding FILES: found under `local` (a folder, or the package's .tgz), else in the
    cache, else fetched from the registry into the cache. A folder's files are checked against
    `hashes` (SHA256 by name; default the pinned package's, SHA256), a tarball against `integrity`.
    A RuntimeFilesError in one line when neither is possible, or a local folder's files differ."""
    hashes = SHA256 if hashes is None else hashes
    if local is not None:
        local = Path(local)
        if local.is_file():
            return _unpacked(local.read_bytes(), str(local), version, integrity)
        folder = _found_in(local)
        for name in FILES:
            if not _same(folder / name, hashes):
                raise RuntimeFilesError(
                    f"--ort-web {local}: {name} is not onnxruntime-web {version}'s as published (its SHA256 differs: "
                    f"changed or damaged); give the package's own files (`{PACK}`, its .tgz or its dist/ folder)"
                )
        return folder
    folder = cached(version)
    if all((folder / name).is_file() and _same(folder / name, hashes) for name in FILES):
        return folder  # else fetched again: _unpacked replaces what the cache holds
    return _unpacked(
        _download(tarball_url(version, registry), quiet), tarball_url(version, registry), version, integrity
    )


def _same(path: Path, hashes: dict[str, str]) -> bool:
    """Whether the file at `path` has the SHA256 that `hashes` gives its name."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == hashes.get(path.name)


def _found_in(local: Path) -> Path:
    if not local.is_dir():
        raise RuntimeFilesError(
            f"--ort-web {local} does not exist; give the folder of onnxruntime-web's files (its dist/) "
            f"or the package's .tgz ({PACK})"
        )
    for folder in (
        local,
        local / "dist",
        local / "package" / "dist",
        local / "node_modules" / "onnxruntime-web" / "dist",
    ):
        if all((folder / name).is_file() for name in FILES):
            return folder
    raise RuntimeFilesError(
        f"--ort-web {local} does not hold onnxruntime-web's {', '.join(FILES)}; give its dist/ folder "
        f"or the package's .tgz ({PACK})"
    )


def _download(url: str, quiet: bool) -> bytes:
    from foodvit.files import open_url

    if not quiet:
        logger.info("downloading onnxruntime-web %s from %s (once; kept in the cache)", VERSION, url)
    try:
        with open_url(url, timeout=TIMEOUT_S) as response:
            return response.read()
    except OSError as err:  # URLError, HTTPError, time-outs and refused connections are all OSErrors
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
        raise RuntimeFilesError(
            f"cannot download onnxruntime-web from {url} ({reason}); connect to the network, or give "
            f"--ort-web with its files (e.g. the .tgz of `{PACK}`)"
        ) from None


def check_integrity(data: bytes, integrity: str, where: str) -> None:
    """A RuntimeFilesError unless `data` has the npm integrity string `integrity` (sha512-BASE64)."""
    algorithm, _, expected = integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if digest != expected:
        raise RuntimeFilesError(
            f"{where} is not onnxruntime-web {VERSION} as published: its {algorithm} differs from the "
            f"registry's ({integrity[:24]}...); fetch it again (`{PACK}`)"
        )


def _unpacked(data: bytes, where: str, version: str, integrity: str) -> Path:
    """FILES from a checked tarball, into the cache (whole, or not at all)."""
    from foodvit.files import atomic_folder

    check_integrity(data, integrity, where)
    folder = cached(version)

    def fill(tmp: Path) -> None:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for name in FILES:
                try:
                    member = archive.extractfile(f"package/dist/{name}")
                except KeyError:
                    member = None
                if member is None:
                    raise RuntimeFilesError(
                        f"{where} has no dist/{name}: not the onnxruntime-web package foodvit expects"
                    )
                with member, (tmp / name).open("wb") as out:
                    shutil.copyfileobj(member, out)

    try:
        if folder.exists():  # a part left by something else: the checked tarball replaces it
            shutil.rmtree(folder)
        return atomic_folder(folder, fill)
    except OSError as err:
        raise RuntimeFilesError(
            f"cannot keep onnxruntime-web's files in {folder} ({err.strerror or err}); set "
            "FOODVIT_CACHE to a folder you can write"
        ) from None
