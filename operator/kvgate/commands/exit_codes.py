"""The `kvgate` command line's exit codes, shared by `kvgate.cli` and the commands.

They live below the CLI so that a command can name one without importing `kvgate.cli`
(which imports the commands): the CLI depends on its commands, never the reverse.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # done / pass / not needed
EXIT_GATE_FAILED: Final = 1  # the gate says no
EXIT_INPUT: Final = 2  # usage or input error
EXIT_INCONCLUSIVE: Final = 3
EXIT_EXTERNAL: Final = 4  # something outside failed
EXIT_BUG: Final = 70  # unexpected bug (with traceback)
