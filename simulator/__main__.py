"""`python -m simulator ARGS` is `stallwatch sim ARGS`."""

import sys

from simulator.cli import main

sys.exit(main())
