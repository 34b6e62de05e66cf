import sys

from debatebus.cli import main

sys.exit(main())
