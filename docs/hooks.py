"""MkDocs hook: the generated pages (docs/generate.py) written before every build, so the site never shows a stale
command-line reference, recipe table or results page."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("foodvit_docs_generate", Path(__file__).with_name("generate.py"))
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


def on_pre_build(config, **kwargs) -> None:
    generate.write({**generate.committed_pages(), **generate.built_pages()})
