"""``python -m placer`` runs the ``placer`` command."""

import sys

from .cli import main

sys.exit(main())
