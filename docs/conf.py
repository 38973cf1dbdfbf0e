"""Sphinx configuration of the docs site (`make docs`): Markdown through MyST, the furo theme, nothing from a CDN.

Built with warnings as errors (`-W --keep-going -n`): a link to a missing page, file or heading anchor fails the build.
Decision record: adr/0012-docs-site-sphinx-myst.md.
"""

project = "m1000-fleet"
author = "the m1000-fleet developers"
copyright = "2026, the m1000-fleet developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "requirements.in", "examples/**", "tools/**"]

# GitHub-style anchors for headings down to ####, so `page.md#a-heading` links are checked like pages are.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "furo"
html_title = "m1000-fleet"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
# furo uses the system's font stack: no web fonts, no CDN (labs are offline).
html_theme_options = {"navigation_with_keys": True}
