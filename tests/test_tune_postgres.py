"""Two `foodvit tune` processes share one study on a real PostgreSQL server: a server started here
(initdb in a temporary folder as an unprivileged user, 127.0.0.1 on a free port, its socket in the
temporary folder), every trial run once, the study as on SQLite. Skipped, saying why, without
PostgreSQL's programs (failed instead under CI=true: .ci/run installs them) or its driver."""

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import free_port, make_photo_folder, missing_tool

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg", reason="the PostgreSQL driver (psycopg, in the tune extra) is not installed")

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]


def postgres_program(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


class Server:
    """A PostgreSQL server of its own, for a test or a module: its URL, and its stop and start again."""

    def __init__(self, folder: Path, user: dict) -> None:
        self.pg_ctl, self.data, self.folder = postgres_program("pg_ctl"), folder / "data", folder
        self.port = free_port()
        self.run = dict(check=True, capture_output=True, text=True, timeout=120, cwd=folder, **user)
        self.url = f"postgresql://foodvit@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run(
            [
                self.pg_ctl,
                "-D",
                str(self.data),
                "-l",
                str(self.folder / "log"),
                "-w",
                "-t",
                "60",
                "start",
                "-o",
                f"-h 127.0.0.1 -p {self.port} -k {self.folder}",
            ],
            **self.run,
        )

    def stop(self) -> None:  # at once, as a crash or a machine going down would
        stop = [self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, **{**self.run, "check": False})


@contextlib.contextmanager
def started_server():
    """A PostgreSQL server of its own, started for the block, stopped and removed after it."""
    initdb, pg_ctl = postgres_program("initdb"), postgres_program("pg_ctl")
    if not (initdb and pg_ctl):
        missing_tool("PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)")
    # a folder of its own under the system's temporary folder, which an unprivileged user can reach (pytest's is
    # root's alone)
    folder = Path(tempfile.mkdtemp(prefix="foodvit-postgres-"))
    user = {}
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the server runs as nobody, in a folder it owns
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    server = Server(folder, user)
    subprocess.run([initdb, "-D", str(server.data), "-U", "foodvit", "--auth=trust", "-E", "UTF8"], **server.run)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_server():
    """A PostgreSQL server of its own, started for this test alone (which may stop and start it)."""
    with started_server() as server:
        yield server


@pytest.fixture(scope="module")
def postgres():
    """The URL of a PostgreSQL server that this module's tests share, each in studies of its own (none stops it):
    a server's initdb and start cost seconds."""
    with started_server() as server:
        yield server.url


def study_in(folder: Path, url: str):
    """The Optuna study of a tune study's folder in the server at url: the name its storage.json notes."""
    return optuna.load_study(study_name=json.loads((folder / "storage.json").read_text())["study"], storage=url)


