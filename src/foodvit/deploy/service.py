"""What the server's API and page share (deploy/serve.py): the Predictor, the Batcher that runs its
forward passes, and the limits on what is uploaded.

Requests are decoded in worker threads and their inputs batched by a Batcher (a queue that collects
inputs for a few milliseconds, up to a batch size) that runs the forward passes on one thread. Memory
is bounded whatever is uploaded: photos over the pixel limit are refused from their header, larger
photos than the model needs are decoded reduced, and concurrent decodes share a budget of
DECODE_BUDGET_MB (photos.DecodeBudget).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time

import numpy as np

from foodvit.data.photos import PHOTO_LIMIT, DecodeBudget
from foodvit.deploy.predictor import Predictor

# The server's defaults: Service's, create_app's and serve's (deploy/serve.py); the command line's options repeat
# them as plain numbers, so that its help loads nothing (a test holds them equal)
DEFAULT_MAX_BATCH = 16  # requests run as one forward pass
DEFAULT_MAX_WAIT_MS = 5.0  # how long a batch's first request waits for others
DEFAULT_TOP_K = 3  # the classes each answer ranks
DEFAULT_MAX_UPLOAD_MB = 10.0
# Uploads over this many pixels are refused from their header, as every command refuses such a photo.
DEFAULT_MAX_MEGAPIXELS = PHOTO_LIMIT / 1e6  # the limit every command keeps (data/photos.py)
# Bytes that concurrent decodes may hold at once (photos.DecodeBudget): with the server's own
# ~0.7 GB, uploads cannot take it past about 1.2 GB however many arrive together.
DECODE_BUDGET_MB = 384


class Batcher:
    """Runs a Predictor's forward passes on one thread, batching the inputs that arrive together.

    submit(x) returns a Future of x's probabilities. The thread takes the first waiting input and
    everything queued behind it, then, while `arriving()` says more inputs are being decoded, waits
    for them for up to max_wait seconds or until max_batch, and runs them as one batch. A lone
    request waits for nothing. With max_batch=1 every request is its own forward pass.
    """

    def __init__(
        self,
        predictor: Predictor,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait: float = DEFAULT_MAX_WAIT_MS / 1000,
        arriving=None,
    ) -> None:
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
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
        top_k: int = DEFAULT_TOP_K,
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
