"""`procap convert --from authors CKPT --vocab WORD2IDX.json [--dataset NAME] --out MODEL.safetensors`: import released
checkpoints, recording what they were trained on when ``--dataset`` says it (:mod:`procap.data.domain`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from procap.core.errors import ProCapError

HELP = "Convert the authors' released ProCap checkpoint into a procap checkpoint (no pickled code runs)."
SOURCES = ("authors",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.data.datasets import DATASETS

    parser.add_argument(
        "checkpoint",
        metavar="CKPT",
        help="the authors' stage-2 checkpoint (model.chkpt / *.pth), a local file or a Hub file "
        "hf://owner/repo[@revision]/path (their repo: hf://BlueberryOreo/ProCap/...)",
    )
    parser.add_argument("--from", dest="source", required=True, choices=SOURCES, help="who wrote CKPT")
    parser.add_argument(
        "--vocab", required=True, help="the word2idx JSON the model was trained with (a file or an hf:// file)"
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        default=None,
        help="the benchmark CKPT was trained on, recorded in the checkpoint so that caption warns on images far "
        "from it (default: not recorded, and caption never warns)",
    )
    parser.add_argument("--out", required=True, help="procap checkpoint to write (.safetensors)")


def run(args: argparse.Namespace) -> int:
    from procap.core import validate
    from procap.core.hub_files import parse_hub_path, resolve_file

    out = Path(args.out)
    validate.output_file(out, "--out")  # before the (slow) conversion or a download: nothing is written on a bad --out
    if out.suffix != ".safetensors":
        raise ProCapError(f"--out {out} must end in .safetensors")
    for value, what in ((args.checkpoint, "authors' checkpoint"), (args.vocab, "--vocab file")):
        parse_hub_path(value, what)  # a malformed hf:// path fails before anything is fetched
    checkpoint = resolve_file(args.checkpoint, "authors' checkpoint")
    vocab_file = resolve_file(args.vocab, "--vocab file")
    # torch and the model only now: a wrong argument is one sentence in the first second
    from procap.convert import convert_authors_checkpoint
    from procap.data.domain import TRAINED_ON, describe_domain, domain_record
    from procap.loading.checkpoint import save_checkpoint

    model, vocab, info = convert_authors_checkpoint(checkpoint, vocab_file)
    c = model.config
    domain = {}
    if args.dataset is not None:  # the real benchmark the authors trained on; its folder is not known here
        from procap.data.datasets import get_dataset

        spec = get_dataset(args.dataset)
        domain = {
            TRAINED_ON: domain_record(
                dataset=args.dataset,
                synthetic=False,
                image_size=c.image_size,
                source_image_size=spec.source_image_size,
            )
        }
    save_checkpoint(out, model, vocab, {"stage": "stage2", **info, **domain})
    print(
        f"converted {args.checkpoint} (epoch {info['epoch']}, {info['ignored_keys']} unused keys dropped): "
        f"authors variant, encoder {c.enc_layers}x{c.enc_dim}, decoder {c.dec_layers}x{c.dec_dim}, "
        f"{c.vocab_size} words, k={c.num_keyframes}, {c.image_size} px"
    )
    print(f"trained on: {describe_domain(domain.get(TRAINED_ON))}")
    print(f"wrote {out}")
    return 0
