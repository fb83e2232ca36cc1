import sys

from placer.console import main

sys.exit(main())
