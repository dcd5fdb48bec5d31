"""Container entry point of every node: hand over to the launcher node bootstrap.

The bootstrap reads the LAUNCHER_* variables the client set, meets the other
nodes in the work dir, exports RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and
starts torchrun. Its exit status is the node's result.
"""

import sys

from launcher.node.main import main

if __name__ == "__main__":
    sys.exit(main())
