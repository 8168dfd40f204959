"""`python -m stallwatch.simulator ARGS` is `stallwatch sim ARGS`."""

import sys

from stallwatch.simulator.cli import main

sys.exit(main())
