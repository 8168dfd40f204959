from stallwatch.cli import main

raise SystemExit(main())
