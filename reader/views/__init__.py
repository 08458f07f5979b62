"""Terminal renderables that run nothing: a guide as read (``guide``), a timeline's rows and tables (``lanes``,
``timeline``), a memory series as bars and SVG (``memory``), one drifted anchor (``drift``: the lines pytest's
failure, the terminal report and the site all show). They draw data the commands hand them.

May import: source, format, gate, claims.
"""
