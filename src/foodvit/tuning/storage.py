"""Where a `foodvit tune` study keeps its trials: Optuna's storage (SQLite in STUDY/study.db, or a server given by
--storage), opened with one-line errors for a missing driver, an unreachable server or a damaged database. A --storage
may hold several studies: each has a name of its own there (noted in the study folder's storage.json) and carries
its study.json, so that a study never takes another's trials for its own."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from pathlib import Path
from urllib.parse import quote, unquote

from foodvit.errors import StudyError
from foodvit.files import read_json, write_text
from foodvit.tuning.study import changes, current_names

logger = logging.getLogger(__name__)

STUDY_NAME = "foodvit"  # the study's name in its own study.db (and every study's in a --storage before names differed)
WHERE = "storage.json"  # in a study folder whose trials a --storage holds: its URL (password hidden), the study's name
IDENTITY = "foodvit_study"  # the study's user attribute in its storage: the study.json of the folder that started it
# a trial's process writes a heartbeat every HEARTBEAT_S; one silent for GRACE_S (killed, or cut off from a server
# that went away) is marked failed and run again, with its folder and finished folds, by the next trial to start
HEARTBEAT_S, GRACE_S = 30, 90


def open_storage(study_dir: Path, url: str | None):
    """Optuna's RDB storage: SQLite in the study folder unless a URL is given. The heartbeat
    marks a trial whose process died (kill -9) as failed after grace_period, and the retry
    callback enqueues it again."""
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    class Storage(RDBStorage):
        def record_heartbeat(self, trial_id: int) -> None:
            """A heartbeat the database does not take (its server away for a while) is skipped, not the end of the
            heartbeats: the trial's own next write says whether the server is back, and if it never is, the trial
            is run again once its heartbeat is GRACE_S old."""
            try:
                super().record_heartbeat(trial_id)
            except Exception as err:  # Optuna's StorageInternalError, raised from SQLAlchemy's
                if database_error(err) is None:
                    raise
                logger.debug("the study's database took no heartbeat: %s", err)

    given = url
    # the folder's path quoted: a "?" or "#" in it is part of the name, not the URL's query or fragment
    url = url or f"sqlite:///{quote(str((study_dir / 'study.db').resolve()))}"
    engine = (
        {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    )  # SQLite: wait for the other process's write
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks the heartbeat experimental
            return Storage(
                url,
                engine_kwargs=engine,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
            )
    except Exception as err:
        raise StudyError(storage_problem(given, url, err)) from None


def storage_problem(given: str | None, url: str, err: Exception) -> str:
    """What is wrong with a study's database, in one line: its driver missing, a URL no database
    takes, a server not there, a file that is no database."""
    import sqlalchemy.exc

    where = f"--storage {_hide_password(url)}" if given else unquote(url.removeprefix("sqlite:///"))
    first = (
        str(getattr(err, "orig", None) or err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    )
    if isinstance(err, ImportError):
        missing = (
            getattr(err.__cause__, "name", None) or err.name or "its driver"
        )  # Optuna wraps SQLAlchemy's ImportError
        return (
            f"{where} needs the database driver {missing}, which is not installed: pip install 'foodvit[tune]' for "
            f"PostgreSQL (psycopg), or the driver the URL names (e.g. mysql+pymysql:// needs PyMySQL)"
        )
    if isinstance(err, sqlalchemy.exc.ArgumentError | sqlalchemy.exc.NoSuchModuleError) or isinstance(err, ValueError):
        return (
            f"{where} is not a database URL: give postgresql://user@host/db, mysql://user@host/db or "
            f"sqlite:///path ({first})"
        )
    if isinstance(err, sqlalchemy.exc.OperationalError) and given and not url.startswith("sqlite"):
        return (
            f"cannot reach the database of {where} ({first}): start its server, or check the host, port, user "
            "and database"
        )
    place = sqlite_place(url) if given and isinstance(err, sqlalchemy.exc.OperationalError) else None
    if place:
        return f"{where}: {place}"
    if isinstance(err, sqlalchemy.exc.DatabaseError | sqlalchemy.exc.OperationalError):
        return f"{where} is not a study database foodvit can use ({first}): restore it, or choose a new --out"
    raise err


def sqlite_place(url: str) -> str | None:
    """What keeps SQLite from making or writing the file a --storage sqlite:/// URL names, and what to do about it;
    None for another database, or a file that is there and writable (its contents are then what is wrong)."""
    import os

    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database)
    if path.is_dir():
        return f"{path} is a folder; give a file's path, e.g. --storage sqlite:///{path / 'study.db'}"
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{blocker} is a file, not a folder; give a path in a folder"
    if not path.parent.is_dir():
        return f"the folder {path.parent} does not exist; create it, or give a path in an existing folder"
    if path.exists():
        if os.access(path, os.R_OK | os.W_OK):
            return None
        return f"cannot write {path} (read-only, or not yours); give a path you can write to"
    try:  # whether a file can be made there at all, and if not the system's reason
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError as err:
        return f"cannot create {path} ({err.strerror or err}); give a path in a folder you can write to"
    path.unlink()
    return None


def check_url(url: str | None) -> None:
    """A --storage URL whose password holds an '@' as it is: every reader takes the URL's host from after its first
    '@', the password's end with it, so the server asked for would be wrong and its name would show a piece of the
    password; refused before anything is made, the password hidden whole."""
    if url and not url.startswith("sqlite") and url.partition("://")[2].count("@") > 1:
        raise StudyError(
            f"--storage {_hide_password(url)}: its password holds an '@', which a URL reads as the end of the "
            "password; percent-encode the password's '@', ':' and '/' (as %40, %3A and %2F) in the URL"
        )


def _hide_password(url: str) -> str:
    """The URL with its password as ***, parsed as SQLAlchemy parses it (a password may hold '/' or ':'); one
    holding a second '@' (an '@' left in the password) or one SQLAlchemy cannot parse is cut by hand up to its last
    '@', so that no part of a password is shown."""
    scheme, separator, rest = url.partition("://")
    user, at, host = rest.rpartition("@")
    if separator and at and "@" in user:
        return f"{scheme}://{user.split(':')[0]}:***@{host}" if ":" in user else url
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        return parsed.render_as_string(hide_password=True) if parsed.password is not None else url
    except Exception:  # not a URL SQLAlchemy reads (or no SQLAlchemy): the same rule by hand
        return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _note(study_dir: Path) -> dict | None:
    """The folder's storage.json (which --storage holds its trials, and under which study name), or None."""
    path = study_dir / WHERE
    try:
        note = read_json(path)
        if not isinstance(note["storage"], str) or not isinstance(note.get("study", STUDY_NAME), str):
            raise TypeError("its storage and study are not text")
        return note
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise StudyError(
            f"{path} is damaged ({err}); restore it from a copy (it names the --storage that holds the study's trials "
            "and the study's name there), or choose a new --out"
        ) from None


