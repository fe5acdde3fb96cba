import sys

from gpuserve.cli import main

sys.exit(main())
