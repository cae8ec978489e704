"""Data sources, safe unpacking, photo decoding and bad input."""

import http.server
import pickle
import threading
import time
import warnings
import zipfile

import pytest
import torch
from helpers import make_photo, make_photo_folder
from PIL import Image

from foodvit.data.datasets import MemoryBudget, PhotoCache, PhotoDataset, open_dataset
from foodvit.data.datasource import DataSource
from foodvit.data.folders import class_names, scan
from foodvit.data.photos import PhotoError, load_or_explain, load_rgb
from foodvit.data.preprocess import make_preprocess
from foodvit.data.sampling import Collate, EpochSampler, make_loader
from foodvit.data.sources import DEFAULT_URL, default_source, resolve
from foodvit.data.transforms import batch_mixer, train_transform
from foodvit.errors import DataError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FOODVIT_DATA", raising=False)


def _zip(folder, zip_path, prefix=""):
    with zipfile.ZipFile(zip_path, "w") as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                z.write(path, prefix + str(path.relative_to(folder)))
    return zip_path


def test_folder_source_is_scanned(tmp_path):
    root = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    ds = open_dataset(root)
    assert ds.classes == ("pizza", "steak", "sushi")
    assert len(ds.train) == 12 and len(ds.test) == 6
    assert ds.train.counts() == {"pizza": 4, "steak": 4, "sushi": 4}


@pytest.mark.parametrize("prefix", ["", "pizza_steak_sushi/"])
def test_local_zip_is_unpacked_once(tmp_path, prefix):
    root = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    archive = _zip(root, tmp_path / "set.zip", prefix)
    first = resolve(archive)
    assert (first / "train" / "pizza").is_dir()
    stamp = (first / "train" / "pizza" / "000.jpg").stat().st_mtime_ns
    again = resolve(archive)
    assert again == first and (again / "train" / "pizza" / "000.jpg").stat().st_mtime_ns == stamp


def test_an_unpacked_zip_changed_since_is_unpacked_again(tmp_path):
    """A split folder removed from the cache blamed the user's good zip ("holds no train/ and test/ folders") for
    good; a photo removed from it trained on one photo fewer, silently."""
    import shutil

    root = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    archive = _zip(root, tmp_path / "set.zip")
    first = resolve(archive)
    shutil.rmtree(first / "test")
    assert (resolve(archive) / "test" / "sushi" / "000.jpg").is_file()
    (first / "train" / "pizza" / "001.jpg").unlink()
    (first / "train" / "steak" / "000.jpg").write_bytes(b"cut short")
    assert resolve(archive) == first
    assert sorted(p.relative_to(first) for p in first.rglob("*.jpg")) == sorted(
        p.relative_to(root) for p in root.rglob("*.jpg")
    )
    assert (first / "train" / "steak" / "000.jpg").read_bytes() == (root / "train" / "steak" / "000.jpg").read_bytes()


def _resolve_when_told(archive, go, answers):
    go.wait()
    try:
        answers.put(str(resolve(archive)))
    except Exception as err:  # the test names it
        answers.put(f"{type(err).__name__}: {err}")


def test_two_processes_unpacking_one_zip_at_once_both_get_its_folder(tmp_path, monkeypatch):
    """The second process's rename met the first's folder (Errno 39, Directory not empty), which was called a damaged
    zip; and for a download, its cached copy was then removed."""
    import multiprocessing

    root = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    archive = _zip(root, tmp_path / "set.zip")
    with zipfile.ZipFile(archive, "a") as z:  # members enough that both processes are unpacking at once
        for i in range(3000):
            z.writestr(f"notes/{i}.txt", b"x")
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))  # the processes' own, as this test's
    context = multiprocessing.get_context("spawn")
    go, answers = context.Event(), context.Queue()
    processes = [context.Process(target=_resolve_when_told, args=(archive, go, answers)) for _ in range(2)]
    for process in processes:
        process.start()
    time.sleep(1.0)  # both waiting at the start line
    go.set()
    got = [answers.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert got[0] == got[1] and (tmp_path / "cache").as_posix() in got[0], got
    assert sorted(p.name for p in (tmp_path / "cache" / "data").iterdir()) == [got[0].split("/")[-1]]


@pytest.mark.parametrize("member", ["../evil.txt", "/tmp/evil-abs.txt", "train/../../evil2.txt"])
def test_zip_with_escaping_member_is_refused_and_writes_nothing(tmp_path, member):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("train/pizza/a.jpg", b"x")
        z.writestr(member, b"owned")
    with pytest.raises(DataError, match="unsafe member"):
        resolve(archive)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "bad.zip"]
    assert written == []  # nothing unpacked, inside the cache or out of it
    assert not (tmp_path.parent / "evil.txt").exists()
    if member.startswith("/"):
        import pathlib

        assert not pathlib.Path(member).exists()


