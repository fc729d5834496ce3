"""`python -m gpufed.replay ...`: the `gpufed replay` command on its own."""

from gpufed.replay.cli import main

raise SystemExit(main())
