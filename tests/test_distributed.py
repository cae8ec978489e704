"""Training on several processes with torchrun (gloo on the CPU): two single-process "nodes" joined by the c10d
rendezvous train the same run as one process, rank 0 alone writing; a killed rank stops the others with a message
and the run, resumed on three processes, ends as one process's (that run with sharpness-aware minimisation)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, make_photo_folder, report_figures

from foodvit.cli.main import main
from foodvit.data.sampling import EpochSampler, ShardedBatchSampler, make_loader, share, single_photo_share
from foodvit.deploy.predictor import Predictor

# 33 training photos in global batches of 8: the last batch holds one photo, so rank 0's share of
# it is empty; accumulation over 2 batches exercises no_sync. Float32 (--amp false): on a CPU with native bf16,
# autocast's rounding would blur the comparison of two processes with one beyond what their order of sums does
ARGS = ["--recipe", "tiny", "--image-size", "32", "--depth", "2", "--batch-size", "8", "--accum-steps", "2", "--quiet"]
ARGS += ["--amp", "false"]
TIMINGS = ("seconds", "images_per_s", "model_share")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m", "foodvit", "train"]


def metrics(run: Path) -> list[dict]:
    with (run / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if k not in TIMINGS} for row in csv.DictReader(f)]


def assert_same_metrics(a: Path, b: Path, rel: float = 1e-4) -> None:
    rows_a, rows_b = metrics(a), metrics(b)
    assert len(rows_a) == len(rows_b) and rows_a
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            if row_a[key] == "" or row_b[key] == "":
                assert row_a[key] == row_b[key], key
            else:
                x, y = float(row_a[key]), float(row_b[key])
                assert abs(x - y) <= rel * max(abs(x), abs(y), 1e-12), (key, row_a["epoch"], x, y)


def assert_same_predictions(a: Path, b: Path, photos: Path) -> None:
    test_photos = sorted(photos.glob("test/*/*.jpg"))
    first, second = (Predictor.from_run(run).classify_many(test_photos) for run in (a, b))
    assert [r["label"] for r in first] == [r["label"] for r in second]
    for r, s in zip(first, second, strict=True):
        for name, p in r["probabilities"].items():
            assert abs(p - s["probabilities"][name]) < 1e-4


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=11, n_test=5, size=(36, 40))


@pytest.fixture(scope="module")
def one_process(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "one"
    with report_figures():  # compared file for file with torchrun's run, whose rank 0 draws them
        assert main(["train", *ARGS, "--data", str(photos), "--epochs", "2", "--out", str(out)]) == 0
    return out


def test_global_batches_are_cut_into_shares_that_add_up_to_the_one_process_batches():
    one = list(ShardedBatchSampler(EpochSampler(19, seed=3, per_sample_seeds=True), 8))
    for world in (2, 3, 5):
        shares = [
            list(ShardedBatchSampler(EpochSampler(19, seed=3, per_sample_seeds=True), 8, rank, world))
            for rank in range(world)
        ]
        assert all(len(s) == len(one) for s in shares)  # every rank takes part in every step
        for step, batch in enumerate(one):
            assert [item for rank in range(world) for item in shares[rank][step]] == batch
    assert [len(b) for b in one] == [8, 8, 3]
    # which cuts give some rank a single photo in a step (a teacher at 32 px or less cannot train on it)
    assert single_photo_share(17, 8) and not single_photo_share(19, 8) and not single_photo_share(16, 8)
    assert single_photo_share(19, 8, world_size=2) and single_photo_share(
        16, 8, world_size=5
    )  # a last 3 as 1 + 2; 8 as 1 + 2 + ...
    assert not single_photo_share(20, 8, world_size=2) and single_photo_share(
        5, 1
    )  # 20 as 4 + 4; batches of one asked for
    # evaluation: contiguous parts without padding, each photo once
    assert [share(10, r, 4) for r in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    parts = [list(make_loader(list(range(10)), 3, train=False, rank=r, world_size=4).sampler) for r in range(4)]
    assert sum(parts, []) == list(range(10))


@pytest.mark.slow  # torchrun starts a Python for each rank; the sharding itself is tested above
def test_two_processes_joined_by_the_c10d_rendezvous_train_the_run_of_one_and_only_rank_0_writes(
    photos, one_process, tmp_path
):
    # two single-process "nodes" (each its own torchrun) joined by the c10d rendezvous: the run of one process, written
    # by rank 0 alone. torchrun --standalone's processes are the killed-rank test's below, on 2 then 3 processes, whose
    # resumed run ends as one process's too
    port = free_port()
    command = torchrun(
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        "foodvit-test",
        "--max_restarts",
        "0",
    ) + [*ARGS, "--data", str(photos), "--epochs", "2", "--out", "two"]
    work = tmp_path / "work"
    work.mkdir()
    nodes = [
        subprocess.Popen(command, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    two = work / "two"
    assert sorted(os.listdir(work)) == ["two"]  # nothing else written by either rank
    assert sorted(os.listdir(two)) == sorted(os.listdir(one_process))
    assert sum(out.count("test accuracy") for out, _ in outputs) == 1  # rank 0 speaks
    assert sum(err.count("run directory: two") for _, err in outputs) == 1
    assert (two / "config.json").read_text().replace(str(photos), "P") == (
        one_process / "config.json"
    ).read_text().replace(str(photos), "P")
    assert_same_metrics(one_process, two)
    assert_same_predictions(one_process, two, photos)
    assert "2 processes" in (two / "report.md").read_text()


@pytest.mark.slow  # torchrun starts a Python for each rank; test_pretrain.py and test_contrast.py: both, one process
def test_two_processes_pre_train_then_train_with_instance_discrimination_and_an_empty_share(photos, tmp_path):
    # one launch for both stages that change under torchrun: the self-supervised pre-training first, then epochs
    # with instance discrimination, each compared with one process's run of the same settings
    args = [
        *ARGS,
        "--stem",
        "conv",
        "--pool",
        "seq",
        "--pos-embed",
        "sincos2d",
        "--pretrain-epochs",
        "2",
        "--contrast",
        "0.5",
        "--epochs",
        "1",
        "--data",
        str(photos),
    ]
    with report_figures():  # as torchrun's rank 0 draws them
        assert main(["train", *args, "--out", str(tmp_path / "one")]) == 0
    done = subprocess.run(
        torchrun("--standalone", "--nproc_per_node", "2") + [*args, "--out", "two"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one"))
    losses = [
        [float(row.split(",")[1]) for row in (tmp_path / run / "pretraining.csv").read_text().splitlines()[1:]]
        for run in ("one", "two")
    ]
    # pre-training: each process draws its own share's masks, so the losses are close to one process's, not equal
    assert len(losses[1]) == 2 and losses[1] == pytest.approx(losses[0], rel=0.05) and losses[1] != losses[0]
    # instance discrimination: the second view passes the ViT on every process, rank 0's empty share of the last
    # batch included, so DistributedDataParallel sees every parameter used; each share's negatives are its own
    # photos, half as many as one process's, so the contrast is an easier task there and the objective lower
    (one,), (two,) = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert float(two["train_objective"]) < float(one["train_objective"]) - 0.2
    assert float(two["train_loss"]) == pytest.approx(float(one["train_loss"]), rel=0.05)  # the cross-entropy's share


# torchrun's SIGTERM, which follows when a process exits, at four moments of rank 0's life (a Context of two
# processes without a process group: the handler and the teardown are this module's own code)
SIGTERM_SCENARIO = """
import os, signal, sys
import torch.distributed as dist
from foodvit.errors import FoodVitError
from foodvit.training.distributed import Context
ctx = Context(rank=0, world_size=2)
ctx._stop_cleanly_on_sigterm()
when = sys.argv[1]
if when == "teardown":  # leaving the process group after the loss is when the signal comes
    dist.is_initialized = lambda: True
    dist.destroy_process_group = lambda: os.kill(os.getpid(), signal.SIGTERM)
