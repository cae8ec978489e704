"""`foodvit serve` and `foodvit export-space`: the real server (uvicorn, FastAPI, Gradio) in its own
process on 127.0.0.1, a tiny run trained here, real HTTP requests. Needs the serve extra."""

import io
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install -e '.[test]'")

from conftest import REAL_DATA, UPLOAD_LIMIT_MB  # noqa: E402
from helpers import ServerThread, damaged_exif_photo, free_port, needs, server_output, start_server, stop_server  # noqa: E402

from foodvit.cli.main import main  # noqa: E402

pytestmark = needs(
    "fastapi", "gradio", why="the server tests need the serve extra: pip install -e '.[serve]' (make test installs it)"
)


@pytest.fixture(scope="module")
def run(shared_run):
    return shared_run


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # serving run, with an upload limit of UPLOAD_LIMIT_MB


def photos_to_try(run) -> list[Path]:
    """Generated test photos, and real FoodVision Mini photos when FOODVIT_DATA is set."""
    _, photos = run
    chosen = [sorted((photos / "test" / c).iterdir())[0] for c in ("pizza", "steak", "sushi")]
    if REAL_DATA and (Path(REAL_DATA) / "test").is_dir():
        chosen += [sorted((Path(REAL_DATA) / "test" / c).iterdir())[0] for c in ("pizza", "steak", "sushi")]
    return chosen


def post(url: str, data: bytes, name: str = "photo.jpg", field: str = "file") -> httpx.Response:
    return httpx.post(url + "/predict", files={field: (name, data, "application/octet-stream")}, timeout=60)


def test_health_names_the_model_and_its_classes(server):
    answer = httpx.get(server + "/health").json()
    assert answer["status"] == "ok" and answer["classes"] == ["pizza", "steak", "sushi"]
    assert "tiny recipe" in answer["model"] and "parameters" in answer["model"]


