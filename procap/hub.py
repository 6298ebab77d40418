"""``procap.hub``, the documented name of ``procap.loading.hub`` (level 4): importing either gives the same module.

The library imports ``procap.loading.hub``; this file only keeps the public name. The star import is for type checkers;
at run time the module below replaces this one, so its state (and a test's patch of it) is shared, not copied.
"""

import sys

from procap.loading import hub as _module
from procap.loading.hub import *

sys.modules[__name__] = _module
