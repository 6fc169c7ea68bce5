"""``python -m tvm_accel.cli``: the ``tvmc`` command."""

import sys

from tvm_accel.cli import main

sys.exit(main())
