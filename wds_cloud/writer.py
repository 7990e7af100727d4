"""webdataset's module path ``webdataset.writer``: an alias of :mod:`wds_cloud.tar.writer`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.writer.X = ...``) are the ones its code reads.
"""

import sys

from .tar import writer as _module
from .tar.writer import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
