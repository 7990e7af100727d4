"""``python -m wds_cloud.cli``: the ``wds-cloud`` command."""

import sys

from .main import main

sys.exit(main())
