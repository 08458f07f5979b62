"""The pytest plugin: guides collected as items, each item's outcome, the session's exit code and reports.

- ``hooks``: the hooks (options, collection, reporting, exit codes), registered through ``reader.plugin``.
- ``items``: a guide file and its anchor, claim and predict items; ``failures``: how they fail in pytest.
- ``session``: per-session options, resources (torch source, workspace, runner) and findings.
- ``approving``: ``--approve``: which guides, their anchors after their claims, the decision from the session's
  claims.
- ``runner`` / ``hookspecs``: the seam to the rank pool of ``checks`` (replaceable through a hook).

May import: source, format, gate, claims, views.
"""
