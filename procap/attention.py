"""``procap.attention``, the documented name of ``procap.kernels.attention`` (level 1): importing either gives the same module.

The library imports ``procap.kernels.attention``; this file only keeps the public name. The star import is for type checkers;
at run time the module below replaces this one, so its state (and a test's patch of it) is shared, not copied.
"""

import sys

from procap.kernels import attention as _module
from procap.kernels.attention import *

sys.modules[__name__] = _module
