"""The upgrade gate: the approved torch source (the lock), drift against it, approval, and the reports.

- ``lock``: ``readings/anchors.lock``, the approved source per guide and anchor (and per release of a matrix).
- ``drift``: approved vs current → a drift class and a diff in torch's own line numbers.
- ``workspace``: guides + a torch source + the lock, shared by the plugin and the commands (resolve, classify,
  approve, save).
- ``report``: what a session found, as data and rich renderables; ``drift_report``: its JSON and Markdown.
- ``upgrade_gate``: the guides run in venvs of other torch releases, for real.

May import: source, format.
"""