def recorded_storage(study_dir: Path) -> str | None:
    """The --storage the study folder's trials live in (its password hidden), or None: its own study.db."""
    note = _note(study_dir)
    return None if note is None else note["storage"]


def study_name(study_dir: Path, storage: str | None, identity: dict) -> str:
    """The study's name in its database: "foodvit" in the folder's own study.db, which holds that study alone. A
    --storage may hold many: there a study is named after its folder and a digest of what it is (its study.json) and
    where its folder was when it started, so that two studies, even of one folder name or of the same settings, never
    share trials. The name is noted in storage.json, and read from there: a folder moved, or taken to another machine
    that reaches the same server, goes on with its study. A note written before studies had names of their own names
    the one name they all had."""
    if not storage:
        return STUDY_NAME
    note = _note(study_dir)
    if note is not None:
        return note.get("study", STUDY_NAME)
    folder = study_dir.resolve()
    what = json.dumps({"study": identity, "folder": str(folder)}, sort_keys=True)
    return f"{STUDY_NAME}-{folder.name}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"


def record_storage(study_dir: Path, storage: str | None, name: str = STUDY_NAME) -> None:
    """Note in the study folder which --storage holds its trials, and the study's name there, so that a run without
    it is told where they are, and a run with it finds its study wherever the folder is."""
    if storage and recorded_storage(study_dir) is None:
        write_text(study_dir / WHERE, json.dumps({"storage": _hide_password(storage), "study": name}) + "\n")


