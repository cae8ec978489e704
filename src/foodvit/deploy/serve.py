"""A trained run as a web demo and an HTTP prediction service, in one process (`foodvit serve`):
a run directory (PyTorch), or an exported .onnx file (ONNX Runtime; no PyTorch in the process).

    GET  /          the demo page (Gradio): upload, paste or webcam a photo; top-k bars, the time
                    taken, the attention rollout over the crop the model saw, a model card
    POST /predict   multipart form, field `file` -> {"label", "probabilities", "top_k", "seconds"}
    GET  /health    {"status": "ok", "model", "classes"}
    Gradio's own API (/gradio_api/...) stays available for gradio_client.

The page is Gradio mounted on a FastAPI app, served by uvicorn. The model is loaded once into a
Predictor; requests are decoded in worker threads and their inputs batched by a Batcher (a queue
that collects inputs for a few milliseconds, up to a batch size) that runs the forward passes on
one thread. Bad input is answered 4xx with {"error": what was wrong and what is accepted}: never a
5xx, never a blocked server. Memory is bounded whatever is uploaded: photos over --max-megapixels
are refused from their header, larger photos than the model needs are decoded reduced, and
concurrent decodes share a budget of DECODE_BUDGET_MB (photos.DecodeBudget). Needs the serve
extra: pip install 'foodvit[serve]'.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations (UploadFile) at run time

import asyncio
import concurrent.futures
import errno
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np

from foodvit.data.photos import ACCEPTED, PHOTO_LIMIT, DecodeBudget, PhotoError, safe_name
from foodvit.deploy.predictor import Predictor
from foodvit.errors import FoodVitError

logger = logging.getLogger(__name__)

DEFAULT_MAX_UPLOAD_MB = 10.0
# Uploads over this many pixels are refused from their header, as every command refuses such a photo.
DEFAULT_MAX_MEGAPIXELS = PHOTO_LIMIT / 1e6  # the limit every command keeps (data/photos.py)
# Bytes that concurrent decodes may hold at once (photos.DecodeBudget): with the server's own
# ~0.7 GB, uploads cannot take it past about 1.2 GB however many arrive together.
DECODE_BUDGET_MB = 384
EXAMPLES_PER_CLASS = 1


class Batcher:
    """Runs a Predictor's forward passes on one thread, batching the inputs that arrive together.

    submit(x) returns a Future of x's probabilities. The thread takes the first waiting input and
    everything queued behind it, then, while `arriving()` says more inputs are being decoded, waits
    for them for up to max_wait seconds or until max_batch, and runs them as one batch. A lone
    request waits for nothing. With max_batch=1 every request is its own forward pass.
    """

    def __init__(self, predictor: Predictor, max_batch: int = 16, max_wait: float = 0.005, arriving=None) -> None:
        self.predictor, self.max_batch, self.max_wait = predictor, max(1, max_batch), max(0.0, max_wait)
        self.arriving = arriving or (lambda: 1)  # without a count, always wait max_wait for company
        self.queue: queue.Queue = queue.Queue()
        self.batches = 0  # how many forward passes ran (for tests and benchmarks)
        self.thread = threading.Thread(target=self._run, name="foodvit-batcher", daemon=True)
        self.thread.start()

    def submit(self, x: np.ndarray) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.queue.put((x, future))
        return future

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _collect(self, first) -> list:
        items = [first]
        deadline = time.monotonic() + self.max_wait
        while len(items) < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.arriving() <= 0:
                    break
                try:
                    item = self.queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if item is None:  # closing: finish this batch first
                self.queue.put(None)
                break
            items.append(item)
        return items

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            items = self._collect(first)
            try:
                probabilities = self.predictor.probabilities(np.stack([x for x, _ in items]))
            except Exception as err:  # a bug in the backend: every waiting request learns of it
                for _, future in items:
                    future.set_exception(err)
                continue
            self.batches += 1
            for (_, future), p in zip(items, probabilities, strict=True):
                future.set_result(p)


class Service:
    """What the API and the page share: the Predictor, the Batcher and the limits."""

    def __init__(
        self,
        predictor: Predictor,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        top_k: int = 3,
        max_upload_bytes: int = int(DEFAULT_MAX_UPLOAD_MB * 1e6),
        max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
        decode_budget_mb: float = DECODE_BUDGET_MB,
    ) -> None:
        self.predictor, self.top_k, self.max_upload_bytes = predictor, top_k, max_upload_bytes
        self.max_pixels, self.budget = int(max_megapixels * 1e6), DecodeBudget(int(decode_budget_mb * 2**20))
        self._decoding, self._lock = 0, threading.Lock()  # requests accepted and not yet queued for the model
        self.batcher = Batcher(predictor, max_batch, max_wait_ms / 1000, arriving=lambda: self._decoding)

    def _prepare(self, photo, name: str) -> concurrent.futures.Future:
        """Decode and preprocess (counted as arriving while it runs), then queue for the model."""
        with self._lock:
            self._decoding += 1
        try:
            x = self.predictor.prepare(photo, name, max_pixels=self.max_pixels, budget=self.budget)
            return self.batcher.submit(x)
        finally:
            with self._lock:
                self._decoding -= 1

    def classify(self, photo, name: str = "the photo") -> dict:
        """Decode, preprocess, wait for the batch: the answer dict (see Predictor.result). Blocking."""
        started = time.perf_counter()
        probabilities = self._prepare(photo, name).result()
        return self.predictor.result(probabilities, time.perf_counter() - started, self.top_k)

    async def classify_async(self, photo, name: str) -> dict:
        from starlette.concurrency import run_in_threadpool

        started = time.perf_counter()
        future = await run_in_threadpool(self._prepare, photo, name)  # decoding off the event loop
        probabilities = await asyncio.wrap_future(future)
        return self.predictor.result(probabilities, time.perf_counter() - started, self.top_k)

    def health(self) -> dict:
        return {"status": "ok", "model": self.predictor.name, "classes": self.predictor.classes}


def too_large_message(max_bytes: int) -> str:
    """The 413 of an upload over the byte limit, worded as a photo over the pixel limit is (photos.too_large)."""
    return (
        f"the upload is over the limit of {max_bytes / 1e6:g} MB (the server's --max-upload-mb); "
        "if it is a real photo, resize it below the limit and try again"
    )


class BodyLimit:
    """ASGI middleware: a request body over max_bytes is answered 413 with a JSON error, whether
    the client announces its length or streams it, before anything reads the whole body."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _message(self) -> str:
        return too_large_message(self.max_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await JSONResponse({"error": self._message()}, status_code=413)(scope, receive, send)
        seen, started, exceeded = 0, False, False
        refusal = JSONResponse({"error": self._message()}, status_code=413)

        async def counted_receive():
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _TooLarge
            return message

        async def watched_send(message):
            nonlocal started
            if exceeded:  # whatever the app answers once the body broke the limit (a parse error, ...) becomes the 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await refusal(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            pass
        if exceeded and not started:
            await refusal(scope, receive, send)


class _TooLarge(Exception):
    pass


# the API's paths and the methods each answers; other methods get 405 (else the page mounted at /
# would answer them 404 Not Found)
API_METHODS = {"/predict": ("POST",), "/health": ("GET", "HEAD")}  # HEAD where GET is, as HTTP has it


def create_app(
    predictor: Predictor,
    *,
    max_batch: int = 16,
    max_wait_ms: float = 5.0,
    top_k: int = 3,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
    examples: Sequence[Path] = (),
    page: bool = True,
    page_cache: tuple[int, int] | None = None,
):
    """The FastAPI application: /predict and /health, and the Gradio page mounted at / (page_cache:
    see page.build_page)."""
    from fastapi import FastAPI, File, Request, UploadFile
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    size = predictor.preprocess.image_size
    # warm-up: the first visitor waits no longer than others
    predictor.probabilities(np.zeros((1, 3, size, size), np.float32))
    max_bytes = int(max_upload_mb * 1e6)
    service = Service(
        predictor,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        top_k=top_k,
        max_upload_bytes=max_bytes,
        max_megapixels=max_megapixels,
    )
    app = FastAPI(title="foodvit", description=f"{predictor.name}: {', '.join(predictor.classes)}")
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, err: RequestValidationError):
        return JSONResponse(
            {
                "error": "expected a multipart form with the photo in the field 'file' "
                "(e.g. curl -F file=@photo.jpg http://HOST:PORT/predict)"
            },
            status_code=422,
        )

    async def _http_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, StarletteHTTPException)  # registered for that class alone, below
        message = str(err.detail).rstrip(".")
        # e.g. the multipart parser's "Invalid multipart data"
        if request.url.path == "/predict" and err.status_code == 400:
            message += (
                "; expected a multipart form with the photo in the field 'file' "
                "(e.g. curl -F file=@photo.jpg URL/predict)"
            )
        if err.status_code == 404 and message == "Not Found":
            message = (
                f"nothing at {request.method} {request.url.path}: the page is GET /, the API POST /predict "
                "(the photo in the form field 'file') and GET /health"
            )
        return JSONResponse({"error": message}, status_code=err.status_code, headers=getattr(err, "headers", None))

    app.add_exception_handler(StarletteHTTPException, _http_error)

    for path, allowed in API_METHODS.items():
        others = [m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE") if m not in allowed]

        async def _wrong_method(request: Request, allowed=allowed):
            how = (
                " with the photo in the form field 'file' (e.g. curl -F file=@photo.jpg URL/predict)"
                if "POST" in allowed
                else ""
            )
            return JSONResponse(
                {"error": f"{request.url.path} does not answer {request.method}; send {' or '.join(allowed)}{how}"},
                status_code=405,
                headers={"Allow": ", ".join(allowed)},
            )

        app.add_api_route(path, _wrong_method, methods=others, include_in_schema=False)

    @app.exception_handler(PhotoError)
    async def _bad_photo(request: Request, err: PhotoError):
        status = {"empty": 400, "too large": 413}.get(err.kind, 415)  # 415: not a media type we can read
        return JSONResponse({"error": str(err)}, status_code=status)

    @app.api_route("/health", methods=list(API_METHODS["/health"]))
    async def health() -> dict:
        return service.health()

    @app.post("/predict")
    async def predict(file: Annotated[UploadFile, File(description=f"the photo: {ACCEPTED}")]) -> dict:
        data = await file.read()
        if len(data) > max_bytes:  # a multipart body within the limit cannot hold more, but be sure
            raise StarletteHTTPException(413, too_large_message(max_bytes))  # answered by _http_error
        return await service.classify_async(data, safe_name(file.filename))

    if page:
        import gradio as gr

        from foodvit.deploy.page import build_page

        demo = build_page(service, examples, cache=page_cache)
        # the example photos themselves, never their folders: other files beside them are not served
        app = gr.mount_gradio_app(
            app,
            demo,
            path="/",
            max_file_size=max_bytes,
            show_error=True,
            allowed_paths=sorted(str(Path(p).resolve()) for p in examples),
            footer_links=["api"],
            app_kwargs={"exception_handlers": {StarletteHTTPException: _http_error}},  # its 404s in our shape
        )
    return BodyLimit(app, max_bytes), service


def run_examples(predictor: Predictor, per_class: int = EXAMPLES_PER_CLASS) -> list[Path]:
    """A few of the model's test photos, when its data (or $FOODVIT_DATA's) is at hand; else none."""
    return predictor.photos_at_hand(per_class)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, for uvicorn to listen on; a FoodVitError that says what to do
    when the name does not resolve, the address is not this machine's or the port is taken. Bound
    before anything is loaded or printed, so that the server never says where it serves in vain."""
    try:
        # the family as uvicorn picks it: IPv6 for an address with colons, else IPv4 (localhost is 127.0.0.1)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError, ValueError) as err:  # UnicodeError: an IDNA-invalid name such as bad..host
        reason = err.strerror if isinstance(err, socket.gaierror) else "not a valid host name"
        raise FoodVitError(
            f"--host {host}: cannot resolve it ({reason}); give an address of this machine, "
            "e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every network)"
        ) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port in TIME_WAIT is free
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise FoodVitError(
                f"cannot listen on {host}:{port}: the port is in use (another server?); choose another --port"
            ) from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise FoodVitError(
                f"cannot listen on {host}:{port}: {host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0"
            ) from None
        if err.errno == errno.EACCES:
            raise FoodVitError(
                f"cannot listen on {host}:{port}: ports below 1024 need administrator rights; "
                "choose a --port from 1024 up"
            ) from None
        raise FoodVitError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); choose another --host or --port"
        ) from None
    return sock


def serve(
    run: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 7860,
    max_batch: int = 16,
    max_wait_ms: float = 5.0,
    top_k: int = 3,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
    examples: bool = True,
    example_photos: Sequence[Path] | None = None,
    log_level: str = "warning",
    threads: int | None = None,
) -> None:
    """Load the run (a run directory, or an exported .onnx: then no PyTorch is imported) once and
    serve it until interrupted. The page's examples: example_photos if given, else (examples=True)
    one photo per class from the model's test photos when at hand. threads: ONNX Runtime's; what is
    process-wide (PyTorch's threads, Gradio's analytics) is the entry point's to set."""
    import uvicorn

    sock = listening_socket(host, port)
    try:
        predictor = Predictor.open(run, threads=threads)
        shown = list(example_photos) if example_photos is not None else run_examples(predictor) if examples else []
        app, _ = create_app(
            predictor,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            top_k=top_k,
            max_upload_mb=max_upload_mb,
            max_megapixels=max_megapixels,
            examples=shown,
        )
        where = f"[{host}]" if ":" in host else host
        logger.info(
            "serving %s from %s at http://%s:%d/  (API: POST /predict, GET /health; Ctrl+C stops)",
            predictor.name,
            run,
            where,
            port,
        )
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_keep_alive=5)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
