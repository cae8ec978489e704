"""The server's HTTP API on its FastAPI app (deploy/serve.py builds the app): POST /predict and GET /health,
and every bad request answered 4xx with {"error": what was wrong and what is accepted}, never a 5xx: a body
over the upload limit (BodyLimit, before anything reads the whole body), a malformed form, a photo that
cannot be read, a method or a path the API does not answer. The page's own uploads are bounded on disk as well
(UploadBudget).
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations (UploadFile) at run time

import os
from collections.abc import Callable, Iterable
from typing import Annotated

from foodvit.data.photos import ACCEPTED, PhotoError, safe_name
from foodvit.deploy.service import Service


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


UPLOAD_BUDGET = 512 * 2**20  # bytes the page's upload folder may hold before new uploads wait for its clean-up


class UploadBudget:
    """ASGI middleware: an upload to the page (Gradio's /gradio_api/upload) is answered 507 while the files the
    page has made (uploads, pictures shown) hold more than `budget` bytes. The page's delete_cache removes them
    after half an hour; without a budget an anonymous client could fill the disk in that time, a request of junk at
    a time. Only the page's own files count: Gradio's upload folder is shared by every app on the machine, and
    another's leftovers, which this page never deletes, would refuse its uploads for good."""

    def __init__(self, app, files: Callable[[], Iterable[str]], budget: int | None = None) -> None:
        self.app, self.files, self.budget = app, files, UPLOAD_BUDGET if budget is None else budget

    def held(self) -> int:
        """The bytes of the page's files still on disk."""
        total = 0
        for path in self.files():
            try:
                total += os.lstat(path).st_size
            except OSError:  # removed by the clean-up meanwhile
                pass
        return total

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("/gradio_api/upload"):
            if self.held() > self.budget:
                from starlette.responses import JSONResponse

                message = (
                    f"the page's upload space is full ({self.budget / 2**20:g} MiB of recent uploads); try again in "
                    "a few minutes, when uploads older than half an hour are removed"
                )
                return await JSONResponse({"error": message}, status_code=507)(scope, receive, send)
        await self.app(scope, receive, send)


# the API's paths and the methods each answers; other methods get 405 (else the page mounted at /
# would answer them 404 Not Found)
API_METHODS = {"/predict": ("POST",), "/health": ("GET", "HEAD")}  # HEAD where GET is, as HTTP has it


def add_api(app, service: Service, max_bytes: int):
    """/predict and /health on the app (FastAPI), the API's answers to bad requests, and 405 for the other methods of
    their paths; returns the handler of HTTP errors, for the page mounted at / to answer its own errors alike."""
    from fastapi import File, Request, UploadFile
    from starlette.exceptions import HTTPException as StarletteHTTPException

    http_error = add_error_answers(app)
    for path, allowed in API_METHODS.items():
        _answer_wrong_methods(app, path, allowed)

    async def health() -> dict:
        return service.health()

    # one route a method: FastAPI names a route's operation after its first method, so GET and HEAD on one route
    # share an id, which it warns of on every /docs; HEAD, which HTTP implies, stays out of the schema
    app.get("/health")(health)
    app.head("/health", include_in_schema=False)(health)

    @app.post("/predict")
    async def predict(
        request: Request, file: Annotated[UploadFile, File(description=f"the photo: {ACCEPTED}")]
    ) -> dict:
        given = len((await request.form()).getlist("file"))  # the form FastAPI read (kept on the request)
        if given > 1:  # FastAPI hands over the last of them: the others would go unanswered without a word
            raise StarletteHTTPException(
                400,
                f"the form holds {given} files in the field 'file', and /predict answers one photo a request; "
                "send each photo in a request of its own",
            )
        data = await file.read()
        if len(data) > max_bytes:  # a multipart body within the limit cannot hold more, but be sure
            raise StarletteHTTPException(413, too_large_message(max_bytes))  # answered by _http_error
        return await service.classify_async(data, safe_name(file.filename))

    return http_error


def add_error_answers(app):
    """The app's answers to a malformed form, an HTTP error (400, 404, 413, ...) and a photo that cannot be read, each
    {"error": ...} saying what is accepted; returns the handler of HTTP errors."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

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
        # e.g. the multipart parser's "Invalid multipart data" (a message of ours that names the field says it already)
        if request.url.path == "/predict" and err.status_code == 400 and "'file'" not in message:
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

    @app.exception_handler(PhotoError)
    async def _bad_photo(request: Request, err: PhotoError):
        status = {"empty": 400, "too large": 413}.get(err.kind, 415)  # 415: not a media type we can read
        return JSONResponse({"error": str(err)}, status_code=status)

    return _http_error


def _answer_wrong_methods(app, path: str, allowed: tuple[str, ...]) -> None:
    """405 with an Allow header for the methods of `path` that the API does not answer; OPTIONS answered with the
    Allow header alone (it fell through to the page's 404, as if the path were not there)."""
    from fastapi import Request, Response
    from fastapi.responses import JSONResponse

    others = [m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE") if m not in allowed]
    allow = ", ".join((*allowed, "OPTIONS"))

    async def _wrong_method(request: Request):
        how = (
            " with the photo in the form field 'file' (e.g. curl -F file=@photo.jpg URL/predict)"
            if "POST" in allowed
            else ""
        )
        return JSONResponse(
            {"error": f"{request.url.path} does not answer {request.method}; send {' or '.join(allowed)}{how}"},
            status_code=405,
            headers={"Allow": allow},
        )

    async def _options() -> Response:
        return Response(status_code=204, headers={"Allow": allow})

    app.add_api_route(path, _wrong_method, methods=others, include_in_schema=False)
    app.add_api_route(path, _options, methods=["OPTIONS"], include_in_schema=False)
