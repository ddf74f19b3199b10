from longmoe.cli import main

raise SystemExit(main())
