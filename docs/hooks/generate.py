"""mkdocs hook: the reference pages and the benchmarks page, generated at build time.

Why a hook and not the mkdocs-gen-files plugin: the pages are made by plain
functions of this repository (``reference/*.py``) that take the code and the
result files and return Markdown; a hook calls them in ``on_files`` and adds
each page with ``File.generated``, in memory. Nothing is written under
``docs/``, so a generated page cannot be committed by mistake or drift from
the code, and the build needs no plugin beyond mkdocs itself. The same
functions are importable by the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

HOOKS_DIR = Path(__file__).resolve().parent
if str(HOOKS_DIR) not in sys.path:
    # mkdocs loads a hook by its path; its sibling package is found from here.
    sys.path.insert(0, str(HOOKS_DIR))

from reference.pages import generated_pages  # noqa: E402

REPO_ROOT = HOOKS_DIR.parent.parent


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add every generated page and figure to the site's files."""
    for uri, content in generated_pages(REPO_ROOT).items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            raise ValueError(f"docs/{uri} is generated at build time; delete the written copy")
        files.append(File.generated(config, uri, content=content))
    return files
