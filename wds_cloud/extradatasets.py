"""webdataset's module path ``webdataset.extradatasets``: an alias of
:mod:`wds_cloud.pipeline.core` (``MockDataset``, ``repeatedly``, ``with_epoch``, ``with_length``).

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.extradatasets.X = ...``) are the ones its code reads.
"""

import sys

from .pipeline import core as _module
from .pipeline.core import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