def test_a_zip_python_cannot_unpack_is_named_in_one_line_and_leaves_nothing(tmp_path):
    """A password-protected zip (zipfile's RuntimeError) and one compressed as Deflate64 (NotImplementedError) gave
    tracebacks."""

    def patched(path, local: int, central: int, value: int) -> None:
        """The zip's one member's field at these offsets of its local and central headers set to value."""
        data = bytearray(path.read_bytes())
        for signature, offset in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
            at = data.index(signature) + offset
            data[at : at + 2] = value.to_bytes(2, "little")
        path.write_bytes(bytes(data))

    encrypted = tmp_path / "locked.zip"
    with zipfile.ZipFile(encrypted, "w") as z:
        z.writestr("train/pizza/a.jpg", b"x")
    patched(encrypted, 6, 8, 0x1)  # the encryption flag: zipfile asks for a password to read the member
    with pytest.raises(DataError, match=r"locked\.zip cannot be unpacked by Python's zipfile \(.*password.*\): a "):
        resolve(encrypted)
    deflate64 = tmp_path / "deflate64.zip"
    with zipfile.ZipFile(deflate64, "w") as z:
        z.writestr("train/pizza/a.jpg", b"x")
    patched(deflate64, 8, 10, 9)  # compression method 9, Deflate64
    with pytest.raises(DataError, match=r"deflate64\.zip cannot be unpacked .*unpack it yourself and pass the folder"):
        resolve(deflate64)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] in (
        ["locked.zip", "deflate64.zip"],
        ["deflate64.zip", "locked.zip"],
    )


def test_zip_without_train_and_test_is_explained_and_one_of_class_folders_is_a_folder_of_classes(tmp_path):
    archive = tmp_path / "flat.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("photos/pizza/a.jpg", b"x")
        z.writestr("photos\\steak\\b.jpg", b"y")  # as a zip written on Windows names it: a file 'photos\steak\b.jpg'
    with pytest.raises(DataError, match=r"flat\.zip holds no train/ and test/ folders.*ImageFolder"):
        DataSource.parse(str(archive)).listed()
    # a validation source, or photos to evaluate: "a .zip of either" was refused as a set without its splits
    assert sorted(p.name for p in resolve(archive).iterdir()) == ["pizza", "steak"]
    mac = tmp_path / "mac.zip"  # as a Mac's Finder writes it: the class folders, and __MACOSX/ beside them
    with zipfile.ZipFile(mac, "w") as z:
        z.writestr("pizza/a.jpg", b"x")
        z.writestr("steak/b.jpg", b"y")
        z.writestr("__MACOSX/pizza/._a.jpg", b"")
    assert class_names(resolve(mac)) == ("pizza", "steak")  # __MACOSX was a class


def test_missing_folder_and_non_zip_file(tmp_path):
    with pytest.raises(DataError, match=r"nowhere does not exist.*train/<class>"):
        resolve(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="not a zip"):
        resolve(tmp_path / "notes.txt")
    (tmp_path / "only_train" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"only_train has no test/ folder"):
        open_dataset(tmp_path / "only_train")


def test_empty_class_folder_is_named(tmp_path):
    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    (root / "train" / "ramen").mkdir()
    (root / "test" / "ramen").mkdir()
    with pytest.raises(DataError, match=r"class folder .*train/ramen has no readable photos"):
        open_dataset(root)


def test_train_test_class_mismatch_is_named(tmp_path):
    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    make_photo(root / "train" / "ramen" / "x.jpg", (0, 0, 255))
    with pytest.raises(DataError, match=r"only in train/: \['ramen'\]; only in test/: none"):
        open_dataset(root)
    # the classes asked for alone: ramen, in train/ only, was refused though left out
    from foodvit.data.datasource import DataSource

    listed = DataSource.parse(f"{root}:pizza,steak").listed()
    assert listed.train.classes == listed.test.classes == ("pizza", "steak")


