"""``fsdp-readings site OUT/``: the guides as a static site, from the same parsed guides and resolved anchors as
``show`` (`reader.views.quote`), with each claim's last result and pictures read from the user's data directory.
`build` writes it; `code` highlights the quoted torch lines; `markdown` renders the prose; `pages` fills the
templates; `search_index` writes what the optional search script reads.

May import: source, format, gate, claims, views.
"""