try:
    if when == "training":
        os.kill(os.getpid(), signal.SIGTERM)
    if when == "every rank":  # an error raised on every rank at once: the first to exit brings the signal
        ctx.gather = lambda message: [None, message]
        ctx.share_error("rank 1: the photos are not there")
    with ctx.collective():
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500. More text")
except FoodVitError as err:
    if when in ("message", "every rank"):  # while the message is on its way
        os.kill(os.getpid(), signal.SIGTERM)
    ctx.close()
    print(err)
print("default handler back:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


# Each moment runs in a process of its own (it changes the process's signal handlers and torch.distributed), forked
# from one Python that imported PyTorch once, still single-threaded: the scenario's output and exit status, by moment
FORKS = """
import json, os, sys, traceback
import foodvit.training.distributed  # torch.distributed and the Context, imported before the forks
scenario, folder, statuses = sys.argv[1], sys.argv[2], {}
for when in sys.argv[3:]:
    pid = os.fork()
    if pid == 0:
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(os.path.join(folder, f"{when}.{name}"), os.O_WRONLY | os.O_CREAT), fd)
        sys.argv = ["-c", when]
        code = 0
        try:
            exec(scenario, {"__name__": "__main__"})
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:  # the child never returns into the loop that forks the other moments
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    statuses[when] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(statuses))
"""
MOMENTS = ("training", "message", "teardown", "every rank")


@pytest.fixture(scope="module")
def sigterm_scenarios(tmp_path_factory) -> dict:
    """{moment: (exit status, stdout, stderr)} of SIGTERM_SCENARIO at each of MOMENTS."""
    folder = tmp_path_factory.mktemp("sigterm")
    done = subprocess.run(
        [sys.executable, "-c", FORKS, SIGTERM_SCENARIO, str(folder), *MOMENTS],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    statuses = json.loads(done.stdout)
    return {
        when: (statuses[when], (folder / f"{when}.out").read_text(), (folder / f"{when}.err").read_text())
        for when in MOMENTS
    }


@pytest.mark.parametrize(
    "when, message",
    [
        ("training", "rank 0: stopped by the launcher (torchrun ends every process when one fails)"),
        (
            "message",
            "rank 0: lost contact with the other training processes (Connection closed by peer [127.0.0.1]:29500)",
        ),
        (
            "teardown",
            "rank 0: lost contact with the other training processes (Connection closed by peer [127.0.0.1]:29500)",
        ),
        ("every rank", "rank 1: the photos are not there"),
    ],
)
def test_torchruns_sigterm_stops_a_rank_once_and_never_cuts_off_its_message(sigterm_scenarios, when, message):
    # before a peer is lost, SIGTERM stops the rank with its own message; after, the rank is already stopping
    # with a better one, which a second error must not replace nor the default handler end unprinted
    status, out, err = sigterm_scenarios[when]
    assert status == 0, (status, err[-2000:])
    assert out.splitlines() == [message, "default handler back: True"]


def _children(pid: int) -> list[int]:
    """Every descendant process of pid (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *_children(kid)]
    return found


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e[5:] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


@pytest.mark.slow  # torchrun on 2, then 3 processes
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the ranks' processes through Linux's /proc")
def test_a_killed_rank_stops_the_other_with_a_message_and_resume_finishes_the_run(tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=30, n_test=4, size=(36, 40))
    # with sharpness-aware minimisation: its second pass, on 2 then 3 processes with uneven shares and
    # accumulation, must give the one-process run's steps too (each process moves the weights the same way)
    args = [*ARGS, "--data", str(photos), "--epochs", "5", "--sam", "0.05"]
    out = tmp_path / "run"
    run = subprocess.Popen(
        torchrun("--standalone", "--nproc_per_node", "2") + [*args, "--out", str(out)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoint.pt").is_file():  # the first epoch is saved
            assert run.poll() is None and time.monotonic() < deadline, "the run ended or stalled before its first epoch"
            time.sleep(0.05)
        victims = [pid for pid in _children(run.pid) if _rank_of(pid) == 1]
        assert victims, "rank 1's process not found"
        os.kill(victims[0], signal.SIGKILL)
        _, err = run.communicate(timeout=120)  # the others stop instead of waiting for rank 1 forever
    finally:
        run.kill()
    assert run.returncode != 0
    messages = [line for line in err.splitlines() if line.startswith("foodvit train: error: rank 0:")]
    assert messages, err[-3000:]
    assert "resume with" in messages[0] and str(out) in messages[0] and "Traceback" not in messages[0]
    rows = metrics(out)
    assert 1 <= len(rows) < 5
    # resumed under torchrun on 3 processes (rank 0 reads the run and hands it to the others), it
    # ends as an uninterrupted one-process run
    resumed = subprocess.run(
        torchrun("--standalone", "--nproc_per_node", "3") + ["--resume", str(out), "--quiet"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert main(["train", *args, "--out", str(tmp_path / "whole")]) == 0
    assert_same_metrics(tmp_path / "whole", out)


@pytest.mark.parametrize(
    "env, says",
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' in the environment is not a whole number"),
        ({"WORLD_SIZE": "2", "RANK": "5"}, "RANK=5, LOCAL_RANK=0 and WORLD_SIZE=2 in the environment are no process"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 in the environment, but not MASTER_ADDR and MASTER_PORT"),
    ],
)
def test_torchruns_variables_set_wrong_by_hand_are_one_line(photos, tmp_path, monkeypatch, capsys, env, says):
    # these once ended in a traceback from int() or from the process group's env:// rendezvous
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    argv = ["train", "--data", str(photos), "--out", str(out), "--recipe", "tiny", "--epochs", "1", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "start the processes with torchrun" in err[-1] and "Traceback" not in "".join(err)
    assert not out.exists()


def test_a_rank_that_cannot_meet_the_others_says_so_in_one_line(photos, tmp_path):
    """Rank 1 of 2 with nobody listening where the ranks meet: one line once --dist-timeout has passed."""
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    argv = ["train", "--data", str(photos), "--out", str(tmp_path / "run"), "--recipe", "tiny", "--epochs", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "foodvit", *argv, "--quiet", "--dist-timeout", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        "rank 1: could not meet the other training processes at 127.0.0.1:" in last and "Traceback" not in done.stderr
    )
