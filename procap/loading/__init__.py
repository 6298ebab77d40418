"""Level 4: a ProCap, with its vocabulary and metadata, from a checkpoint file or a pretrained name.

``checkpoint`` (``load_checkpoint``, ``check_can_caption``, the checkpoint format's public names) and ``hub``
(``load_pretrained``), public also as ``procap.checkpoint`` and ``procap.hub``.
"""
