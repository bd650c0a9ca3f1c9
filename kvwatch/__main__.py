from __future__ import annotations

from kvwatch.cli import main

raise SystemExit(main())
