from pykubelet.cli import main

raise SystemExit(main())
