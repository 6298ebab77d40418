"""Parity with the authors' own code on their reduced-size checkpoint (fp32, CPU): the acceptance test of issue 11.

Every intermediate the authors recorded is compared with the converted model's (max abs difference <= 1e-4),
then every token and caption must be equal: through ``ProCap.generate`` (the eager oracle), through
``procap.fast.Captioner`` and through ``procap convert`` + ``procap caption --json``. In bf16 free-running tokens
cannot match random weights this sensitive, so teacher-forced logits are compared instead.
"""

from __future__ import annotations

import json

import pytest
import torch

from procap.commands.cli import main
from tests.support import (
    AUTHORS_CHECKPOINT,
    AUTHORS_VOCAB,
    authors_expected,
    authors_expected_captions,
    authors_image_paths,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def outputs(authors_model, fixture_images):
    """The converted model's VQGAN features, encoder input/output and memory for the 8 pairs."""
    model, _ = authors_model
    before, after = fixture_images
    with torch.no_grad():
        features = model.frame_features(torch.stack([before, after], dim=1))
        seq, mask = model.with_prefix(model.procedure_tokens(before, after))
        encoded = model.encoder(seq, mask)
        memory = model.memory(before, after)
    return {"features": features, "encoder_input": seq, "encoder_output": encoded, "memory": memory}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


def test_images_are_read_exactly_as_the_authors_fed_them(fixture_images):
    before, after = fixture_images
    assert torch.equal(torch.stack([before[0], after[0]])[None], authors_expected("image_input"))


def test_vqgan_features(outputs):
    assert _max_diff(outputs["features"], authors_expected("vqgan_features")) <= TOLERANCE


def test_axial_positions_and_prefix(authors_model, outputs):
    model, _ = authors_model
    assert _max_diff(model.positions(), authors_expected("target_pos_emb")) <= 1e-6
    head = authors_expected("encoder_input_head")  # the 26 prefix tokens and the first 4 patches
    assert _max_diff(outputs["encoder_input"][:, : head.shape[1]], head) <= 1e-5


def test_encoder_output_all_positions(outputs):
    assert _max_diff(outputs["encoder_output"], authors_expected("encoder_output")) <= TOLERANCE


def test_decoder_memory(outputs):
    assert _max_diff(outputs["memory"], authors_expected("memory")) <= TOLERANCE


def test_first_step_and_teacher_forced_logits(authors_model, outputs):
    model, _ = authors_model
    with torch.no_grad():
        logits = model.decoder(authors_expected("token_ids"), outputs["memory"])  # (8, 24, 80)
    assert _max_diff(logits[:, 0], authors_expected("logits_step0")) <= TOLERANCE
    assert _max_diff(logits[:, 1], authors_expected("logits_step1")) <= TOLERANCE
    assert _max_diff(logits, authors_expected("step_logits")) <= TOLERANCE


def test_generate_reproduces_every_token_and_caption(authors_model, fixture_images):
    model, vocab = authors_model
    tokens = model.generate(*fixture_images)
    assert torch.equal(tokens, authors_expected("token_ids")[:, 1:])  # all 23 generated tokens, after EOS too
    assert [model.caption_text(vocab, row) for row in tokens.tolist()] == authors_expected_captions()


@pytest.mark.parametrize("batch_sizes", [(1, 8), (3,)])
def test_captioner_reproduces_every_token_and_caption(authors_model, batch_sizes):
    from procap.fast import Captioner

    model, vocab = authors_model
    captioner = Captioner(model, vocab, device="cpu", dtype="fp32", batch_sizes=batch_sizes, pad_to_bucket=True)
    befores, afters = authors_image_paths()
    tokens = captioner.generate(captioner.images(befores), captioner.images(afters))
    assert torch.equal(tokens, authors_expected("token_ids")[:, 1:])
    assert captioner(befores, afters) == authors_expected_captions()


def test_convert_then_caption_cli(tmp_path, capsys):
    out = tmp_path / "authors.safetensors"
    assert (
        main(
            ["convert", "--from", "authors", str(AUTHORS_CHECKPOINT), "--vocab", str(AUTHORS_VOCAB), "--out", str(out)]
        )
        == 0
    )
    capsys.readouterr()
    befores, afters = authors_image_paths()
    paths = [str(p) for pair in zip(befores, afters) for p in pair]
    assert main(["caption", "--ckpt", str(out), "--json", "--device", "cpu", *paths]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["caption"] for row in result] == authors_expected_captions()


def test_bf16_teacher_forced_logits_agree(authors_model, fixture_images):
    """bf16 weights and activations with the authors' tokens fed: logits near theirs, most argmaxes equal.

    The fixture's random decoder is far more sensitive than a trained one (wq/wk drawn with std 0.8, median
    top-1/top-2 gap 0.10, logit std 0.44), so bf16 rounding (about 0.4 %) flips about a fifth of the argmaxes;
    measured: max |diff| 0.64, mean 0.069, top-1 agreement 0.79 over the 192 positions. A wrong scale or layer
    order gives agreement near chance instead.
    """
    import copy

    model, _ = authors_model
    model = copy.deepcopy(model).to(torch.bfloat16)
    before, after = (x.to(torch.bfloat16) for x in fixture_images)
    reference = authors_expected("step_logits")
    with torch.no_grad():
        logits = model.decoder(authors_expected("token_ids"), model.memory(before, after)).float()
    diff = (logits - reference).abs()
    agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    print(
        f"bf16 teacher-forced logits: max |diff| {diff.max().item():.3g}, mean {diff.mean().item():.3g}, "
        f"top-1 agreement {agreement:.3f} over {reference.shape[0] * reference.shape[1]} positions"
    )
    assert agreement >= 0.75
    assert diff.mean().item() <= 0.1 and diff.max().item() <= 1.0