def test_predict_answers_as_foodvit_predict_does(server, run, capsys):
    out, _ = run
    photos = photos_to_try(run)
    capsys.readouterr()
    assert main(["predict", str(out), *map(str, photos), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    for photo, cli in zip(photos, expected, strict=True):
        response = post(server, photo.read_bytes(), photo.name)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert set(answer) >= {"label", "probabilities", "top_k", "seconds"}
        assert answer["label"] == cli["label"] and [label for label, _ in answer["top_k"]] == [
            label for label, _ in cli["top_k"]
        ]
        for name, p in cli["probabilities"].items():
            assert answer["probabilities"][name] == pytest.approx(p, abs=1e-6)
        assert 0 < answer["seconds"] < 30


def _bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (10_000, 9_000)).save(buffer, format="PNG")  # 90 megapixels in a few kilobytes
    return buffer.getvalue()


def _truncated(photo: Path) -> bytes:
    data = photo.read_bytes()
    return data[: len(data) // 2]


def _png(picture) -> bytes:
    data = io.BytesIO()
    picture.save(data, format="PNG")
    return data.getvalue()  # a 100000 x 1 strip: 400 bytes, gigabytes once scaled to a model's side


BAD_UPLOADS = [
    (
        "not-an-image.jpg",
        lambda p: b"hello, I am text and not a photo" * 20,
        415,
        "is not an image Pillow can read; expected a JPEG",
    ),
    ("empty.jpg", lambda p: b"", 400, "is empty (0 bytes)"),
    ("truncated.jpg", _truncated, 415, "damaged or truncated"),
    (
        "drawing.svg",
        lambda p: b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        415,
        "not an image Pillow can read",
    ),
    (
        "bomb.png",
        lambda p: _bomb(),
        413,
        "is 90 megapixels, over the limit of 50 megapixels (a decompression bomb?); if it is a real photo, resize it",
    ),
    (
        "strip.png",
        lambda p: _png(Image.new("RGB", (100_000, 1))),
        413,
        "is 100000 x 1 px, 100000 times as long as it is wide (at most 20); crop it",
    ),
    (
        "huge.jpg",
        lambda p: np.random.default_rng(0).bytes(int(UPLOAD_LIMIT_MB * 1e6) + 50_000),
        413,
        f"is over the limit of {UPLOAD_LIMIT_MB:g} MB (the server's --max-upload-mb); "
        "if it is a real photo, resize it below the limit",
    ),
]


@pytest.mark.parametrize("name,make,status,message", BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS])
def test_bad_uploads_get_a_4xx_json_error_and_the_server_stays_healthy(server, run, name, make, status, message):
    response = post(server, make(photos_to_try(run)[0]), name)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error and "Traceback" not in error
    assert httpx.get(server + "/health").json()["status"] == "ok"
    good = post(server, photos_to_try(run)[0].read_bytes())
    assert good.status_code == 200 and good.json()["label"] in ("pizza", "steak", "sushi")


def test_malformed_requests_are_4xx_with_what_is_expected(server, run):
    wrong_field = post(server, photos_to_try(run)[0].read_bytes(), field="image")
    assert wrong_field.status_code == 422 and "field 'file'" in wrong_field.json()["error"]
    not_multipart = httpx.post(server + "/predict", content=b"raw bytes", headers={"content-type": "image/jpeg"})
    assert not_multipart.status_code == 422 and "multipart form" in not_multipart.json()["error"]
    hostile = post(server, b"\x00" * 100, name="\x1b[31m" + "x" * 5000 + "\n.jpg")
    error = hostile.json()["error"]
    assert hostile.status_code in (400, 415), error
    assert "\x1b" not in error and "\n" not in error and len(error) < 300

    # a client that lies about the length: the body is counted as it arrives
    def chunks():
        yield (
            b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
        )
        for _ in range(40):
            yield b"0" * 50_000

    streamed = httpx.post(
        server + "/predict", content=chunks(), headers={"content-type": "multipart/form-data; boundary=x"}
    )
    assert streamed.status_code == 413
    assert httpx.get(server + "/health").status_code == 200


def test_forty_concurrent_requests_are_all_answered_alike(server, run):
    photos = photos_to_try(run)
    expected = {p: post(server, p.read_bytes()).json() for p in photos}
    jobs = [photos[i % len(photos)] for i in range(40)]
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda p: post(server, p.read_bytes(), p.name), jobs))
    assert all(a.status_code == 200 for a in answers)
    for photo, answer in zip(jobs, answers, strict=True):
        got = answer.json()
        assert got["label"] == expected[photo]["label"]
        for name, p in expected[photo]["probabilities"].items():
            assert got["probabilities"][name] == pytest.approx(p, abs=1e-5)  # batched or not, the same answer


def test_gradio_api_answers_like_the_json_api(server, run):
    gradio_client = pytest.importorskip("gradio_client")
    photo = photos_to_try(run)[0]
    client = gradio_client.Client(server + "/", verbose=False)
    label, table, _ = client.predict(gradio_client.handle_file(str(photo)), api_name="/classify")
    answer = post(server, photo.read_bytes()).json()
    assert label["label"] == answer["label"]
    shown = {c["label"]: c["confidence"] for c in label["confidences"]}
    for name, p in answer["probabilities"].items():
        assert shown[name] == pytest.approx(p, abs=1e-6)
    assert f"| {answer['label']} | {answer['probability']:.3f} |" in table


def test_the_page_is_served(server):
    page = httpx.get(server + "/")
    assert page.status_code == 200 and "gradio" in page.text.lower()


