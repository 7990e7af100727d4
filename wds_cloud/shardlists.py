"""webdataset's module path ``webdataset.shardlists``: an alias of :mod:`wds_cloud.pytorch`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.shardlists.X = ...``) are the ones its code reads.
"""

import sys

from . import pytorch as _module
from .pytorch import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
