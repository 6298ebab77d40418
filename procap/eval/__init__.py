"""Evaluation, beside ``procap.train``: captioning metrics, caption correctness, evaluation of a model on a split.

- :mod:`procap.eval.metrics`: ``score`` (BLEU / METEOR / ROUGE-L / CIDEr), COCO-style result files, the metric-name
  table;
- :mod:`procap.eval.correctness`: does a CLEVR-style caption name the right change, type, object and value;
- :mod:`procap.eval.split`: ``caption_pairs``, ``score_captions`` and ``evaluate_model`` (captions, metrics, per
  change type, correctness and speed of one split).
"""
