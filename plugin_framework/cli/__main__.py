"""``python -m plugin_framework.cli``: the ``pgdecode`` command."""

import sys

from plugin_framework.cli import main

sys.exit(main())
