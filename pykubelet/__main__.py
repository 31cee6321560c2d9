from pykubelet.cmd.cli import main

raise SystemExit(main())