def test_batcher_batches_concurrent_inputs_and_answers_each_its_own():
    import torch

    import foodvit
    from foodvit.data.preprocess import make_preprocess
    from foodvit.deploy.service import Batcher

    torch.manual_seed(0)
    model = foodvit.create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1).eval()
    predictor = foodvit.Predictor(model, ["a", "b", "c"], make_preprocess(32, (0.5,) * 3, (0.5,) * 3))
    inputs = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    batcher = Batcher(predictor, max_batch=8, max_wait=0.5)
    start = threading.Barrier(8)

    def one(i):
        start.wait()
        return batcher.submit(inputs[i]).result(timeout=30)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(8)))
    batcher.close()
    assert batcher.batches < 8  # collected together, not one forward pass each
    np.testing.assert_allclose(np.stack(answers), predictor.probabilities(inputs), atol=1e-6)
    alone = Batcher(predictor, max_batch=1)
    np.testing.assert_allclose(
        alone.submit(inputs[3]).result(timeout=30), predictor.probabilities(inputs[3:4])[0], atol=1e-6
    )
    alone.close()
    assert alone.batches == 1


def test_serve_refuses_a_missing_incomplete_or_foreign_run_at_start(tmp_path, run, capsys):
    out, _ = run
    assert main(["serve", str(tmp_path / "nowhere")]) == 2
    assert "does not exist; give a run directory" in capsys.readouterr().err
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.json").write_text((out / "config.json").read_text())
    assert main(["serve", str(tmp_path / "unfinished")]) == 2
    assert "no trained model at" in capsys.readouterr().err
    other = tmp_path / "other-version"
    other.mkdir()
    for name in ("model.safetensors", "model.json"):
        (other / name).write_bytes((out / name).read_bytes())
    card = json.loads((other / "model.json").read_text())
    card["model"]["hyper_attention"] = True
    (other / "model.json").write_text(json.dumps(card))
    assert main(["serve", str(other)]) == 2
    err = capsys.readouterr().err
    assert "describes a model this foodvit does not build" in err and "Traceback" not in err


@pytest.mark.slow  # starts a server in another Python
def test_exported_space_runs_offline_and_answers(run, tmp_path):
    out, _ = run
    space = tmp_path / "space"
    assert main(["export-space", str(out), str(space), "--examples", "1"]) == 0
    assert {p.name for p in space.iterdir()} >= {
        "app.py",
        "requirements.txt",
        "README.md",
        "model",
        "examples",
        "foodvit",
    }
    readme = (space / "README.md").read_text()
    assert readme.startswith('---\ntitle: "FoodVision Mini"\n')
    assert "sdk: gradio" in readme and "app_file: app.py" in readme
    assert (
        "torchvision" not in (space / "requirements.txt").read_text()
        and "gradio>=" in (space / "requirements.txt").read_text()
    )
    assert len(list((space / "examples").iterdir())) == 3  # one per class
    published = (space / "model" / "model.json").read_text() + readme
    assert (
        str(run[1]) not in published
        and json.loads((space / "model" / "model.json").read_text())["metrics"]["data"] == run[1].name
    )
    assert main(["export-space", str(out), str(space)]) == 2  # not empty: refused, left as it was
    port = free_port()
    process, url = start_server(
        [sys.executable, "app.py"],
        port,
        cwd=space,
        env={"GRADIO_SERVER_PORT": str(port), "PYTHONPATH": "", "FOODVIT_DATA": ""},
    )
    try:
        photo = sorted((run[1] / "test" / "sushi").iterdir())[0]
        answer = post(url, photo.read_bytes()).json()
        from foodvit.deploy.predictor import Predictor

        expected = Predictor.from_run(out).classify(photo)
        assert answer["label"] == expected["label"]
        assert answer["probabilities"]["sushi"] == pytest.approx(expected["probabilities"]["sushi"], abs=1e-6)
        assert "examples" in httpx.get(url + "/").text or httpx.get(url + "/").status_code == 200
        # a photo whose EXIF block is damaged is answered without Pillow's warning in the Space's log, as the
        # command line's serve answers it
        assert post(url, damaged_exif_photo(tmp_path / "exif.jpg").read_bytes()).status_code == 200
        assert "EXIF" not in server_output(process)
    finally:
        stop_server(process)


