"""`python -m hypocenter.cli`: the `hypocenter` command."""

from hypocenter.cli import main

raise SystemExit(main())
