"""``python -m memrl.launch.layout {torchrun,deepspeed,serve,slurm} ...`` (see :mod:`memrl.launch.layout`)."""

import sys

from memrl.launch.layout import main

sys.exit(main())
