"""A trained run as a web demo and an HTTP prediction service, in one process (`foodvit serve`):
a run directory (PyTorch), or an exported .onnx file (ONNX Runtime; no PyTorch in the process).

    GET  /          the demo page (Gradio): upload, paste or webcam a photo; top-k bars, the time
                    taken, the attention rollout over the crop the model saw, a model card
    POST /predict   multipart form, field `file` -> {"label", "probability", "probabilities", "top_k", "seconds"}
    GET  /health    {"status": "ok", "model", "classes"}
    Gradio's own API (/gradio_api/...) stays available for gradio_client.

The page is Gradio mounted on a FastAPI app, served by uvicorn. The model is loaded once into a
Predictor, whose forward passes a Service batches for the API and the page alike (deploy/service.py).
Bad input is answered 4xx with {"error": what was wrong and what is accepted}: never a 5xx, never a
blocked server (deploy/routes.py). Memory is bounded whatever is uploaded (service.py). Needs the
serve extra: pip install 'foodvit[serve]'.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from foodvit import markup
from foodvit.deploy.predictor import Predictor
from foodvit.deploy.routes import BodyLimit, UploadBudget, add_api
from foodvit.deploy.service import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_MEGAPIXELS,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_TOP_K,
    Service,
)
from foodvit.errors import FoodVitError

logger = logging.getLogger(__name__)

EXAMPLES_PER_CLASS = 1


def create_app(
    predictor: Predictor,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    top_k: int = DEFAULT_TOP_K,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
    examples: Sequence[Path] = (),
    page: bool = True,
    page_cache: tuple[int, int] | None = None,
):
    """The FastAPI application: /predict and /health (deploy/routes.py), and the Gradio page mounted at /
    (page_cache: see page.build_page); returned within BodyLimit, with its Service."""
    from fastapi import FastAPI

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
    # the description is Markdown on the API's page (/docs): the model's name and classes as text (markup.py)
    described = f"{predictor.name}: {', '.join(predictor.classes)}"
    app = FastAPI(title="foodvit", description=markup.text(described))
    app.state.service = service
    http_error = add_api(app, service, max_bytes)
    if page:
        import gradio as gr
        from starlette.exceptions import HTTPException as StarletteHTTPException

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
            app_kwargs={"exception_handlers": {StarletteHTTPException: http_error}},  # its 404s in our shape
        )
        # Gradio checks that a file a call names was uploaded through the page only for an app it launched itself;
        # mounted, the page is as launched, so that a client cannot name any file of the server's in its API calls
        demo.has_launched = True
        budgeted = UploadBudget(app, lambda: [path for files in demo.temp_file_sets for path in list(files)])
        return BodyLimit(budgeted, max_bytes), service
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
    max_batch: int = DEFAULT_MAX_BATCH,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    top_k: int = DEFAULT_TOP_K,
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
