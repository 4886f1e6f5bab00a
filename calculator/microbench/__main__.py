"""``python -m calculator.microbench``: see ``calculator.microbench.cli``."""

from .cli import main

raise SystemExit(main())
