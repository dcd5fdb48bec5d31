import sys

from launcher.node.main import main

sys.exit(main())
