"""The upgrade gate: the approved torch source (the lock), drift against it, approval, and the reports.

- ``lock``: ``readings/anchors.lock``, the approved source per guide and anchor (and per release of a matrix),
  and per guide the releases it was approved on; ``lock_entries`` an anchor's sources and how an approval changes
  them, ``lock_file`` its JSON, ``source_changes`` a later source as its changes to the one before.
- ``releases``: torch releases compared as versions (``2.15`` = ``2.15.0`` = ``2.15.0+cu132``).
- ``drift``: approved vs current → a drift class and a diff in torch's own line numbers.
- ``approval``: whether a guide may be approved (its claims' outcomes in, a record or a refusal out).
- ``workspace``: guides + a torch source + the lock, shared by the plugin and the commands (resolve, classify,
  approve a guide whole, save).
- ``report``: what a session found, as data and rich renderables; ``drift_report``: its JSON and Markdown (the
  full report, and the PR-sized summary); ``outcome``: the verdict (clean, re-read, behaviour changed, broken), its
  exit code and ``summary.json``.
- ``upgrade_gate``: the guides run in venvs of other torch releases, for real.

May import: source, format, claims.
"""
