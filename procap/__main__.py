import sys

from procap.commands.cli import main

sys.exit(main())
