from gpufed.cli import main

raise SystemExit(main())
