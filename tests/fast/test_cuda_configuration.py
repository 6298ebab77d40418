"""The configuration a GPU resolves to, built and run on a CPU (``configure_as="cuda"``).

On CUDA the Captioner pads batches to buckets, runs the whole pipeline from static buffers as one captured graph
per bucket, decodes with the lean step and runs the VQGAN channels-last and fused. None of that ran in CI before,
so a defect there (a device compared the wrong way, beam search silently greedy) surfaced only on a GPU. Here the
same configuration runs on the CPU, each graph's function run eagerly in place of its capture, against the oracle
``ProCap.generate``: greedy, beams and sampling, every bucket, odd batch sizes, bad pixels.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from procap.core.errors import ProCapError
from procap.fast import Captioner
from procap.fast.graphs import EagerStep
from procap.fast.settings import resolve_settings
from procap.model.decoder_step import FusedDecodingState
from procap.model.decoding import BeamSearch, Greedy, Sampling
from procap.model.vqgan_fused import FusedVQGANEncoder
from tests.support import IdVocab, requires_cuda

BUCKETS = (1, 4, 8)


def _cuda_configured(model, **kwargs) -> Captioner:
    options = {"device": "cpu", "dtype": "fp32", "max_len": 16, "batch_sizes": BUCKETS, "configure_as": "cuda"}
    return Captioner(model, IdVocab(), **(options | kwargs))


def test_the_cuda_defaults_resolve_without_a_gpu():
    greedy = resolve_settings(torch.device("cuda"), torch.bfloat16, attention_backend="sdpa")
    assert (greedy.use_graphs, greedy.pad_to_bucket, greedy.capture_memory) == (True, True, True)
    assert greedy.channels_last and greedy.strategy == Greedy()
    assert greedy.configured_as == "cuda"
    cpu = resolve_settings(torch.device("cpu"), torch.float32, attention_backend="sdpa")
    assert (cpu.use_graphs, cpu.pad_to_bucket, cpu.capture_memory, cpu.channels_last) == (False,) * 4
    # Beam search decodes eagerly on CUDA too: nothing resolves to the greedy static path.
    beams = resolve_settings(torch.device("cuda"), torch.bfloat16, strategy=BeamSearch(3))
    assert not beams.use_graphs and not beams.capture_memory
    for flag in ("use_graphs", "capture_memory"):
        with pytest.raises(ProCapError, match=f"{flag}=True captures the greedy step; beam decoding runs eagerly"):
            resolve_settings(torch.device("cuda"), torch.bfloat16, strategy=BeamSearch(3), **{flag: True})
    # So does sampling: its random draw is not captured (a graph would need the generator registered with it).
    samples = resolve_settings(torch.device("cuda"), torch.bfloat16, strategy=Sampling(seed=1))
    assert not samples.use_graphs and not samples.capture_memory and not samples.pad_to_bucket
    with pytest.raises(ProCapError, match="use_graphs=True captures the greedy step; sample decoding runs eagerly"):
        resolve_settings(torch.device("cuda"), torch.bfloat16, strategy=Sampling(), use_graphs=True)


def test_configure_as_cuda_is_the_cuda_configuration(trained):
    model = trained[0]
    captioner = Captioner(model, IdVocab(), device="cpu", configure_as="cuda", attention_backend="sdpa")
    expected = resolve_settings(torch.device("cuda"), torch.bfloat16, attention_backend="sdpa")
    assert captioner.settings == expected
    assert captioner.dtype == torch.bfloat16
    captioner.generate(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32))
    assert isinstance(captioner._buckets[1].decoding, FusedDecodingState)  # the decoder's fused step
    encoder = captioner.model.vqgan.encoder
    assert isinstance(encoder, FusedVQGANEncoder) and encoder.channels_last
    assert captioner.model.vqgan.quant_conv.weight.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ProCapError, match="configure_as must be one of"):
        Captioner(model, IdVocab(), device="cpu", configure_as="tpu")


@pytest.mark.parametrize("batch", [1, 3, 5, 8, 12])  # each bucket, odd sizes, a batch split into 8 + 4
def test_whole_pipeline_tokens_equal_generate(trained, pairs, batch):
    model = trained[0]
    captioner = _cuda_configured(model)
    before, after = pairs[0][:batch], pairs[1][:batch]
    assert torch.equal(captioner.generate(before, after), model.generate(before, after, max_len=16))
    buckets = {next(b for b in BUCKETS if b >= rows) for rows in [min(batch, 8), batch - 8] if rows > 0}
    assert captioner.graphs == {("pipeline", b, 16) for b in buckets}
    assert all(isinstance(bucket.pipeline_graph, EagerStep) for bucket in captioner._buckets.values())
    # Reuse: the same static buffers serve the next batch (the warm-up's state was reset, padding rows cleared).
    again = pairs[0][-batch:].flip(0), pairs[1][-batch:].flip(0)
    assert torch.equal(captioner.generate(*again), model.generate(*again, max_len=16))


@pytest.mark.parametrize("batch", [3, 12])
def test_step_graph_tokens_equal_generate(trained, pairs, batch):
    # use_graphs without capture_memory: the decoding step is the graph, the memory is computed eagerly.
    model = trained[0]
    captioner = _cuda_configured(model, capture_memory=False)
    before, after = pairs[0][:batch], pairs[1][:batch]
    assert torch.equal(captioner.generate(before, after), model.generate(before, after, max_len=16))
    assert all(len(key) == 2 for key in captioner.graphs) and captioner.graphs


@pytest.mark.parametrize("batch", [1, 3, 9])
def test_beams_decode_with_beams_in_the_cuda_configuration(trained, pairs, batch):
    model = trained[0]
    captioner = _cuda_configured(model, num_beams=3)
    assert captioner.strategy == BeamSearch(3) and not captioner.capture_memory and not captioner.use_graphs
    before, after = pairs[0][:batch], pairs[1][:batch]
    beams = captioner.generate(before, after)
    assert torch.equal(beams, model.generate(before, after, max_len=16, num_beams=3))
    assert not captioner.graphs


def test_beams_differ_from_greedy_somewhere(trained, pairs):
    # Guards the test above: on these pairs beam search finds captions greedy decoding does not.
    model = trained[0]
    greedy = _cuda_configured(model).generate(*pairs)
    beams = _cuda_configured(model, num_beams=3).generate(*pairs)
    assert not torch.equal(greedy, beams)


def _sampled_by_the_oracle(model, before, after, strategy, chunk: int = BUCKETS[-1]) -> torch.Tensor:
    """``ProCap.generate`` over the Captioner's chunks: each chunk draws from a generator seeded anew."""
    rows = range(0, before.shape[0], chunk)
    return torch.cat([model.generate(before[r : r + chunk], after[r : r + chunk], 16, strategy=strategy) for r in rows])


