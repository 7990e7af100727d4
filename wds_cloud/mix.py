"""webdataset's module path ``webdataset.mix``: an alias of :mod:`wds_cloud.pipeline.mix`.

Importing it puts that module in ``sys.modules`` under this name, so attributes set here
(``wds_cloud.mix.X = ...``) are the ones its code reads.
"""

import sys

from .pipeline import mix as _module
from .pipeline.mix import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
