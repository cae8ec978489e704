"""The house rules: the layer contracts (import-linter), no module needing one that needs it back, every name
imported from the module that declares it, the types, and no process-wide side effects from library code."""

import functools
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import make_photo_folder, report_figures

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_layer_contracts_hold():
    result = lint(ROOT, ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.slow  # a minute of one core on a fresh checkout (seconds with its cache); `make lint` runs it too
def test_the_types_check():
    # mypy as pyproject.toml configures it (src/foodvit, Python 3.10): part of `make test`
    mypy = Path(sys.executable).with_name("mypy")
    result = subprocess.run([str(mypy)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_a_wrong_import_breaks_the_contracts(tmp_path):
    # the model layer reaching up into training, and the Predictor importing torch at module level
    shutil.copytree(
        ROOT / "src" / "foodvit", tmp_path / "src" / "foodvit", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    vit = tmp_path / "src" / "foodvit" / "model" / "vit.py"
    vit.write_text(vit.read_text() + "\nfrom foodvit.training import engine  # noqa\n")
    predictor = tmp_path / "src" / "foodvit" / "deploy" / "predictor.py"
    predictor.write_text(predictor.read_text() + "\nimport torch  # noqa\n")
    result = lint(tmp_path, tmp_path / "src")
    assert result.returncode != 0
    assert "foodvit.model.vit -> foodvit.training.engine" in result.stdout
    assert "foodvit.deploy.predictor -> torch" in result.stdout
    assert "Contracts: 0 kept, 3 broken." in result.stdout  # the layers, torch-free and model-knows-nothing contracts


def test_a_missing_dependency_is_not_reported_as_a_missing_attribute():
    # a submodule that exists but cannot import something it needs says so (it used to be "no attribute")
    code = (
        "import sys; sys.modules['tomllib'] = None; sys.modules['tomli'] = None\n"
        "import foodvit\n"
        "try:\n    foodvit.recipes\nexcept ModuleNotFoundError as err:\n    print('missing', err.name)\n"
        "try:\n    foodvit.no_such_thing\nexcept AttributeError as err:\n    print('attribute', err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "missing tomllib" in out.stdout or "missing tomli" in out.stdout
    assert "attribute module 'foodvit' has no attribute 'no_such_thing'" in out.stdout


def test_training_leaves_the_process_as_it_found_it(tmp_path):
    # a notebook's random state, warning filters, signal handlers and environment are its own
    from foodvit.cli.options import build_config
    from foodvit.training.run import train

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2, size=(40, 40))
    config = build_config(
        "tiny",
        {
            "data.source": str(photos),
            "train.epochs": 1,
            "vit.image_size": 32,
            "vit.depth": 1,
            "train.deterministic": True,
            "drloc.weight": 0.5,
        },
    )
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    filters, handler, environ = list(warnings.filters), signal.getsignal(signal.SIGTERM), dict(os.environ)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with report_figures():  # drawing the report's figures (matplotlib) is part of what must leave the process alone
        train(config, tmp_path / "run", quiet=True)
    assert torch.equal(torch.get_rng_state(), rng)  # the run seeded its own copy of the streams
    assert warnings.filters == filters
    assert signal.getsignal(signal.SIGTERM) is handler
    assert dict(os.environ) == environ  # CUBLAS_WORKSPACE_CONFIG of --deterministic included
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (threads, deterministic)
    assert torch.rand(3).tolist() == (torch.manual_seed(1234), torch.rand(3))[1].tolist()


def torch_free_modules() -> list[str]:
    """The modules the torch-free contract names (pyproject.toml, the one list), a package with its modules."""
    import pkgutil

    from foodvit.recipes import tomllib  # tomli before Python 3.11

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (named,) = [c["source_modules"] for c in contracts if "torch" in c.get("forbidden_modules", ())]
    modules = []
    for name in named:
        path = ROOT / "src" / Path(*name.split("."))
        below = [m.name for m in pkgutil.walk_packages([str(path)], prefix=f"{name}.")] if path.is_dir() else []
        modules += [name, *below]
    return modules


@pytest.mark.parametrize("module", torch_free_modules())
def test_torch_free_modules_load_without_torch(module):
    # what the contract says statically, at run time: with torch unimportable these modules still load
    code = f"import sys; sys.modules['torch'] = None; sys.modules['torchvision'] = None\nimport {module}\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_no_module_imports_one_that_imports_it_back():
    # the layers contract orders the sub-packages; within a layer, no two modules may need each other either
    import itertools

    import grimp

    graph = grimp.build_graph("foodvit")
    modules = sorted(graph.modules)
    cycles = [
        (a, b) for a, b in itertools.combinations(modules, 2) if graph.chain_exists(a, b) and graph.chain_exists(b, a)
    ]
    assert cycles == []


@functools.cache
def declared_names(module: Path) -> set[str]:
    """The names a module's own code declares at its top level (defined, assigned, or imported where a condition
    picks the library, as tomllib or tomli): never a name it only imports to use."""
    import ast

    names: set[str] = set()

    def visit(statements, conditional: bool) -> None:
        for st in statements:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
            elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(st, (ast.Import, ast.ImportFrom)) and conditional:
                names.update((a.asname or a.name).split(".")[0] for a in st.names)
            elif isinstance(st, ast.If):
                visit(st.body + st.orelse, True)
            elif isinstance(st, ast.Try):
                visit(st.body + [s for h in st.handlers for s in h.body] + st.orelse + st.finalbody, True)

    visit(ast.parse(module.read_text()).body, False)
    return names


def test_every_name_is_imported_from_the_module_that_declares_it():
    # ARCHITECTURE: foodvit/__init__.py alone passes names on (the public API); any other import that names a
    # module passing a name on hides where the name lives, and what the reader of that module finds there
    import ast

    src = ROOT / "src"
    passed_on = []
    for path in sorted([*src.rglob("*.py"), *(ROOT / "tests").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("foodvit."):
                continue
            folder = src / Path(*node.module.split("."))
            declaring = folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")
            names = declared_names(declaring)
            for alias in node.names:
                inside = folder / alias.name
                submodule = folder.is_dir() and (inside.with_suffix(".py").is_file() or inside.is_dir())
                if alias.name not in names and not submodule:
                    passed_on.append(f"{path.relative_to(ROOT)}: {alias.name} from {node.module}")
    assert passed_on == [], "\n".join(passed_on)
