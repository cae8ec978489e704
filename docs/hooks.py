"""MkDocs hook: the generated pages (docs/generate.py) written before every build, so the site never shows a stale
command-line reference, recipe table or results page. With FOODVIT_DOCS_KEEP_COMMITTED=1 (the test suite) the
committed pages, README's table and the Results page, are built as they are, so a check can still find them stale."""

import importlib.util
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location("foodvit_docs_generate", Path(__file__).with_name("generate.py"))
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


def on_pre_build(config, **kwargs) -> None:
    pages = generate.built_pages()
    if not os.environ.get("FOODVIT_DOCS_KEEP_COMMITTED"):
        pages.update(generate.committed_pages())
    generate.write(pages)
