import sys

from procap.cli import main

sys.exit(main())
