"""Pictures, above training and fast inference.

- :mod:`procap.viz.figures`: the procedure a ProCap encoder imagines between two images (``imagine``,
  ``render_strip``) and the explicit procedure of a training pair (``explicit_procedure``, confidence bars, sampled
  keyframes). The demo's report is :mod:`procap.experiments.report`.
"""
