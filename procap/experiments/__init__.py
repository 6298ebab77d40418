"""Level 6: experiments built from training, evaluation and pictures.

``demo``: the paper's 2 x 2 (with and without stage 1, with and without procedure queries) on the synthetic
benchmark, trained side by side over seeds, with paired statistics; ``report``: its self-contained ``report.html``.
``procap demo`` only parses its arguments and calls :func:`procap.experiments.demo.run_demo`.
"""
