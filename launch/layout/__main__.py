"""``python -m launch.layout {torchrun,deepspeed,serve,slurm} ...`` (see :mod:`launch.layout`)."""

import sys

from launch.layout import main

sys.exit(main())
