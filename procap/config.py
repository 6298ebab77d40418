"""``procap.config``, the documented name of ``procap.core.config`` (level 0): importing either gives the same module.

The library imports ``procap.core.config``; this file only keeps the public name. The star import is for type checkers;
at run time the module below replaces this one, so its state (and a test's patch of it) is shared, not copied.
"""

import sys

from procap.core import config as _module
from procap.core.config import *

sys.modules[__name__] = _module
