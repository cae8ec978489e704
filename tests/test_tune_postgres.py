"""Two `foodvit tune` processes share one study on a real PostgreSQL server: a server started here
(initdb in a temporary folder as an unprivileged user, 127.0.0.1 on a free port, its socket in the
temporary folder), every trial run once, the study as on SQLite. Skipped, saying why, without
PostgreSQL's programs or its driver."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import free_port, make_photo_folder

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg", reason="the PostgreSQL driver (psycopg, in the tune extra) is not installed")

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]


def postgres_program(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@pytest.fixture
def postgres():
    """A PostgreSQL server of its own, for this test alone; its URL."""
    initdb, pg_ctl = postgres_program("initdb"), postgres_program("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)")
    # a folder of its own under the system's temporary folder, which an unprivileged user can reach (pytest's is root's alone)
    folder = Path(tempfile.mkdtemp(prefix="foodvit-postgres-"))
    user = {}
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the server runs as nobody, in a folder it owns
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    port = free_port()
    data = folder / "data"
    run = dict(check=True, capture_output=True, text=True, timeout=120, cwd=folder, **user)
    subprocess.run([initdb, "-D", str(data), "-U", "foodvit", "--auth=trust", "-E", "UTF8"], **run)
    subprocess.run([pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "60", "start",
                    "-o", f"-h 127.0.0.1 -p {port} -k {folder}"], **run)
    try:
        yield f"postgresql://foodvit@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], **{**run, "check": False})
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_tune_processes_share_a_study_on_a_real_postgresql_server(postgres, tmp_path):
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    study_dir = tmp_path / "study"
    command = [sys.executable, "-m", "foodvit", "tune", "--data", str(photos), "--out", str(study_dir), "--trials", "1",
               "--folds", "2", "--space", str(space), "--storage", postgres, *TINY]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    study = optuna.load_study(study_name="foodvit", storage=postgres)
    trials = study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]  # as on SQLite
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1  # the starting recipe ran once
    assert sorted(t.user_attrs["dir"] for t in trials) == ["trial-0000", "trial-0001"]  # every trial in a folder of its own
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
    assert main(["tune", "--data", str(photos), "--out", str(tmp_path / "s"), "--storage", url, "--folds", "2", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach the database" in err and "start its server" in err, err
