"""``python -m wds_cloud``: the ``wds-cloud`` command line."""

from .cli import main

raise SystemExit(main())
