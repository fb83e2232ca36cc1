import sys

from placer.cli import console_main

sys.exit(console_main())
