"""MkDocs hook: the generated pages (docs/generate.py) made in memory at every build, so the site never shows a stale
command-line reference, recipe table, results page, home page's figures or run files, and the build writes nothing but
the site. The command-line and recipe references are pages of their own, from the code; the committed pages that hold
generated text (the Results page, the home page's figures, the run directory's files) are built as generate.py makes
them now (the suite checks that the committed text is current)."""

import importlib.util
from pathlib import Path

from mkdocs.structure.files import File

_spec = importlib.util.spec_from_file_location("foodvit_docs_generate", Path(__file__).with_name("generate.py"))
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)

_current: dict[str, str] = {}  # a committed page's path under docs/ -> its text as generated at this build


def on_pre_build(config, **kwargs) -> None:
    _current.clear()
    docs = Path(config["docs_dir"]).resolve()
    _current.update(
        {
            str(path.relative_to(docs)): text
            for path, text in generate.committed_pages().items()
            if path.is_relative_to(docs)
        }
    )


def on_files(files, config, **kwargs):
    for uri, text in generate.built_pages().items():
        stale = files.get_file_from_path(uri)  # an older build's copy left on disk gives way to today's
        if stale is not None:
            files.remove(stale)
        files.append(File.generated(config, uri, content=text))
    return files


def on_page_markdown(markdown, page, **kwargs):
    return _current.get(page.file.src_uri, markdown)
