"""The package as a user installs it: the wheel built from this tree, installed into a fresh virtual environment,
trains the tiny recipe from there (its console script, its recipes and assets as package data, nothing read from
src/). The fresh environment reaches the dependencies already installed here (PyTorch and the rest) through a .pth
file, and the wheel is installed with --no-deps, so nothing is downloaded."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import make_photo_folder

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    # no PYTHONPATH (a run of the suite may point it at src/), so the fresh environment imports only what it holds
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=600, env=env, **kwargs)
    assert result.returncode == 0, f"{argv}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the tree (setuptools writes build/ and the egg-info beside the sources it builds, so
    the checkout is left as it is), built without build isolation: the setuptools of the test extra, no download."""
    pytest.importorskip(
        "setuptools", reason="the wheel is built with the test extra's setuptools: pip install -e '.[test]'"
    )
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "--quiet",
            "--wheel-dir",
            out,
            source,
        ],
        cwd=source,
    )
    [built] = out.glob("foodvit-*.whl")
    return built


@pytest.mark.slow  # a wheel's build, a virtual environment and a training in a fresh Python: the rest of the suite
# runs the same code from src/
def test_the_wheel_installed_in_a_fresh_environment_trains_the_tiny_recipe(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "foodvit/recipes/tiny.toml" in names and any(n.startswith("foodvit/deploy/web/assets/") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    assert site.is_relative_to(venv)
    here = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])  # PyTorch and the rest
    (site / "suite-dependencies.pth").write_text("".join(f"{path}\n" for path in here))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel])

    found = _run([python, "-c", "import foodvit; print(foodvit.__file__)"], cwd=tmp_path).stdout.strip()
    assert Path(found) == site / "foodvit" / "__init__.py", found  # the wheel's, not src/ (nor an editable install)

    photos = make_photo_folder(tmp_path / "photos", n_train=6, n_test=3, size=(64, 80))
    run = tmp_path / "run"
    _run(
        [
            venv / "bin" / "foodvit",
            "train",
            "--recipe",
            "tiny",
            "--epochs",
            "1",
            "--data",
            photos,
            "--out",
            run,
            "--image-size",
            "32",
            "--depth",
            "1",
            "--quiet",
        ],
        cwd=tmp_path,
    )
    card = json.loads((run / "model.json").read_text())
    assert card["classes"] == ["pizza", "steak", "sushi"]
    assert (run / "model.safetensors").stat().st_size > 0 and (run / "report.md").is_file()