def test_wrong_methods_are_405_and_unknown_paths_404_in_the_error_shape(server):
    wrong = httpx.get(server + "/predict")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST, OPTIONS"
    assert wrong.json() == {
        "error": "/predict does not answer GET; send POST with the photo in the form field 'file' "
        "(e.g. curl -F file=@photo.jpg URL/predict)"
    }
    wrong = httpx.post(server + "/health")
    assert wrong.status_code == 405 and wrong.json() == {"error": "/health does not answer POST; send GET or HEAD"}
    assert httpx.head(server + "/health").status_code == 200  # HEAD where GET is (it was 404)
    assert httpx.head(server + "/predict").status_code == 405
    for path, allow in (("/predict", "POST, OPTIONS"), ("/health", "GET, HEAD, OPTIONS")):  # it was the page's 404
        asked = httpx.options(server + path)
        assert (asked.status_code, asked.headers["allow"], asked.content) == (204, allow, b"")
    missing = httpx.get(server + "/nowhere")
    assert (
        missing.status_code == 404 and set(missing.json()) == {"error"} and "POST /predict" in missing.json()["error"]
    )


def _page_error(client, data: bytes, name: str, tmp_path) -> str:
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    (tmp_path / name).write_bytes(data)
    with pytest.raises(AppError) as caught:
        client.predict(handle_file(str(tmp_path / name)), api_name="/classify")
    return str(caught.value)


def test_the_page_answers_bad_photos_with_the_apis_one_line_messages(server, run, tmp_path):
    gradio_client = pytest.importorskip("gradio_client")
    client = gradio_client.Client(server + "/", verbose=False)
    photo = photos_to_try(run)[0]
    for name, make, _status, message in BAD_UPLOADS[
        :6
    ]:  # not the one over the upload size: Gradio refuses it before foodvit sees it
        data = make(photo)
        shown = _page_error(client, data, name, tmp_path)
        assert shown == post(server, data, name).json()["error"], name  # word for word the JSON API's
        assert message in shown and "/tmp" not in shown and "gradio" not in shown.lower() and "\n" not in shown
        assert "remove or replace it" not in shown  # training-data advice has no place here


def test_a_file_beside_the_example_photos_is_not_served(server, run):
    _, photos = run
    example, neighbour = sorted((photos / "test" / "pizza").iterdir())[:2]
    assert httpx.get(f"{server}/gradio_api/file={example.resolve()}").status_code == 200
    assert httpx.get(f"{server}/gradio_api/file={neighbour.resolve()}").status_code in (403, 404)


def test_the_pages_uploads_wait_while_its_upload_folder_is_over_its_budget(run, tmp_path, monkeypatch):
    """Gradio kept any file uploaded to the page, photo or not, for half an hour: an anonymous client could fill
    the disk a request at a time. Over the budget an upload is answered 507, saying when to try again; only the
    page's own files count (another app's in the shared folder would never be deleted, and refuse uploads for good)."""
    import foodvit.deploy.routes as routes
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    out, _ = run
    cache = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    monkeypatch.setattr(routes, "UPLOAD_BUDGET", 50_000)
    app, _ = create_app(Predictor.from_run(out), examples=())
    (cache / "another-app").mkdir(parents=True)
    (cache / "another-app" / "left.bin").write_bytes(b"x" * 200_000)  # not this page's: never counted, never deleted

    def junk():  # other bytes each time: Gradio keeps one file for uploads of the same bytes
        return {"files": ("junk.bin", os.urandom(40_000), "application/octet-stream")}

    with ServerThread(app) as url:
        assert httpx.post(url + "/gradio_api/upload", files=junk()).status_code == 200
        assert httpx.post(url + "/gradio_api/upload", files=junk()).status_code == 200  # 40 kB held: under 50 kB
        full = httpx.post(url + "/gradio_api/upload", files=junk())  # 80 kB held
        assert full.status_code == 507
        assert full.json()["error"].startswith("the page's upload space is full (0.0476837 MiB of recent uploads)")
        assert httpx.get(url + "/health").status_code == 200  # the API and the page go on
        held = [p for p in cache.rglob("*") if p.is_file() and p.parent.name != "another-app"]
        assert sum(p.stat().st_size for p in held) == 80_000 and len(held) == 2  # the third was never written


