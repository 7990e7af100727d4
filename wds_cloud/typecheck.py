"""webdataset's module path ``webdataset.typecheck``: importing it checks the annotated types
of wds_cloud's functions at run time with typeguard's import hook, when typeguard is installed
(as webdataset's did for its own modules; without typeguard it does nothing).

The hook checks the modules imported after it, so import this module first (before
``wds_cloud``'s other modules). ``modules`` lists webdataset's module paths, as webdataset's did.
Importing it is its purpose, so unlike every other module it acts at import time.
"""

from __future__ import annotations

__all__ = ["modules"]

#: webdataset's module paths (``webdataset.<name>``, here ``wds_cloud.<name>``)
modules = [
    "tenbin",
    "autodecode",
    "cache",
    "cborsiterators",
    "compat",
    "extradatasets",
    "filters",
    "gopen",
    "handlers",
    "mix",
    "pipeline",
    "shardlists",
    "tariterators",
    "utils",
    "writer",
]

try:
    from typeguard import install_import_hook  # type: ignore[import-not-found]
except ImportError:
    pass
else:
    # every module of the package, the rooms where the code of these paths lives included
    install_import_hook("wds_cloud")