def check_study(study, identity: dict, storage: str) -> None:
    """The --storage's study is this folder's: the study.json of the folder that started it, which the study carries
    (IDENTITY), is this folder's (settings added to foodvit since counting at their defaults). A study that carries
    none (new, or started before studies did) is given this folder's, before anything of this folder's is written in
    it, so that from then on another study under its name is refused."""
    stored = study.user_attrs.get(IDENTITY)
    if not isinstance(stored, dict):
        study.set_user_attr(IDENTITY, identity)
        return
    shown = changes(current_names(stored), current_names(identity))
    if shown:
        raise StudyError(
            f"--storage {_hide_password(storage)} holds under the name {study.study_name} the trials of another "
            f"study ({shown}), not this folder's; give the --storage that holds this study's trials, or choose a new "
            "--out"
        )


def database_error(err: BaseException | None) -> BaseException | None:
    """The database's own error behind err (err itself, or what it was raised from or while handling), or None: a
    server that went away, a connection cut, a database locked past its timeout."""
    import sqlalchemy.exc

    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def storage_lost(study_dir: Path, storage: str | None, err: BaseException) -> str:
    """A study's database gone in the middle of a search, in one line: which, what its driver said, how to go on."""
    first = str(getattr(err, "orig", None) or err).strip().splitlines()
    said = first[0][:200] if first else type(err).__name__
    if storage and not storage.startswith("sqlite"):
        return (
            f"the study's database, --storage {_hide_password(storage)}, went away during the search ({said}): "
            "once its server is up again, run the same command to go on; the trial that was running is run again, "
            "its finished folds kept"
        )
    where = f"--storage {storage}" if storage else str(study_dir / "study.db")
    return (
        f"the study's database, {where}, could not be written during the search ({said}): run the same command "
        "again to go on; the trial that was running is run again, its finished folds kept"
    )


def check_database(study_dir: Path, storage: str | None) -> None:
    """The study's own SQLite database, before Optuna opens it (and would add its tables to any file):
    gone while trial folders remain, another program's, truncated or random bytes are refused, since
    the trial folders could then be reported under trials they are not."""
    import sqlite3
    from contextlib import closing

    recorded = recorded_storage(study_dir)
    if recorded is not None and (storage is None or _hide_password(storage) != recorded):
        asked = f"not in {_hide_password(storage)}" if storage else "not in the folder"
        raise StudyError(
            f"the trials of the study in {study_dir} are in --storage {recorded}, {asked}; give --storage {recorded} "
            "to go on with it, or choose a new --out"
        )
    db = study_dir / "study.db"
    if storage:
        if db.exists() and recorded is None:
            raise StudyError(
                f"the trials of the study in {study_dir} are in its own {db.name}, not in {_hide_password(storage)}; "
                "leave out --storage to go on with it, or choose a new --out"
            )
        return  # a server's database: the trial folders are checked against its trials (check_trial_folders)
    held = sorted(p.name for p in study_dir.glob("trial-*"))
    advice = f"restore {db} from where it was copied, or choose a new --out for a new study"
    if not db.exists():
        if held:
            raise StudyError(
                f"{db} is gone, and without it the trial folders "
                f"({', '.join(held[:3])}{' ...' if len(held) > 3 else ''}) "
                f"cannot be matched to their trials' settings; {advice}"
            )
        return
    if not db.is_file():
        raise StudyError(f"{db} is not a file; {advice}")
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            names = {row[0] for row in connection.execute("select study_name from studies")}
    except sqlite3.Error as err:
        if db.stat().st_size == 0 and not held:
            return  # made by a start that stopped at once: Optuna fills it
        raise StudyError(f"{db} is not a study database foodvit can read ({err}); {advice}") from None
    if STUDY_NAME not in names:
        raise StudyError(f"{db} holds no foodvit study (another program's or another tool's database); {advice}")
