"""``python -m fsattn_diffusers`` runs the ``fsattn`` command line."""

import sys

from fsattn_diffusers.cli import main

sys.exit(main())
