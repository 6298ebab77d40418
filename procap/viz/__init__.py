"""Pictures and the demo's report, above training and fast inference.

- :mod:`procap.viz.figures`: the procedure a ProCap encoder imagines between two images (``imagine``,
  ``render_strip``) and the explicit procedure of a training pair (``explicit_procedure``, confidence bars, sampled
  keyframes);
- :mod:`procap.viz.report`: ``build_report``, the self-contained ``report.html`` of a demo output folder.
"""
