"""webdataset's module path ``webdataset.filters``: an alias of :mod:`wds_cloud.pipeline.filters`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.filters.X = ...``) are the ones its code reads.
"""

import sys

from .pipeline import filters as _module
from .pipeline.filters import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
