"""Sphinx configuration of the delayjobs documentation (Furo, MyST Markdown, autodoc).

Build it with ``docs/build.sh`` (warnings are errors). The reference pages are generated
from the code at build time by ``_ext/delayjobs_reference.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "docs_settings")

import django  # noqa: E402

django.setup()

import delayjobs  # noqa: E402

project = "delayjobs"
author = "delayjobs developers"
copyright = "delayjobs developers"
release = version = delayjobs.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "delayjobs_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "reference/_generated", "screenshots/README.md"]
# `[text](page.md#a-heading)` links resolve to headings down to ###.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"
html_title = f"delayjobs {release}"