@pytest.mark.slow  # uploads through Gradio's client; the fast tier keeps the app, its page included, built in process
# (the JSON API test)
def test_the_page_deletes_uploads_from_its_cache(run, tmp_path, monkeypatch):
    gradio_client = pytest.importorskip("gradio_client")
    import time

    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    out, photos = run
    cache = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    # checked every second, deleted at 3 s old: a loaded machine (CI's 2 cores) may take over a second to answer an
    # upload
    app, _ = create_app(Predictor.from_run(out), examples=(), page_cache=(1, 3))
    uploads = sorted((photos / "test").rglob("*.jpg"))[:3]
    seen, stop = set(), threading.Event()

    def watch():  # every file the cache holds at some moment (each lives >= 3 s, far longer than a look)
        while not stop.is_set():
            seen.update(p for p in cache.rglob("*") if p.is_file())
            stop.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ServerThread(app) as url:
        client = gradio_client.Client(url + "/", verbose=False)
        for photo in uploads:
            client.predict(gradio_client.handle_file(str(photo)), api_name="/classify")
        stop.set()
        watcher.join()
        # each upload, and each attention picture shown, was in the cache (at least one file an upload: on a loaded
        # machine the first may already be deleted when the last is answered)...
        assert len(seen) >= len(uploads)
        deadline = time.monotonic() + 15
        while [p for p in cache.rglob("*") if p.is_file()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in cache.rglob("*") if p.is_file()] == []  # ...and deleted a few seconds after


def test_the_json_api_in_this_process_answers_as_the_predictor(run):
    """The fast tier's look at the HTTP API (the tests against a `foodvit serve` process are slow):
    health, a prediction equal to the Predictor's, a bad photo's 4xx in the error shape."""
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    out, _ = run
    predictor = Predictor.from_run(out)
    app, _ = create_app(predictor, examples=())
    photo = photos_to_try(run)[0]
    with ServerThread(app) as url:
        assert httpx.get(url + "/health").json()["classes"] == ["pizza", "steak", "sushi"]
        answer = post(url, photo.read_bytes(), photo.name).json()
        bad = post(url, b"not a photo", "x.jpg")
    expected = predictor.classify(photo)
    assert answer["label"] == expected["label"]
    for name, p in expected["probabilities"].items():
        assert answer["probabilities"][name] == pytest.approx(p, abs=1e-6)
    assert 400 <= bad.status_code < 500 and "x.jpg" in bad.json()["error"]


def test_an_upload_over_the_limit_behind_the_body_limit_is_refused_by_the_endpoint_too(run):
    """/predict checks the size itself as well (the BodyLimit middleware in front of it answers
    first in a server): the same 413 and message in the error shape."""
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    out, _ = run
    limited, _ = create_app(Predictor.from_run(out), examples=(), page=False, max_upload_mb=0.001)
    with ServerThread(limited.app) as url:  # the FastAPI app without the middleware
        answer = post(url, b"x" * 2_000, "big.jpg")
    assert answer.status_code == 413
    assert answer.json() == {
        "error": "the upload is over the limit of 0.001 MB (the server's --max-upload-mb); if it is "
        "a real photo, resize it below the limit and try again"
    }


