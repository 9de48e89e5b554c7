"""Generators of the docs site's reference pages: each takes the code (or the
repository's files) and returns Markdown, so the pages cannot drift."""
