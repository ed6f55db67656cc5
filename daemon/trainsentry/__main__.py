from trainsentry.cli import main

raise SystemExit(main())