def test_two_photos_in_one_request_are_refused_with_a_400_that_says_so(run):
    """One answer a request: a second file in the form is refused, not left unanswered while the last is classified."""
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    out, _ = run
    first, second = photos_to_try(run)[:2]
    app, _ = create_app(Predictor.from_run(out), examples=(), page=False)
    with ServerThread(app) as url:
        both = httpx.post(
            url + "/predict",
            timeout=60,
            files=[("file", (first.name, first.read_bytes())), ("file", (second.name, second.read_bytes()))],
        )
        one = post(url, first.read_bytes(), first.name)
    assert both.status_code == 400
    assert both.json() == {
        "error": "the form holds 2 files in the field 'file', and /predict answers one photo a "
        "request; send each photo in a request of its own"
    }
    assert one.status_code == 200 and "label" in one.json()


def _memory_of(pid: int, stop: threading.Event, peak: list) -> None:
    import psutil

    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        stop.wait(0.02)


@pytest.mark.slow  # starts a server in another Python
def test_forty_tiny_uploads_of_huge_photos_at_once_keep_the_server_within_its_memory(run):
    pytest.importorskip("psutil")
    out, _ = run
    buffer = io.BytesIO()
    Image.new("1", (9_000, 9_000)).save(buffer, format="PNG")  # 81 megapixels in 10 KB
    huge = buffer.getvalue()
    port = free_port()
    # --max-megapixels 89: let them be decoded, to measure the reduced decoding and the budget
    process, url = start_server(
        [
            sys.executable,
            "-m",
            "foodvit",
            "serve",
            str(out),
            "--port",
            str(port),
            "--threads",
            "1",
            "--max-megapixels",
            "89",
            "--no-examples",
        ],
        port,
    )
    import psutil

    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_memory_of, args=(process.pid, stop, peak))
    try:
        before = psutil.Process(process.pid).memory_info().rss
        watcher.start()
        with ThreadPoolExecutor(max_workers=40) as pool:
            answers = list(pool.map(lambda i: post(url, huge, f"huge-{i}.png"), range(40)))
        stop.set()
        watcher.join()
        after = psutil.Process(process.pid).memory_info().rss
        assert [a.status_code for a in answers] == [200] * 40
        assert peak[0] < 1.5e9, (
            f"the server reached {peak[0] / 1e9:.2f} GB"
        )  # 2.3 GB without malloc_trim; before reduced decoding, killed for memory at 14.6 GB
        assert after < before + 0.25e9, (
            f"{after / 1e9:.2f} GB after, {before / 1e9:.2f} GB before"
        )  # given back (2.2 GB without malloc_trim)
    finally:
        stop.set()
        stop_server(process)


