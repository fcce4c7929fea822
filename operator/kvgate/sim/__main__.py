"""`python -m kvgate.sim ...`."""

from __future__ import annotations

import sys

from kvgate.sim.main import main

sys.exit(main())