@pytest.mark.parametrize("configure_as", [None, "cuda"])
@pytest.mark.parametrize("batch", [1, 3, 9])
def test_sampling_decodes_by_sampling_and_equals_the_oracle(trained, pairs, batch, configure_as):
    model = trained[0]
    captioner = _cuda_configured(
        model, strategy="sample", strategy_options={"top_p": 0.9, "seed": 3}, configure_as=configure_as
    )
    assert captioner.strategy == Sampling(top_p=0.9, seed=3) and not captioner.capture_memory
    before, after = pairs[0][:batch], pairs[1][:batch]
    samples = captioner.generate(before, after)
    assert torch.equal(samples, _sampled_by_the_oracle(model, before, after, captioner.strategy))
    assert torch.equal(captioner.generate(before, after), samples)  # the same seed: the same captions
    assert not captioner.graphs


def test_samples_differ_from_greedy_and_between_seeds(trained, pairs):
    # Guards the test above: on these pairs sampling leaves the greedy captions, and the seed matters.
    model = trained[0]
    greedy = _cuda_configured(model).generate(*pairs)
    first = _cuda_configured(model, strategy="sample", strategy_options={"seed": 1}).generate(*pairs)
    second = _cuda_configured(model, strategy="sample", strategy_options={"seed": 2}).generate(*pairs)
    assert not torch.equal(greedy, first) and not torch.equal(first, second)
    cold = _cuda_configured(model, strategy="sample", strategy_options={"top_k": 1, "seed": 1})
    assert torch.equal(cold.generate(*pairs), greedy)


@requires_cuda
def test_sampling_on_a_gpu_is_reproducible_and_equals_the_oracle(trained, pairs):
    """Only a GPU draws from a CUDA generator (its Philox stream differs from the CPU's); sampling is not captured."""
    model = copy.deepcopy(trained[0]).cuda()
    before, after = pairs[0].cuda(), pairs[1].cuda()
    strategy = Sampling(temperature=0.8, top_k=6, top_p=0.95, seed=5)
    exact = Captioner(model, IdVocab(), device="cuda", dtype="fp32", max_len=16, batch_sizes=BUCKETS, strategy=strategy)
    samples = exact.generate(before, after)
    assert torch.equal(samples, _sampled_by_the_oracle(model, before, after, strategy))
    assert torch.equal(exact.generate(before, after), samples) and not exact.graphs
    fast = Captioner(model, IdVocab(), device="cuda", max_len=16, batch_sizes=BUCKETS, strategy=strategy)
    assert fast.dtype != torch.float32 and not fast.use_graphs
    assert torch.equal(fast.generate(before, after), fast.generate(before, after))


def test_bad_pixels_are_refused_and_do_not_stay_in_the_bucket(trained, pairs):
    captioner = _cuda_configured(trained[0])
    bad = pairs[0][:3].clone()
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(ProCapError, match="before images hold NaN"):
        captioner.generate(bad, pairs[1][:3])
    with pytest.raises(ProCapError, match="divide 0-255"):
        captioner.generate(pairs[0][:3], pairs[1][:3] * 255)
    before, after = pairs[0][:2], pairs[1][:2]  # the same 4-row bucket, now with a good batch
    assert torch.equal(captioner.generate(before, after), trained[0].generate(before, after, max_len=16))


def test_bf16_default_runs_and_agrees_with_the_fp32_oracle(trained, pairs):
    model = trained[0]
    captioner = Captioner(model, IdVocab(), device="cpu", max_len=16, batch_sizes=BUCKETS, configure_as="cuda")
    assert captioner.dtype == torch.bfloat16
    fast, ref = captioner.generate(*pairs), model.generate(*pairs, max_len=16)
    first = (fast[:, 0] == ref[:, 0]).float().mean().item()
    assert first >= 0.75 and (fast == ref).float().mean().item() >= 0.5  # near-ties may flip in bf16


def test_to_keeps_the_configuration(trained, pairs):
    model = trained[0]
    captioner = _cuda_configured(model)
    captioner.generate(pairs[0][:2], pairs[1][:2])
    captioner.to("cpu", torch.float64)
    assert dataclasses.replace(captioner.settings, dtype=torch.float32) == _cuda_configured(model).settings
    oracle = copy.deepcopy(model).double()
    before, after = pairs[0][:3].double(), pairs[1][:3].double()
    assert torch.equal(captioner.generate(before, after), oracle.generate(before, after, max_len=16))


def test_graphs_on_the_cpu_need_the_cuda_configuration(trained):
    with pytest.raises(ProCapError, match="configure_as='cuda'"):
        Captioner(trained[0], IdVocab(), device="cpu", use_graphs=True)