def test_serve_says_the_port_is_taken_or_the_host_bad_in_one_line_before_anything(run, capsys):
    import socket

    out, _ = run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(out), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert "serving" not in captured.out
    assert (
        captured.err
        == f"foodvit serve: error: cannot listen on 127.0.0.1:{port}: the port is in use (another server?); "
        "choose another --port\n"
    )
    assert main(["serve", str(out), "--host", "bad..host", "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    assert "serving" not in captured.out and captured.err.count("\n") == 1
    assert (
        captured.err.startswith("foodvit serve: error: --host bad..host: cannot resolve it")
        and "Traceback" not in captured.err
    )
    from foodvit.deploy.serve import listening_socket

    with listening_socket("localhost", 0) as sock:  # the family uvicorn would pick for the name: IPv4
        assert sock.getsockname()[0] == "127.0.0.1"


def test_the_model_card_names_the_data_set_and_its_photos_not_a_path():
    from foodvit.deploy.page import data_name, model_card

    assert data_name("/home/someone/data/pizza_steak_sushi") == "pizza_steak_sushi"
    assert data_name("https://example.org/files/pizza_steak_sushi.zip") == "pizza_steak_sushi"
    assert data_name("C:\\Users\\someone\\pizza_steak_sushi\\") == "pizza_steak_sushi"
    assert data_name("food101:pizza,steak") == "food101:pizza,steak"

    class Card:  # what model_card reads of a Predictor
        classes = ["pizza", "steak", "sushi"]
        preprocess = type("P", (), {"image_size": 32})()
        card = {
            "metrics": {
                "data": "/home/someone/data/pizza_steak_sushi",
                "train_photos": 225,
                "test_n": 75,
                "test_acc": 0.8,
            }
        }

    card = model_card(Card())
    assert (
        "- **training data**: `pizza_steak_sushi`, 225 training photos, 75 test photos" in card and "/home" not in card
    )


def described(classes, **metrics):
    """What model_card and a Space's README read of a Predictor, for these class names and metrics."""
    return type(
        "Described",
        (),
        {"classes": list(classes), "preprocess": type("P", (), {"image_size": 32})(), "card": {"metrics": metrics}},
    )()


@pytest.mark.parametrize(
    "classes",
    [
        ["cats", "dogs"],
        ["mac: cheese", "#1 ramen", "'quoted'", '"double"'],
        ["two\nlines", "back\\slash", "- item", "[a]: b", "&amp; yes"],
    ],
)
def test_a_spaces_settings_are_yaml_a_parser_reads_whatever_the_class_names(classes):
    yaml = pytest.importorskip("yaml")
    from foodvit.deploy.space import _readme

    readme = _readme(described(classes), classes)
    assert readme.startswith("---\n")
    settings = yaml.safe_load(readme.split("---\n")[1])  # `title: foodvit: cats, dogs` was no YAML at all
    assert settings["title"] == f"foodvit: {', '.join(classes[:4])}"  # the first four name the Space
    assert settings["sdk"] == "gradio" and settings["app_file"] == "app.py"


@pytest.fixture(scope="module")
def hostile(shared_run, tmp_path_factory):
    """(run, photos): shared_run's model and photos, classes named as HTML and Markdown (helpers.HOSTILE_CLASSES)."""
    from helpers import renamed_run

    return renamed_run(shared_run, tmp_path_factory.mktemp("hostile"))


def gradio_config(page: str) -> dict:
    """The configuration a Gradio page carries (its components and their values), as the browser reads it."""
    import re

    return json.loads(re.search(r"window\.gradio_config = (.*?);</script>", page, re.S).group(1))


def test_the_page_shows_class_names_as_text_in_its_heading_probabilities_card_and_api_docs(hostile):
    from helpers import HOSTILE_CLASSES, rendered_markdown

    from foodvit.deploy.page import probability_table
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app, run_examples

    predictor = Predictor.from_run(hostile[0])
    examples = run_examples(predictor)
    assert len(examples) == 3  # one a class, from folders named as the classes
    app, _ = create_app(predictor, examples=examples)
    with ServerThread(app) as url:
        config = gradio_config(httpx.get(url + "/").text)
        described = httpx.get(url + "/openapi.json").json()["info"]["description"]  # Markdown on /docs
    shown = [c["props"]["value"] for c in config["components"] if c["type"] == "markdown" and c["props"].get("value")]
    answer = predictor.classify(examples[0])
    for markdown in [*shown, probability_table(answer), described]:
        page = rendered_markdown(markdown)
        assert page.pictures == [] and page.links == [] and "em" not in page.tags, markdown  # had been live <img>s
    names = ", ".join(HOSTILE_CLASSES)
    assert rendered_markdown(shown[0]).text.startswith(f"foodvit: {names}\n")
    assert f"classes: {names}\n" in rendered_markdown(next(m for m in shown if "Model card" in m)).text
    table = rendered_markdown(probability_table(answer))
    assert table.tags.count("td") == 2 * 3 and all(f"\n{name}\n" in table.text for name in HOSTILE_CLASSES)
    assert f"{predictor.name}: {names}" == rendered_markdown(described).text.strip()


def test_an_exported_spaces_readme_shows_class_names_as_text(hostile, tmp_path):
    yaml = pytest.importorskip("yaml")
    from helpers import HOSTILE_CLASSES, rendered_markdown

    space = tmp_path / "space"
    assert main(["export-space", str(hostile[0]), str(space), "--examples", "1"]) == 0
    _, header, body = (space / "README.md").read_text().split("---\n", 2)
    names = ", ".join(HOSTILE_CLASSES)
    assert yaml.safe_load(header)["title"] == f"foodvit: {names}"
    readme = rendered_markdown(body)  # as Hugging Face shows it: the names had been live <img>s, one fetched elsewhere
    assert readme.pictures == [] and readme.links == [] and "em" not in readme.tags
    assert readme.text.startswith(f"foodvit: {names}\n") and f"to tell {names} apart" in readme.text
    assert f"classes: {names}\n" in readme.text


def test_a_spaces_examples_are_named_after_their_class_when_its_photos_sit_in_subfolders(shared_run, tmp_path, capsys):
    from helpers import CLASSES, renamed_run

    run, _ = renamed_run(shared_run, tmp_path, CLASSES, sub="phone")  # test/pizza/phone/000.jpg, ...
    assert main(["export-space", str(run), str(tmp_path / "my space"), "--examples", "1"]) == 0
    assert f"cd '{tmp_path / 'my space'}' && python app.py" in capsys.readouterr().out  # pasted as one path
    names = sorted(p.name for p in (tmp_path / "my space" / "examples").iterdir())
    assert names == ["00-pizza.jpg", "01-steak.jpg", "02-sushi.jpg"]  # they had all been named 0x-phone.jpg


@pytest.mark.parametrize("where", ["an image elsewhere", "/dev/zero", "/etc/hostname"])
def test_the_page_api_refuses_a_path_it_did_not_upload(server, run, tmp_path, where):
    """A client names the file in a call to the page's API: a path the page did not receive (another photo on the
    server, a device that never ends, any file) is refused without reading it, and the server stays healthy."""
    if where == "an image elsewhere":
        where = str(tmp_path / "private.png")
        Image.new("RGB", (64, 64), (200, 30, 30)).save(where)
    call = httpx.post(
        f"{server}/gradio_api/call/classify",
        json={"data": [{"path": where, "meta": {"_type": "gradio.FileData"}}]},
        timeout=20,
    )
    assert call.status_code == 200
    events = httpx.get(f"{server}/gradio_api/call/classify/{call.json()['event_id']}", timeout=20).text
    assert "event: error" in events and "not uploaded" in events, events  # refused by Gradio's check, or by foodvit's
    assert "confidences" not in events and "pizza" not in events and "is no longer on the server" not in events
    assert httpx.get(f"{server}/health", timeout=5).status_code == 200


def test_the_command_lines_serving_defaults_are_the_servers():
    # the command line writes them as plain numbers (its help loads no server): they drifted from the library's
    import argparse
    import inspect

    from foodvit.cli.main import build_parser
    from foodvit.data.photos import MAX_PIXELS
    from foodvit.deploy.serve import serve

    parser = build_parser()
    given = vars(parser.parse_args(["serve", "run"]))
    library = inspect.signature(serve).parameters
    for name in ("host", "port", "max_batch", "max_wait_ms", "top_k", "max_upload_mb", "max_megapixels"):
        assert given[name] == library[name].default, name
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    ceiling = next(a for a in sub._actions if a.dest == "max_megapixels").type
    assert ceiling("89.4") == 89.4 and MAX_PIXELS / 1e6 - 0.1 < 89.4 <= MAX_PIXELS / 1e6
    with pytest.raises(argparse.ArgumentTypeError):
        ceiling("89.5")


def test_the_api_schema_is_made_without_a_warning(run):
    # GET and HEAD /health on one route shared an operation id: FastAPI warned of it on every /docs and /openapi.json
    import warnings

    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app

    app, _ = create_app(Predictor.from_run(run[0]), page=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = app.app.openapi()  # the FastAPI app inside the body limit
    assert set(schema["paths"]) == {"/predict", "/health"} and set(schema["paths"]["/health"]) == {"get"}