def test_corrupt_and_non_image_files_are_skipped_with_their_names(tmp_path, recwarn):
    root = make_photo_folder(tmp_path / "p", n_train=3, n_test=1)
    (root / "train" / "pizza" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (root / "train" / "steak" / "notes.txt").write_text("bought at the market")
    good = root / "train" / "sushi" / "000.jpg"
    (root / "train" / "sushi" / "truncated.jpg").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    ds = open_dataset(root, train_cache=PhotoCache.decoded(64))
    skipped = " ".join(ds.train.skipped)
    assert "broken.jpg" in skipped and "notes.txt" in skipped and "truncated.jpg" in skipped
    assert len(ds.train) == 9 and len(ds.train.skipped) == 3
    # one clean summary line, the list only when verbose; no raw warnings echoing source code
    [summary] = ds.train.skipped_summary()
    assert summary.startswith("skipped 3 unreadable file(s) in ") and "and 2 more (--verbose lists them)" in summary
    assert len(ds.train.skipped_summary(verbose=True)) == 3
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    with pytest.raises(DataError, match=r"unreadable file .*broken\.jpg.* and 2 more; --strict refuses them"):
        open_dataset(root, strict=True)
    # cut in its pixels, its header whole: with the cache off, or once it is full, such a photo was kept, and ended
    # training in its first epoch
    (root / "train" / "sushi" / "cut.jpg").write_bytes(good.read_bytes()[:-100])
    for cache in (None, PhotoCache.decoded(64, keep=False), PhotoCache.decoded(64, budget=MemoryBudget(1e-9))):
        ds = open_dataset(root, train_cache=cache)  # None: training's --no-cache
        assert len(ds.train) == 9 and "cut.jpg" in " ".join(ds.train.skipped)
        assert cache is None or cache.items == {}


def test_hidden_folders_are_not_scanned(tmp_path):
    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    make_photo(root / "train" / "pizza" / ".thumbs" / "small.jpg", (1, 2, 3))
    (root / "train" / "pizza" / ".ipynb_checkpoints").mkdir()
    (root / "train" / "pizza" / ".ipynb_checkpoints" / "x.txt").write_text("not a photo")
    split = scan(root / "train")
    assert len(split) == 6 and split.skipped == ()
    assert not any(".thumbs" in str(path) for path, _ in split.samples)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow warns, then foodvit refuses
@pytest.mark.parametrize("entry_point_policy", [False, True], ids=["library-alone", "after-limit_pixels"])
def test_decompression_bomb_is_refused_by_name_and_skipped_in_a_folder(tmp_path, monkeypatch, entry_point_policy):
    """Refused from its header whether or not an entry point set the process-wide policy (Pillow's
    limit, its bomb warning an error): the test sets each state itself, as another test in the same
    process may have left either."""
    from foodvit.data import photos

    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    bomb = root / "train" / "steak" / "bomb.png"
    Image.new("1", (10_000, 9_000)).save(bomb)  # 90 megapixels in a few kilobytes
    assert bomb.stat().st_size < 200_000
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        if entry_point_policy:
            photos.limit_pixels()
        size = (
            "" if entry_point_policy else "10000 x 9000 = "
        )  # Pillow refuses first under the policy: no size in its error
        with pytest.raises(PhotoError, match=rf"bomb\.png is {size}90 megapixels, over the limit of 50"):
            load_or_explain(bomb)
        split = scan(root / "train")
    assert len(split) == 6 and "bomb.png" in split.skipped[0] and "megapixels" in split.skipped[0]


def test_photos_of_every_mode_become_rgb(tmp_path):
    for mode in ("L", "RGBA", "CMYK", "P", "LA", "I;16", "1"):
        fmt = "TIFF" if mode in ("CMYK", "I;16") else "PNG"
        path = make_photo(tmp_path / f"{mode.replace(';', '_')}.{fmt.lower()}", (200, 100, 50), mode=mode, fmt=fmt)
        image = load_rgb(path)
        assert image.mode == "RGB" and image.size == (48, 40), mode
    # transparency is laid over white, not black
    clear = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    clear.save(tmp_path / "clear.png")
    assert load_rgb(tmp_path / "clear.png").getpixel((3, 3)) == (255, 255, 255)


def test_16_bit_grayscale_is_stretched_to_8_bits_a_band_at_a_time(monkeypatch):
    """The whole photo as float64, with its temporaries, took over 24 bytes a pixel (a 7000 x 7000 16-bit PNG of
    104 kB raised the server by 1.4 GB); scaled a band of rows at a time, the same pixels."""
    import tracemalloc

    import numpy as np

    from foodvit.data import photos

    rng = np.random.default_rng(0)
    values = rng.integers(300, 60000, size=(1500, 1200), dtype=np.uint16)
    image = Image.fromarray(values)  # mode I;16
    whole = ((values.astype(np.float64) - values.min()) / (values.max() - values.min()) * 255).round().astype(np.uint8)
    monkeypatch.setattr(photos, "BAND", 50_000)  # bands of 41 rows
    tracemalloc.start()
    stretched = photos._to_8bit(image)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stretched.mode == "L" and np.array_equal(np.asarray(stretched), whole)
    assert peak < 6 * values.size  # the array's copy (2 bytes a pixel), the result (1), a band's work: not 24+
    flat = photos._to_8bit(Image.fromarray(np.full((5, 7), 1234, dtype=np.uint16)))
    assert np.asarray(flat).max() == 0 and flat.size == (7, 5)
    # a float TIFF's NaN and infinities: numpy's warnings printed, and every pixel stretched to garbage
    floats = np.array([[0.0, 2.0, np.inf], [np.nan, -np.inf, 1.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        odd = np.asarray(photos._to_8bit(Image.fromarray(floats)))  # mode F
    assert odd.tolist() == [[0, 255, 255], [0, 0, 128]]


def test_exif_orientation_is_applied(tmp_path):
    image = Image.new("RGB", (30, 10), (255, 0, 0))
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    image.save(tmp_path / "phone.jpg", exif=exif)
    assert load_rgb(tmp_path / "phone.jpg").size == (10, 30)


def test_decoded_cache_limits_the_shorter_side(tmp_path):
    path = make_photo(tmp_path / "big.jpg", (10, 20, 30), size=(200, 300))
    cache = PhotoCache.decoded(50)
    tensor = cache.get(path)
    assert tensor.dtype == torch.uint8 and tensor.shape == (3, 50, 75)
    assert cache.get(path) is tensor  # decoded once


def test_validation_split_is_per_class_disjoint_and_reproducible(tmp_path):
    root = make_photo_folder(tmp_path / "p", n_train=10, n_test=1)
    ds = open_dataset(root, val_fraction=0.2, seed=3)
    assert ds.val.counts() == {"pizza": 2, "steak": 2, "sushi": 2}
    assert not set(ds.val.samples) & set(ds.train.samples)
    assert len(ds.train) + len(ds.val) == 30
    assert open_dataset(root, val_fraction=0.2, seed=3).val == ds.val
    assert open_dataset(root, val_fraction=0.2, seed=4).val != ds.val


def test_epoch_sampler_order_depends_only_on_seed_and_epoch():
    a, b = EpochSampler(10, seed=1), EpochSampler(10, seed=1)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b) and sorted(a) == list(range(10))
    b.set_epoch(4)
    assert list(a) != list(b)
    repeated = EpochSampler(5, seed=0, repeats=3)
    assert len(repeated) == 15 and sorted(repeated) == sorted(list(range(5)) * 3)


def test_per_sample_seeds_keep_the_order_and_give_every_position_its_own_seed():
    plain, seeded = EpochSampler(10, seed=1, repeats=2), EpochSampler(10, seed=1, repeats=2, per_sample_seeds=True)
    plain.set_epoch(3)
    seeded.set_epoch(3)
    pairs = list(seeded)
    assert [index for index, _ in pairs] == list(plain)  # the same order as without seeds
    assert len({seed for _, seed in pairs}) == 20  # repeated photos get different seeds too
    assert list(seeded) == pairs  # from (seed, epoch) alone
    seeded.set_epoch(4)
    assert not {seed for _, seed in seeded} & {seed for _, seed in pairs}


def _augmenting_loader(photos, workers, mixer):
    p = make_preprocess(16, (0.5,) * 3, (0.5,) * 3)
    dataset = PhotoDataset(scan(photos / "train"), train_transform(p, "medium"), PhotoCache.decoded(32))
    return make_loader(dataset, 4, train=True, seed=7, workers=workers, mixer=mixer)


def _epoch(loader, epoch):
    loader.batch_sampler.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def _same(a, b):
    return len(a) == len(b) and all(
        torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True)
    )


def test_batches_from_workers_depend_on_neither_their_number_nor_their_history(tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=5)  # 15 photos: batches of 4, 4, 4, 3
    mixer = batch_mixer(3, mixup=0.8, cutmix=1.0)  # drawn in the workers too
    one = _augmenting_loader(photos, 1, mixer)
    assert one.persistent_workers
    first, second = _epoch(one, 0), _epoch(one, 1)  # one worker, kept up between the epochs
    assert not _same(first, second)
    assert _same(_epoch(_augmenting_loader(photos, 2, mixer), 0), first)  # two workers: the same batches
    assert _same(_epoch(_augmenting_loader(photos, 2, mixer), 1), second)  # new workers from epoch 1, as on resume


def test_a_seeded_photo_is_augmented_the_same_way_and_leaves_the_process_stream_alone(tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=2)
    dataset = _augmenting_loader(photos, 0, None).dataset
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    a, b, other = dataset[(0, 123)][0], dataset[(0, 123)][0], dataset[(0, 124)][0]
    assert torch.equal(torch.rand(4), expected)  # dropout etc. in the training process draw as before
    assert torch.equal(a, b) and not torch.equal(a, other)


def test_the_mixing_collate_can_be_sent_to_spawned_workers():
    collate = Collate(batch_mixer(3, mixup=0.8, cutmix=1.0, prob=0.5))
    batch = [(torch.rand(3, 8, 8), label) for label in (0, 1, 2, 1)]
    copy = pickle.loads(pickle.dumps(collate))  # spawn and forkserver pickle the collate function
    torch.manual_seed(5)
    x, y = collate(batch)
    torch.manual_seed(5)
    u, v = copy(batch)
    assert torch.equal(x, u) and torch.equal(y, v) and y.shape == (4, 3)


class _ZipHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    hits = 0
    answers: list = []  # what the next GETs send instead: "half" (the whole length announced), or other bytes

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        answer = type(self).answers.pop(0) if type(self).answers else None
        body = answer if isinstance(answer, bytes) else self.payload
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if answer == "half" else body)

    def log_message(self, *args):
        pass

    def do_HEAD(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()


@pytest.fixture
def zip_url(tmp_path):
    """The URL of a generated FoodVision-like zip served on 127.0.0.1 (_ZipHandler counts the GETs)."""
    root = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    _ZipHandler.payload = _zip(root, tmp_path / "set.zip", "pizza_steak_sushi/").read_bytes()
    _ZipHandler.hits, _ZipHandler.answers = 0, []
    server = http.server.HTTPServer(("127.0.0.1", 0), _ZipHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/data/pizza_steak_sushi.zip"
    server.shutdown()


def test_download_goes_to_the_cache_once(zip_url, tmp_path):
    first = resolve(zip_url, quiet=True)
    assert (first / "test" / "sushi" / "000.jpg").is_file()
    assert resolve(zip_url, quiet=True) == first
    assert _ZipHandler.hits == 1
    assert not list((tmp_path / "cache").rglob("*.part"))


def test_an_address_in_capitals_is_downloaded_not_taken_for_a_missing_folder(zip_url):
    # DataSource.parse accepted HTTP://, then is_missing() and resolve() took it for a path that does not exist
    from foodvit.data.datasource import DataSource

    source = DataSource.parse(zip_url.replace("http://", "HTTP://"))
    assert not source.is_missing() and source.root_at_hand() is None  # fetched when needed, not yet in the cache
    assert (source.root(quiet=True) / "test" / "sushi" / "000.jpg").is_file()
    assert _ZipHandler.hits == 1


def test_a_download_cut_short_or_not_a_zip_is_not_kept_and_the_next_run_fetches_it_again(zip_url, tmp_path):
    """A download whose connection closed early was kept as complete, and a login page served in the zip's place
    stayed in the cache: every later run failed on the same copy ("a damaged zip ... download it again") without
    fetching anything."""
    _ZipHandler.answers = ["half", b"<html>please log in</html>"]
    with pytest.raises(DataError, match=r"the connection closed after [\d,]+ of the [\d,]+ bytes announced; try again"):
        resolve(zip_url, quiet=True)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    with pytest.raises(DataError, match=r"is a damaged zip .*the copy downloaded from http.* is removed: the next run"):
        resolve(zip_url, quiet=True)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert (resolve(zip_url, quiet=True) / "test" / "sushi" / "000.jpg").is_file()  # the third run: the zip
    assert _ZipHandler.hits == 3


def test_a_download_damaged_in_its_compression_method_is_fetched_again_and_one_truly_so_is_kept(zip_url, tmp_path):
    """A bit flipped on the way in the central directory's compression method made zipfile say the method is one it
    does not read: the copy was kept, and every later run blamed a password or Deflate64 on the same copy. A zip
    stored so in both headers is the address's own: fetching it again would not help."""

    def method(payload: bytes, value: int, headers: tuple[bytes, ...]) -> bytes:
        changed = bytearray(payload)
        for signature in headers:  # the first member's compression method in these headers
            at = changed.index(signature) + (8 if signature == b"PK\x03\x04" else 10)
            changed[at : at + 2] = value.to_bytes(2, "little")
        return bytes(changed)

    _ZipHandler.answers = [method(_ZipHandler.payload, 99, (b"PK\x01\x02",))]  # the directory's alone
    with pytest.raises(DataError, match=r"is a damaged zip \(its directory and the header of .* disagree .*is removed"):
        resolve(zip_url, quiet=True)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert (resolve(zip_url, quiet=True) / "test" / "sushi" / "000.jpg").is_file()  # the next run fetches it again
    assert _ZipHandler.hits == 2
    deflate64 = method(_ZipHandler.payload, 9, (b"PK\x03\x04", b"PK\x01\x02"))
    _ZipHandler.answers = [deflate64]
    other = zip_url.replace("pizza_steak_sushi.zip", "deflate64.zip")
    for _ in range(2):
        with pytest.raises(DataError, match=r"cannot be unpacked by Python's zipfile .*unpack it yourself") as refused:
            resolve(other, quiet=True)
        assert "removed" not in str(refused.value)
    assert _ZipHandler.hits == 3  # kept: fetched once


def test_a_downloaded_zip_of_another_layout_is_kept_not_fetched_again(zip_url, tmp_path):
    """Only a download that is damaged or no zip is worth fetching again: one of another layout is the address's own."""
    import io

    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("photos/pizza/a.jpg", b"x")
    _ZipHandler.answers = [other.getvalue()]
    for _ in range(2):
        with pytest.raises(DataError, match="holds no train/ and test/ folders") as refused:
            DataSource.parse(zip_url).listed(quiet=True)
        assert "removed" not in str(refused.value)
    assert _ZipHandler.hits == 1 and len(list((tmp_path / "cache" / "downloads").iterdir())) == 1


def test_a_download_goes_through_the_proxies_of_its_own_time(zip_url, monkeypatch):
    # urllib.request.urlopen keeps the opener (and the proxies) of its first call for the whole process:
    # here that first call came while a proxy nobody listens on was set, as a test of the offline path
    # (test_pretrained) or a user's notebook can leave it. The download after the proxy is gone must not use it.
    import socket
    import urllib.request

    from foodvit.model.pretrained import _probe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(urllib.request, "_opener", None)  # put back as it was after the test
    with monkeypatch.context() as during:
        for var in ("http_proxy", "HTTP_PROXY"):
            during.setenv(var, dead)
        for var in ("no_proxy", "NO_PROXY"):
            during.delenv(var, raising=False)
        urllib.request.install_opener(urllib.request.build_opener())  # what urlopen's first call does
    for var in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    _probe(zip_url)  # pre-trained weights' reachability check: no error
    assert (resolve(zip_url, quiet=True) / "test" / "sushi" / "000.jpg").is_file()
    assert _ZipHandler.hits == 1


def test_unreachable_download_fails_fast_and_leaves_nothing(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(DataError, match=r"could not download .*--data /path/to/folder_or\.zip"):
        resolve(f"http://127.0.0.1:{port}/pizza_steak_sushi.zip", quiet=True)
    assert time.monotonic() - started < 10
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_default_source_is_the_course_zip_unless_foodvit_data_is_set(monkeypatch, tmp_path):
    assert default_source() == DEFAULT_URL
    assert DEFAULT_URL.endswith("mrdbourke/pytorch-deep-learning/raw/main/data/pizza_steak_sushi.zip")
    monkeypatch.setenv("FOODVIT_DATA", str(tmp_path))
    assert default_source() == str(tmp_path)


def test_real_foodvision_mini_is_read(real_data):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the real set has no unreadable files
        ds = open_dataset(real_data)
    assert len(ds.train) == 225 and len(ds.test) == 75
    assert ds.test.counts() == {"pizza": 25, "steak": 19, "sushi": 31}


def test_cross_validation_folds_partition_the_photos_stratified_and_reproducible(tmp_path):
    from foodvit.data.folders import cv_folds

    split = scan(make_photo_folder(tmp_path / "p", n_train=11, n_test=1) / "train")  # 3 classes x 11 photos
    folds = cv_folds(split, 5, seed=0)
    held = [path for _, val in folds for path, _ in val.samples]
    assert sorted(held) == sorted(path for path, _ in split.samples)  # every photo validated exactly once
    assert len(held) == len(set(held))
    for kept, val in folds:
        assert set(kept.samples).isdisjoint(val.samples) and len(kept) + len(val) == len(split)
        assert max(val.counts().values()) - min(val.counts().values()) <= 1  # stratified: classes spread evenly
    assert sorted(len(val) for _, val in folds) == [6, 6, 7, 7, 7]  # 33 photos: fold sizes differ by at most one
    assert [v.samples for _, v in cv_folds(split, 5, seed=0)] == [v.samples for _, v in folds]
    assert [v.samples for _, v in cv_folds(split, 5, seed=1)] != [v.samples for _, v in folds]
    with pytest.raises(DataError, match="2 <= folds <= photos"):
        cv_folds(split, 1, seed=0)


# ------------------------------------------------------------------------------------ Food-101


def make_food101(root, classes=("apple_pie", "pizza", "steak", "sushi"), n_train=10, n_test=4):
    """A small folder in Food-101's layout: images/<class>/<id>.jpg, meta/train.json, meta/test.json."""
    import json

    meta = {"train": {}, "test": {}}
    for c, name in enumerate(classes):
        for split, n, offset in (("train", n_train, 0), ("test", n_test, 500)):
            ids = [f"{name}/{1000 * c + offset + i}" for i in range(n)]
            meta[split][name] = ids
            for i, entry in enumerate(ids):
                make_photo(
                    root / "images" / f"{entry}.jpg", (40 * c + 60, 90, 160 - 30 * c), seed=1000 * c + offset + i
                )
    (root / "meta").mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (root / "meta" / f"{split}.json").write_text(json.dumps(meta[split]))
    (root / "meta" / "classes.txt").write_text("\n".join(classes))
    return root


def test_food101_is_read_from_its_split_files_with_a_class_subset_and_a_training_fraction(tmp_path, monkeypatch):
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    make_food101(tmp_path / "cache" / "food101" / "food-101")
    full = open_dataset("food101")
    assert full.classes == ("apple_pie", "pizza", "steak", "sushi") and len(full.train) == 40 and len(full.test) == 16
    subset = open_dataset("food101:sushi,pizza,steak", train_fraction=0.5, seed=3)
    assert subset.classes == ("pizza", "steak", "sushi")
    assert subset.train.counts() == {"pizza": 5, "steak": 5, "sushi": 5} and subset.test.counts() == {
        "pizza": 4,
        "steak": 4,
        "sushi": 4,
    }
    assert all(path.parent.name == subset.classes[label] for path, label in subset.train.samples + subset.test.samples)
    again = open_dataset("food101:pizza,steak,sushi", train_fraction=0.5, seed=3)
    other = open_dataset("food101:pizza,steak,sushi", train_fraction=0.5, seed=4)
    assert again.train.samples == subset.train.samples and other.train.samples != subset.train.samples
    with pytest.raises(DataError, match=r"no class ramen in .*images; its classes are apple_pie, pizza"):
        open_dataset("food101:pizza,ramen")
    with pytest.raises(DataError, match="names no classes"):
        open_dataset("food101:")


def test_training_on_a_food101_layout_subset(tmp_path, monkeypatch):
    import json

    from foodvit.cli.main import main

    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    make_food101(tmp_path / "cache" / "food101" / "food-101", n_train=8, n_test=3)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--recipe",
                "tiny",
                "--data",
                "food101:pizza,steak,sushi",
                "--train-fraction",
                "0.5",
                "--epochs",
                "1",
                "--image-size",
                "32",
                "--depth",
                "1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    card = json.loads((out / "model.json").read_text())
    assert card["classes"] == ["pizza", "steak", "sushi"]
    assert card["metrics"]["train_photos"] == 12 and card["metrics"]["test_n"] == 9
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["source"] == "food101:pizza,steak,sushi" and config["data"]["train_fraction"] == 0.5


def test_the_photo_cache_keeps_photos_only_within_its_memory_budget(tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=4, size=(40, 48))
    one_photo = 3 * 16 * 19  # decoded to a shorter side of 16 px: (3, 16, 19) uint8
    budget = MemoryBudget(gib=2.5 * one_photo / 2**30)
    cache = PhotoCache.decoded(16, budget=budget)
    ds = open_dataset(photos, train_cache=cache)
    assert len(cache.items) == 2 and cache.full and cache.nbytes() == 2 * one_photo
    uncached = PhotoCache.decoded(16, keep=False)
    for path, _ in ds.train.samples:  # kept or not, the same photo
        assert torch.equal(cache.get(path), uncached.get(path))
    assert len(cache.items) == 2  # a full cache stays as it is


def test_food101_without_internet_says_how_to_use_a_copy(tmp_path, monkeypatch):
    import urllib.error

    import torchvision.datasets

    calls = []

    class Offline:
        def __init__(self, root, split, download):
            calls.append((root, split, download))
            raise urllib.error.URLError("no route to host")

    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torchvision.datasets, "Food101", Offline)
    with pytest.raises(DataError, match=r"could not download Food-101 \(no route to host\).*--data /path/to/food-101"):
        DataSource.parse("food101:pizza").root()
    assert calls == [(str(tmp_path / "cache" / "food101"), "train", True)]  # torchvision's own download, into the cache


def test_a_training_fraction_is_drawn_among_the_photos_and_the_other_files_are_named_as_skipped(tmp_path):
    # it drew among every file: a class of six photos and six notes kept fewer photos than its share, or none
    root = make_photo_folder(tmp_path / "p", n_train=6, n_test=1)
    for name in ("pizza", "steak", "sushi"):
        for i in range(6):
            (root / "train" / name / f"notes{i}.txt").write_text("bought at the market")
    for seed in range(3):
        ds = open_dataset(root, train_fraction=0.5, seed=seed)
        assert ds.train.counts() == {"pizza": 3, "steak": 3, "sushi": 3} and len(ds.train.skipped) == 18


def test_links_to_photos_and_folders_are_followed_and_a_link_to_nothing_is_named_as_skipped(tmp_path):
    # a linked folder inside a class was dropped, as were a link to a deleted photo and a loop, without a word
    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    extra = make_photo_folder(tmp_path / "extra", n_train=3, n_test=1)
    pizza = root / "train" / "pizza"
    (pizza / "more").symlink_to(extra / "train" / "steak")
    (pizza / "again").symlink_to(pizza)  # a loop: read once
    (pizza / "gone.jpg").symlink_to(tmp_path / "deleted.jpg")
    (pizza / "loop.jpg").symlink_to("loop.jpg")
    split = scan(root / "train")
    assert split.counts()["pizza"] == 2 + 3
    assert sorted(line.split(":")[0].rsplit("/", 1)[1] for line in split.skipped) == ["gone.jpg", "loop.jpg"]
    from foodvit.data.folders import walk_photos

    walked = [p.name for p in walk_photos(pizza)]  # predict's walk: the same photos, each once
    assert len(walked) == 2 + 3 + 2 and walked.count("gone.jpg") == 1
    # a folder reached by two names is named by the first in sorted order, whatever order the file system lists
    # them in (training's listing took the file system's: on another disk, other names, draws and study keys)
    for i in range(8):
        make_photo(pizza / f"real{i}" / "x.jpg", (9, 9, i))
        (pizza / f"link{i}").symlink_to(pizza / f"real{i}")
    expected = [f"link{i}/x.jpg" for i in range(8)]
    listed = [str(path.relative_to(pizza)) for path, _ in scan(root / "train").samples if path.name == "x.jpg"]
    assert listed == expected == [str(p.relative_to(pizza)) for p in walk_photos(pizza) if p.name == "x.jpg"]


def test_test_photos_that_are_training_photos_are_said(tmp_path, capsys):
    # the same photo in both splits raised the test accuracy without a word
    from foodvit.cli.main import main
    from foodvit.data.datasets import leaked_test_photos

    root = make_photo_folder(tmp_path / "p", n_train=3, n_test=2)
    for name in ("pizza", "steak"):
        photo = next((root / "train" / name).iterdir())
        (root / "test" / name / f"also-{photo.name}").write_bytes(photo.read_bytes())
    assert sorted(p.name for p in leaked_test_photos(open_dataset(root, quiet=True))) == ["also-000.jpg"] * 2
    assert leaked_test_photos(open_dataset(make_photo_folder(tmp_path / "clean", n_train=3, n_test=2))) == set()
    options = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]
    assert main(["train", "--data", str(root), "--out", str(tmp_path / "run"), *options]) == 0
    said = capsys.readouterr().err  # said, not mended: the photos are the user's to move
    assert "2 of the 8 test photos are also training photos, byte for byte (e.g. " in said


def test_a_class_named_with_its_accents_composed_in_one_split_and_decomposed_in_the_other_is_one_class(tmp_path):
    # "only in train/: ['crème brûlée']; only in test/: ['crème brûlée']": a Mac's folder (NFD) beside a zip's (NFC)
    import unicodedata

    composed = unicodedata.normalize("NFC", "crème brûlée")
    root = make_photo_folder(tmp_path / "p", n_train=2, n_test=1, classes=("pizza", composed))
    (root / "train" / composed).rename(root / "train" / unicodedata.normalize("NFD", composed))
    ds = open_dataset(root, quiet=True)
    assert ds.train.classes == ds.test.classes == (composed, "pizza") and ds.train.counts()[composed] == 2
    make_photo(root / "test" / unicodedata.normalize("NFD", composed) / "x.jpg", (1, 2, 3))
    with pytest.raises(DataError, match="differ only in how their accents are written"):
        open_dataset(root, quiet=True)
