"""Registers the suite's pytest plugins: rank pool options and fixtures, and guides as test items.

Hypothesis writes nothing into the repository: no example database (a run depends only on the code and its
seed), and its other caches go to a directory under the system's temporary directory.
"""

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "fsdp-readings-hypothesis")
settings.register_profile("fsdp-readings", database=None)
settings.load_profile("fsdp-readings")

pytest_plugins = ["checks.ranks.pytest_plugin", "reader.plugin"]
