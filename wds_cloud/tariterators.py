"""webdataset's module path ``webdataset.tariterators``: an alias of :mod:`wds_cloud.dataset`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.tariterators.X = ...``) are the ones its code reads.
"""

import sys

from . import dataset as _module
from .dataset import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