@pytest.mark.slow
def test_two_tune_processes_share_a_study_on_a_real_postgresql_server(postgres, tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    study_dir = tmp_path / "study"
    command = [
        sys.executable,
        "-m",
        "foodvit",
        "tune",
        "--data",
        str(photos),
        "--out",
        str(study_dir),
        "--trials",
        "1",
        "--folds",
        "2",
        "--space",
        str(space),
        "--storage",
        postgres,
        *TINY,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    trials = study_in(study_dir, postgres).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]  # as on SQLite
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1  # the starting recipe ran once
    assert sorted(t.user_attrs["dir"] for t in trials) == [
        "trial-0000",
        "trial-0001",
    ]  # every trial in a folder of its own
    for t in trials:  # each trial's folds trained once, in its own folder, bound to its settings
        folder = study_dir / t.user_attrs["dir"]
        assert sorted(p.name for p in folder.glob("fold-*.json")) == ["fold-0.json", "fold-1.json"]
        assert (folder / "trial.json").is_file() and (folder / "cv.json").is_file()
    assert not (study_dir / "study.db").exists()  # the server holds the study


@pytest.mark.slow
def test_a_postgresql_server_that_is_not_there_is_one_line(tmp_path, capsys):
    from foodvit.cli.main import main

    photos = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    url = f"postgresql://foodvit@127.0.0.1:{free_port()}/postgres"
    assert (
        main(["tune", "--data", str(photos), "--out", str(tmp_path / "s"), "--storage", url, "--folds", "2", *TINY])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach the database" in err and "start its server" in err, err


@pytest.mark.slow  # two studies on one server; the fast tier keeps their names and the check of a study's owner
def test_two_studies_of_one_folder_name_on_one_server_never_share_trials(postgres, tmp_path):
    from foodvit.cli.main import main

    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    for machine, n_train in (("a", 4), ("b", 5)):  # as two machines would, each its --out named "study", other photos
        photos = make_photo_folder(tmp_path / machine / "photos", n_train=n_train, n_test=2)
        assert (
            main(
                [
                    "tune",
                    "--data",
                    str(photos),
                    "--out",
                    str(tmp_path / machine / "study"),
                    "--trials",
                    "1",
                    "--folds",
                    "2",
                    "--space",
                    str(space),
                    "--storage",
                    postgres,
                    *TINY,
                ]
            )
            == 0
        )
    assert [p.name for p in (tmp_path / "b" / "study").glob("trial-*")] == ["trial-0000"]  # it had run trial-0001 alone
    a, b = (study_in(tmp_path / machine / "study", postgres) for machine in "ab")
    assert a.study_name != b.study_name  # b had reported a's trial as its best and never run its own start
    for study in (a, b):
        assert [(t.state.name, t.user_attrs["dir"], t.user_attrs.get("baseline")) for t in study.trials] == [
            ("COMPLETE", "trial-0000", True)
        ]
    moved = tmp_path / "moved"
    (tmp_path / "b" / "study").rename(moved)  # a folder moved goes on with its study, on the same server
    assert (
        main(
            [
                "tune",
                "--data",
                str(tmp_path / "b" / "photos"),
                "--out",
                str(moved),
                "--trials",
                "1",
                "--folds",
                "2",
                "--space",
                str(space),
                "--storage",
                postgres,
                *TINY,
            ]
        )
        == 0
    )
    assert len(study_in(moved, postgres).trials) == 2 and len(study_in(tmp_path / "a" / "study", postgres).trials) == 1


@pytest.mark.slow  # a server stopped and started again
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the heartbeat's thread's traceback
def test_a_server_stopped_in_the_middle_of_tune_is_one_line_and_the_same_command_goes_on(
    postgres_server, tmp_path, capsys, monkeypatch
):
    from foodvit.cli.main import main
    from foodvit.tuning import cv, storage

    monkeypatch.setattr(storage, "HEARTBEAT_S", 1, raising=False)  # a stuck trial is stale after 2 s, not 90
    monkeypatch.setattr(storage, "GRACE_S", 2, raising=False)
    real_run_fold, ran = cv.run_fold, []

    def run_fold(config, run, folder, **kwargs):
        ran.append(f"{run.parent.name}/{run.name}")
        result = real_run_fold(config, run, folder, **kwargs)
        if len(ran) == 1:
            postgres_server.stop()  # the server gone once the first fold has trained
        return result

    monkeypatch.setattr(cv, "run_fold", run_fold)
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    command = [
        "tune",
        "--data",
        str(photos),
        "--out",
        str(tmp_path / "study"),
        "--trials",
        "1",
        "--folds",
        "2",
        "--storage",
        postgres_server.url,
        *TINY,
    ]
    capsys.readouterr()
    assert main(command) == 2
    err = capsys.readouterr().err.strip()  # it was a hundred frames ending in UnboundLocalError: ... 'updated_state'
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "went away" in err and "run the same command to go on" in err, err
    postgres_server.start()
    time.sleep(3)  # the stuck trial's heartbeat past its grace period
    assert main(command) == 0
    trials = study_in(tmp_path / "study", postgres_server.url).trials
    assert [(t.state.name, t.user_attrs["dir"]) for t in trials] == [("FAIL", "trial-0000"), ("COMPLETE", "trial-0000")]
    assert ran == ["trial-0000/fold-0", "trial-0000/fold-0", "trial-0000/fold-1"]  # run again in its folder
