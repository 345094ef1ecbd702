"""`python -m torchherd` is the `torchherd` command."""
from torchherd.tui.cli import main

raise SystemExit(main())
