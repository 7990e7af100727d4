"""webdataset's module path ``webdataset.tenbin``: an alias of :mod:`wds_cloud.codecs.tenbin`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.tenbin.X = ...``) are the ones its code reads.
"""

import sys

from .codecs import tenbin as _module
from .codecs.tenbin import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
