"""webdataset's module path ``webdataset.autodecode``: an alias of :mod:`wds_cloud.codecs.decoder`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.autodecode.X = ...``) are the ones its code reads.
"""

import sys

from .codecs import decoder as _module
from .codecs.decoder import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
