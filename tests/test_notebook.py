"""docs/walkthrough.ipynb runs top to bottom (every section-3.1 equation is asserted inside it) and its
committed outputs are what the code prints now."""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip(
    "nbformat", reason="the notebook test needs nbformat, nbclient and ipykernel: pip install -e '.[test]'"
)
nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel: pip install -e '.[test]'")

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "walkthrough.ipynb"
SMALL = re.compile(r"\d\.\d\de-\d\d")  # differences at float rounding level: their digits vary between CPUs


def _printed(cell) -> str:
    text = "".join(
        o.get("text", "")
        for o in cell.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )
    return SMALL.sub("<tiny>", text)


def test_walkthrough_runs_and_its_outputs_are_current(real_data, monkeypatch):
    monkeypatch.setenv("FOODVIT_DATA", str(real_data))
    # one thread in the kernel: beside the suite's two workers, two threads on two cores spin (a tiny step 8x slower)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    committed = nbformat.read(NOTEBOOK, as_version=4)
    executed = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        executed, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    code = [(a, b) for a, b in zip(committed.cells, executed.cells, strict=True) if a.cell_type == "code"]
    assert all(b.execution_count for _, b in code)  # every cell ran (an error would have raised above)
    for old, new in code:
        if "varies" in old.metadata.get("tags", []):
            continue
        assert _printed(old) == _printed(new), f"the committed output of this cell is stale:\n{old.source[:200]}"
        assert sum(o.get("output_type") == "display_data" for o in old.outputs) == sum(
            o.get("output_type") == "display_data" for o in new.outputs
        )
    assert any("max |by hand - Block.forward|" in _printed(b) for _, b in code)


def test_the_committed_walkthrough_is_what_its_builder_writes(tmp_path):
    """docs/build_walkthrough.py is the notebook's source: the committed cells (text, code and tags) are its cells, so
    an edit to one is never lost to the other (`make notebook` rebuilds and runs it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_walkthrough", NOTEBOOK.parent / "build_walkthrough.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    builder.build(tmp_path / "walkthrough.ipynb")
    built = nbformat.read(tmp_path / "walkthrough.ipynb", as_version=4)
    committed = nbformat.read(NOTEBOOK, as_version=4)

    def cells(notebook):
        return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in notebook.cells]

    assert cells(committed) == cells(built)
    assert [tags for _, _, tags in cells(built)].count(["varies"]) == 1
