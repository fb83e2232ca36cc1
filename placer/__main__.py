import sys

from placer.cli import main

sys.exit(main())
