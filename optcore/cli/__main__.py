"""``python -m optcore.cli``."""

import sys

from . import main

sys.exit(main())
