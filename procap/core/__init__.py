"""Level 0: what every other part of the package stands on, importing nothing of procap above it.

Configuration (``config``), user errors (``errors``), optional extras (``extras``), safe output files (``files``),
the one JSON/YAML reader (``json_files``), argument checks (``validate``), weight-file I/O (``weights``), where files
come from (``hub_files``) and the ``procap`` logger (``logs``).
"""
