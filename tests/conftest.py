"""Shared test fixtures: one thread and a fixed seed for every test; a tiny ProCap whose decoder was trained to
produce varied captions (``trained``, ``pairs``, ``vocab``: the fast path's and the decoding step's tests).

A randomly initialised decoder emits the same token everywhere, which would make "fast tokens == oracle tokens"
a weak check. So the decoder is trained for a few dozen steps on fixed memories of random image pairs with
random captions: its logits then depend on the images and change from step to step.
"""

from __future__ import annotations

import dataclasses
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# triton reads TRITON_INTERPRET when it is imported and when kernels are decorated; any test folder may import it
# first, so the switch is set here, before every test module. Without CUDA the kernels run in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _one_thread():
    # Test shapes are tiny: intra-op threads only add synchronisation, and on a loaded 2-core machine OpenMP
    # spin-waiting made suites 5-10x slower. Restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _compiled_ops():
    # The compiled ops are loaded once, before the first test: from the cache, or compiled into it the first time
    # on a machine (about a minute on 2 cores), so that no test, and no test's subprocess with its own timeout,
    # pays for the compile. PROCAP_SKIP_EXT=1 runs the suite on the references (the C++ cases skip).
    from procap.kernels import _ext

    _ext.load()


@pytest.fixture
def fresh_dispatch(monkeypatch):
    """The kernels' implementation choice made afresh (no ``PROCAP_KERNELS`` override) before and after a test;
    kernel tests take it with ``pytestmark = pytest.mark.usefixtures("fresh_dispatch")``."""
    from procap import kernels  # after TRITON_INTERPRET is set above

    monkeypatch.delenv("PROCAP_KERNELS", raising=False)
    kernels.reset_dispatch()
    yield
    kernels.reset_dispatch()


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


CAPTION_LEN = 16
VOCAB_SIZE = 40  # 8 specials + 32 words
TRAIN_PAIRS = 24


def tiny_config():
    from procap.core.config import get_preset

    """The ``tiny`` preset shrunk further: 32 px images (8 x 8 latents, 4 x 4 tokens), one encoder layer, 16-token captions."""
    vqgan = dataclasses.asdict(get_preset("tiny").vqgan) | {"resolution": 32}
    return get_preset(
        "tiny",
        image_size=32,
        vqgan=vqgan,
        enc_layers=1,
        vocab_size=VOCAB_SIZE,
        max_caption_len=CAPTION_LEN,
        dropout=0.0,
        token_merge=2,  # 4 encoder tokens per frame at 4 x 4 merging: too few for varied untrained memories
    )


def _random_captions(n: int, gen: torch.Generator) -> torch.Tensor:
    from procap.model.decoder import BOS_ID, EOS_ID

    caps = torch.zeros(n, CAPTION_LEN, dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(3, CAPTION_LEN - 4, (1,), generator=gen))
        caps[i, 0] = BOS_ID
        caps[i, 1 : length + 1] = torch.randint(8, VOCAB_SIZE, (length,), generator=gen)
        caps[i, length + 1] = EOS_ID
    return caps


@pytest.fixture(scope="session")
def trained():
    """``(model, before, after)``: a tiny ProCap in eval mode and its training pairs (B, 3, 32, 32)."""
    from procap.model.procap import ProCap  # procap (and triton) only after TRITON_INTERPRET is set above

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    model = ProCap(tiny_config())
    before, after = torch.rand(TRAIN_PAIRS, 3, 32, 32, generator=gen), torch.rand(TRAIN_PAIRS, 3, 32, 32, generator=gen)
    captions = _random_captions(TRAIN_PAIRS, gen)
    with torch.no_grad():
        memory = model.memory(before, after)
    opt = torch.optim.Adam(model.decoder.parameters(), lr=3e-3)
    for _ in range(30):  # partly trained: varied tokens, margins not yet huge
        logits = model.decoder(captions[:, :-1], memory)
        loss = F.cross_entropy(logits.flatten(0, 1), captions[:, 1:].flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    return model.eval(), before, after


@pytest.fixture(scope="session")
def vocab():
    """A Vocabulary of 32 words, so that len(vocab) == VOCAB_SIZE."""
    from procap.data import Vocabulary

    words = [f"word{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(VOCAB_SIZE - 8)]
    vocab = Vocabulary.build([" ".join(words[i : i + 4]) for i in range(0, len(words), 4)], min_count=1)
    assert len(vocab) == VOCAB_SIZE
    return vocab


@pytest.fixture()
def pairs(trained):
    """12 pairs: 6 training pairs and 6 fresh random ones, (12, 3, 32, 32) each."""
    _, before, after = trained
    gen = torch.Generator().manual_seed(7)
    fresh = [torch.rand(6, 3, 32, 32, generator=gen) for _ in range(2)]
    return torch.cat([before[:6], fresh[0]]), torch.cat([after[:6], fresh[1]])
