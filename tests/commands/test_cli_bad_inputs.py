"""Every CLI command through a table of bad inputs.

Each case must end with exit code 2, exactly one line on stderr that names the file or argument at fault, no
traceback, and no file created, changed or removed anywhere in the workspace or the working directory. The
categories are: missing / directory / empty / corrupt / wrong type / out of range / unwritable output /
existing output (a file where a folder goes, or the reverse, or a non-empty dataset folder) / output is an input
(the same file, a link to it, or a place inside a folder the command reads) / disk full (the operating system
refuses the write mid-run, played by a file-size limit). A command added to ``procap.commands.cli.COMMANDS`` fails
:func:`test_every_command_is_in_the_table` until its cases are added here. The same table, by category, is in
docs/errors.md.

Inputs are tiny (16 px images, a one-layer model) so the whole table runs in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

from procap.commands.cli import COMMANDS, build_parser, main
from tests.support import micro_model

KINDS = (
    "missing",
    "directory",
    "empty",
    "corrupt",
    "wrong type",
    "out of range",
    "unwritable",
    "existing",
    "output is input",
    "disk full",
)
DISK_FULL_BYTES = 64  # RLIMIT_FSIZE of the "disk full" cases: every output is larger, so its write fails


@dataclass(frozen=True)
class Case:
    """One bad invocation. ``argv`` and ``needle`` use ``{name}`` placeholders for workspace paths."""

    command: str
    kind: str
    argv: tuple[str, ...]
    needle: str
    env: tuple[tuple[str, str], ...] = ()
    file_size_limit: int | None = None

    @property
    def id(self) -> str:
        return f"{self.command}-{self.kind}-{' '.join(self.argv[1:])[:60]}"


def case(kind: str, argv: str, needle: str, **env: str) -> Case:
    parts = tuple(argv.split())
    return Case(parts[0], kind, parts, needle, tuple(env.items()))


def disk_full(argv: str, needle: str) -> Case:
    """The output cannot be written (no space left); the sentence names it and nothing is left half-written."""
    parts = tuple(argv.split())
    return Case(parts[0], "disk full", parts, needle, file_size_limit=DISK_FULL_BYTES)


TRAIN_OK = "--data {data} --out {out} --preset tiny --steps 1 --batch-size 2"
EVAL_OK = "--ckpt {ckpt} --data {data} --out {out} --metrics BLEU-4"
PAIR = "{bef} {aft}"
CONVERT_OK = "--from authors {src} --vocab {{word2idx}} --out {{out}}/m.safetensors"
PROC_OK = "--data {data} --pair CLEVR_semantic_000000.png --cache {some_dir} --out {out}/p.png"
PROC_VQ = "--data {data} --pair CLEVR_semantic_000000.png --vqgan {vqgan} --out {out}/p.png"
PREP_OK = "--dataset clevr-change --root {data} --vqgan {vqgan} --out {out} --workers 1"

CASES = [
    # demo: no input files; arguments and the output folder
    case("out of range", "demo --workers -1 --out {out}", "--workers"),
    case("out of range", "demo --workers 100000 --out {out}", "--workers"),
    case("out of range", "demo --seeds 0 --out {out}", "--seeds"),
    # every seed trains the four models again: a documented ceiling, checked before the benchmark is written
    case("out of range", "demo --seeds 100000 --out {out}", "--seeds must be at most 64"),
    case("out of range", "demo --jobs 0 --out {out}", "--jobs"),
    case("out of range", "demo --jobs 5 --out {out}", "--jobs"),
    case("out of range", "demo --seed -1 --out {out}", "--seed"),
    case("wrong type", "demo --seed x --out {out}", "--seed"),
    case("wrong type", "demo --device bogus --out {out}", "--device"),
    case("out of range", "demo --device cuda:99 --out {out}", "--device"),
    case("unwritable", "demo --out {unwritable}", "--out"),
    case("existing", "demo --out {file}", "--out"),
    case("wrong type", "demo --viewpoint sideways --out {out}", "--viewpoint"),
    case("wrong type", "demo --procedures flow --out {out}", "--procedures"),
    # the full demo's default is distractor: an older demo folder at none is not generated again under it
    case("existing", "demo --resume --out {demo_at_none}", "pass --viewpoint none"),
    # synth
    case("out of range", "synth --out {out} --scenes 0", "--scenes"),
    case("out of range", "synth --out {out} --scenes 10000000000", "--scenes"),  # listed up front: all memory
    case("out of range", "synth --out {out} --size 8", "--size"),
    case("out of range", "synth --out {out} --workers 0", "--workers"),
    case("out of range", "synth --out {out} --workers 100000", "--workers"),
    case("out of range", "synth --out {out} --seed -1", "--seed"),
    case("wrong type", "synth --out {out} --scenes many", "--scenes"),
    case("wrong type", "synth --out {out} --scenes 2 --viewpoint sideways", "--viewpoint"),
    case("unwritable", "synth --out {unwritable} --scenes 2", "--out"),
    case("existing", "synth --out {file} --scenes 2", "--out"),
    # vocab
    case("missing", "vocab --dataset clevr-change --root {missing} --out {out}/v.json", "{missing}"),
    case("directory", "vocab --dataset clevr-change --root {file} --out {out}/v.json", "{file}"),
    case("empty", "vocab --dataset clevr-change --root {empty_dir} --out {out}/v.json", "splits.json"),
    case("corrupt", "vocab --dataset clevr-change --root {corrupt_clevr} --out {out}/v.json", "splits.json"),
    case("wrong type", "vocab --dataset spot-the-diff --root {typed_spot} --out {out}/v.json", "train.json"),
    case("wrong type", "vocab --dataset image-editing-request --root {typed_ier} --out {out}/v.json", "img0"),
    case("wrong type", "vocab --dataset nope --root {data} --out {out}/v.json", "--dataset"),
    case("out of range", "vocab --dataset clevr-change --root {data} --out {out}/v.json --min-count 0", "--min-count"),
    # no training word is that frequent: a vocabulary of special tokens only was written with exit 0
    case(
        "out of range", "vocab --dataset clevr-change --root {data} --out {out}/v.json --min-count 99999", "--min-count"
    ),
    case("unwritable", "vocab --dataset clevr-change --root {data} --out {unwritable}", "--out"),
    case("existing", "vocab --dataset clevr-change --root {data} --out {some_dir}", "--out"),
    # prepare
    case("missing", f"prepare {PREP_OK} --vqgan {{missing}}", "--vqgan"),
    case("missing", "prepare --dataset clevr-change --root {data} --out {out}", "--vqgan"),
    case("missing", f"prepare {PREP_OK} --root {{missing}}", "--root"),
    case("directory", f"prepare {PREP_OK} --vqgan {{some_dir}}", "--vqgan"),
    case("empty", f"prepare {PREP_OK} --vqgan {{empty}}", "{empty}"),
    case("corrupt", f"prepare {PREP_OK} --vqgan {{text_ckpt}}", "{text_ckpt}"),
    case("wrong type", f"prepare {PREP_OK} --vqgan {{ckpt}}", "{ckpt}"),
    case("corrupt", f"prepare {PREP_OK} --vqgan {{text_taming}}", "{text_taming}"),
    case("empty", f"prepare {PREP_OK} --vqgan {{empty_taming}}", "{empty_taming}"),
    case("corrupt", f"prepare {PREP_OK} --vqgan {{huge_vqgan}}", "vqgan_huge"),
    case("empty", "prepare --dataset clevr-change --root {empty_dir} --vqgan {vqgan} --out {out}", "splits.json"),
    case("out of range", f"prepare {PREP_OK} --limit 0", "--limit"),
    case("out of range", f"prepare {PREP_OK} --workers 0", "--workers"),
    case("out of range", f"prepare {PREP_OK} --workers 100000", "--workers"),
    case("out of range", f"prepare {PREP_OK} --size 8", "--size"),
    case("out of range", f"prepare {PREP_OK} --frames 4", "--frames"),
    case("missing", f"prepare {PREP_OK} --similarity scores", "--scores-file"),
    case("unwritable", "prepare --dataset clevr-change --root {data} --vqgan {vqgan} --out {unwritable}", "--out"),
    case("existing", "prepare --dataset clevr-change --root {data} --vqgan {vqgan} --out {file}", "--out"),
]

for _stage in ("vqgan", "pretrain", "train"):
    CASES += [
        case("missing", f"{_stage} {TRAIN_OK} --data {{missing}}", "--data"),
        case("directory", f"{_stage} {TRAIN_OK} --data {{file}}", "--data"),
        case("empty", f"{_stage} {TRAIN_OK} --data {{empty_dir}}", "splits.json"),
        case("corrupt", f"{_stage} {TRAIN_OK} --data {{corrupt_clevr}}", "splits.json"),
        case("wrong type", f"{_stage} {TRAIN_OK} --steps abc", "--steps"),
        case("wrong type", f"{_stage} {TRAIN_OK} --preset huge", "huge"),
        case("wrong type", f"{_stage} {TRAIN_OK} --device bogus", "--device"),
        case("out of range", f"{_stage} {TRAIN_OK} --lr -1", "--lr"),
        case("out of range", f"{_stage} {TRAIN_OK} --lr nan", "--lr"),
        case("out of range", f"{_stage} {TRAIN_OK} --steps 0", "--steps"),
        # multipliers of time from the user have documented ceilings (procap.train.config.INTEGER_BOUNDS)
        case("out of range", f"{_stage} {TRAIN_OK} --steps 1000000000000", "--steps must be at most 10,000,000"),
        case("out of range", f"{_stage} {TRAIN_OK} --grad-accum 0", "--grad-accum"),
        case("out of range", f"{_stage} {TRAIN_OK} --grad-accum 100000", "--grad-accum must be at most 1,024"),
        case("out of range", f"{_stage} --data {{data}} --out {{out}} --epochs 10000000", "--epochs must be at most"),
        case("out of range", f"{_stage} {TRAIN_OK} --warmup-steps 100000000000", "--warmup-steps"),
        case("out of range", f"{_stage} {TRAIN_OK} --log-every 100000000000", "--log-every"),
        case("out of range", f"{_stage} {TRAIN_OK} --batch-size 0", "--batch-size"),
        # more than any machine holds (a single process without --grad-accum would cut it to the items)
        case("out of range", f"{_stage} {TRAIN_OK} --batch-size 1000000000000 --grad-accum 2", "--batch-size"),
        case("out of range", f"{_stage} {TRAIN_OK} --workers -1", "--workers"),
        case("out of range", f"{_stage} {TRAIN_OK} --workers 100000", "--workers"),
        # the library reads the torchrun environment itself: a bad value there was a ValueError traceback
        case("wrong type", f"{_stage} {TRAIN_OK}", "WORLD_SIZE", WORLD_SIZE="abc", RANK="0", LOCAL_RANK="0"),
        case("out of range", f"{_stage} {TRAIN_OK} --save-every -1", "--save-every"),
        case("out of range", f"{_stage} {TRAIN_OK} --grad-clip -1", "--grad-clip"),
        case("out of range", f"{_stage} {TRAIN_OK} --seed -1", "--seed"),
        case("out of range", f"{_stage} {TRAIN_OK} --device cuda:99", "--device"),
        case("missing", f"{_stage} {TRAIN_OK} --resume", "--resume"),
        case("unwritable", f"{_stage} --data {{data}} --out {{unwritable}} --steps 1", "--out"),
        case("existing", f"{_stage} --data {{data}} --out {{file}} --steps 1", "--out"),
    ]
for _stage in ("pretrain", "train"):
    CASES += [
        case("missing", f"{_stage} {TRAIN_OK} --init {{missing}}", "--init"),
        case("directory", f"{_stage} {TRAIN_OK} --init {{some_dir}}", "--init"),
        case("empty", f"{_stage} {TRAIN_OK} --init {{empty}}", "{empty}"),
        case("corrupt", f"{_stage} {TRAIN_OK} --init {{text_ckpt}}", "{text_ckpt}"),
        case("wrong type", f"{_stage} {TRAIN_OK} --init {{vqgan}}", "{vqgan}"),
        case("corrupt", f"{_stage} {TRAIN_OK} --init {{huge_ckpt}}", "{huge_ckpt}"),
        case("missing", f"{_stage} {TRAIN_OK} --vqgan {{missing}}", "--vqgan"),
        case("wrong type", f"{_stage} {TRAIN_OK} --vqgan {{ckpt}}", "{ckpt}"),
        case("corrupt", f"{_stage} {TRAIN_OK} --vqgan {{huge_vqgan}}", "vqgan_huge"),
        case("out of range", f"{_stage} {TRAIN_OK} --num-keyframes 99", "--num-keyframes"),
        # the checkpoint's model is trained: another --preset was ignored with exit 0
        case("wrong type", f"{_stage} {TRAIN_OK} --init {{ckpt}} --preset clevr", "--preset clevr differs"),
    ]
CASES += [
    case("missing", f"pretrain {TRAIN_OK} --procedures {{missing}}", "--procedures"),
    # the exact frames exist only for a benchmark that procap synth wrote (its scenes.json)
    case("wrong type", f"pretrain {TRAIN_OK} --data {{empty_dir}} --procedures truth", "--procedures truth"),
    case("corrupt", f"pretrain {TRAIN_OK} --procedures {{corrupt_cache}}", "corrupt_cache"),
    case("empty", f"pretrain {TRAIN_OK} --procedures {{partial_cache}}", "partial_cache"),
    case("out of range", f"train {TRAIN_OK} --warmup-frac 5", "--warmup-frac"),
    case("out of range", f"train {TRAIN_OK} --val-pairs 0", "--val-pairs"),
    case("out of range", f"train {TRAIN_OK} --decoder-lr 0", "--decoder-lr"),
    # convert (the authors' checkpoints)
    case("missing", f"convert {CONVERT_OK.format(src='{missing}')}", "{missing}"),
    case("directory", f"convert {CONVERT_OK.format(src='{some_dir}')}", "{some_dir}"),
    case("empty", f"convert {CONVERT_OK.format(src='{empty_taming}')}", "{empty_taming}"),
    case("corrupt", f"convert {CONVERT_OK.format(src='{text_taming}')}", "{text_taming}"),
    case("wrong type", f"convert {CONVERT_OK.format(src='{ckpt}')}", "{ckpt}"),
    # a 1.4 KB file asked for 1 GiB: a one-element storage viewed as 16384 x 16384 by stride 0
    case("corrupt", f"convert {CONVERT_OK.format(src='{stride_zero_taming}')}", "more elements than its storage"),
    case("missing", "convert --from authors {text_taming} --vocab {missing} --out {out}/m.safetensors", "--vocab"),
    case("wrong type", "convert --from authors {text_taming} --vocab {refs} --out {out}/m.safetensors", "{refs}"),
    case("unwritable", "convert --from authors {text_taming} --vocab {word2idx} --out {unwritable}", "--out"),
    case("existing", "convert --from authors {text_taming} --vocab {word2idx} --out {some_dir}", "--out"),
    # imagine
    case("missing", f"imagine --ckpt {{missing}} {PAIR} --out {{out}}/s.png", "{missing}"),
    case("directory", f"imagine --ckpt {{some_dir}} {PAIR} --out {{out}}/s.png", "{some_dir}"),
    case("empty", f"imagine --ckpt {{empty}} {PAIR} --out {{out}}/s.png", "{empty}"),
    case("corrupt", f"imagine --ckpt {{text_ckpt}} {PAIR} --out {{out}}/s.png", "{text_ckpt}"),
    case("wrong type", f"imagine --ckpt {{vqgan}} {PAIR} --out {{out}}/s.png", "{vqgan}"),
    case("missing", "imagine --ckpt {ckpt} {bef} {missing} --out {out}/s.png", "{missing}"),
    case("out of range", f"imagine --ckpt {{ckpt}} {PAIR} --out {{out}}/s.png --seed -1", "--seed"),
    case("out of range", f"imagine --ckpt {{ckpt}} {PAIR} --out {{out}}/s.png --sample --seed {2**70}", "--seed"),
    case("out of range", f"imagine --ckpt {{ckpt}} {PAIR} --out {{out}}/s.png --tile 2", "--tile"),
    case("unwritable", f"imagine --ckpt {{ckpt}} {PAIR} --out {{unwritable}}.png", "--out"),
    case("existing", f"imagine --ckpt {{ckpt}} {PAIR} --out {{some_dir}}", "--out"),
    # procedure
    case("missing", f"procedure {PROC_OK} --data {{missing}}", "--data"),
    case("directory", f"procedure {PROC_OK} --data {{file}}", "--data"),
    case("wrong type", f"procedure {PROC_OK} --pair no_such_pair.png", "--pair"),
    case("missing", f"procedure {PROC_OK} --cache {{missing}}", "--cache"),
    case("empty", f"procedure {PROC_OK} --cache {{some_dir}}", "{some_dir}"),
    case("corrupt", f"procedure {PROC_OK} --cache {{text_file}}", "{text_file}"),
    case("missing", "procedure --data {data} --pair CLEVR_semantic_000000.png --out {out}/p.png", "--cache"),
    case("missing", "procedure --data {data} --pair CLEVR_semantic_000000.png --vqgan {missing}", "--vqgan"),
    case("out of range", f"procedure {PROC_OK} --num-keyframes -1", "--num-keyframes"),
    case("out of range", f"procedure {PROC_OK} -k 100000", "--num-keyframes must be at most 15"),
    case("out of range", f"procedure {PROC_OK} --keyframes 100000", "--num-keyframes must be at most 15"),  # old flag
    case("out of range", f"procedure {PROC_VQ} --frames 3 -k 4", "--num-keyframes must be at most l = 3"),
    case("out of range", f"procedure {PROC_OK} --tile 2", "--tile"),
    case("out of range", f"procedure {PROC_OK} --seed -1", "--seed"),
    case("out of range", f"procedure {PROC_OK} --seed {2**64}", "--seed"),
    case("wrong type", f"procedure {PROC_OK} --out {{out}}/p.txt", "--out"),
    case("unwritable", f"procedure {PROC_OK} --out {{unwritable}}.png", "--out"),
    case("existing", f"procedure {PROC_OK} --out {{some_dir}}", "--out"),
    # evaluate
    case("missing", f"evaluate {EVAL_OK} --ckpt {{missing}}", "{missing}"),
    case("directory", f"evaluate {EVAL_OK} --ckpt {{some_dir}}", "holds no model.safetensors"),
    case("wrong type", f"evaluate {EVAL_OK} --ckpt {{torch_pickle}}", "procap convert --from authors"),
    case("wrong type", f"evaluate {EVAL_OK} --ckpt hf://not-a-repo", "hf://owner/repo"),
    case("empty", f"evaluate {EVAL_OK} --ckpt {{empty}}", "{empty}"),
    case("corrupt", f"evaluate {EVAL_OK} --ckpt {{text_ckpt}}", "{text_ckpt}"),
    case("corrupt", f"evaluate {EVAL_OK} --ckpt {{huge_ckpt}}", "enc_dim"),
    case("corrupt", f"evaluate {EVAL_OK} --ckpt {{vocab_ckpt}}", "{vocab_ckpt}"),
    case("wrong type", f"evaluate {EVAL_OK} --ckpt {{vqgan}}", "{vqgan}"),
    case("wrong type", f"evaluate {EVAL_OK} --ckpt {{int_ckpt}}", "{int_ckpt}"),
    case("missing", f"evaluate {EVAL_OK} --data {{missing}}", "{missing}"),
    case("empty", f"evaluate {EVAL_OK} --data {{empty_dir}}", "splits.json"),
    case("corrupt", f"evaluate {EVAL_OK} --data {{corrupt_clevr}}", "splits.json"),
    case("out of range", f"evaluate {EVAL_OK} --max-pairs 0", "--max-pairs"),
    case("out of range", f"evaluate {EVAL_OK} --max-pairs -1", "--max-pairs"),
    case("out of range", f"evaluate {EVAL_OK} --batch-size 0", "--batch-size"),
    case("out of range", f"evaluate {EVAL_OK} --beams 100000", "--beams"),
    case("out of range", f"evaluate {EVAL_OK} --strategy sample --top-p 1.5", "--top-p must be at most 1"),
    case("wrong type", f"evaluate {EVAL_OK} --top-k 5", "--top-k applies to --strategy sample only"),
    case("out of range", f"evaluate {EVAL_OK} --device cuda:99", "--device"),
    case("wrong type", f"evaluate {EVAL_OK} --device bogus", "--device"),
    case("wrong type", "evaluate --ckpt {ckpt} --data {data} --out {out} --metrics BLEU-5", "--metrics"),
    case("unwritable", "evaluate --ckpt {ckpt} --data {data} --out {unwritable}", "--out"),
    case("existing", "evaluate --ckpt {ckpt} --data {data} --out {file}", "--out"),
    # caption
    case("missing", "caption --ckpt {ckpt} {bef} {missing}", "{missing}"),
    case("directory", "caption --ckpt {ckpt} {bef} {some_dir}", "is a directory"),
    case("empty", "caption --ckpt {ckpt} {bef} {empty}", "{empty}"),
    case("corrupt", "caption --ckpt {ckpt} {bef} {corrupt_png}", "{corrupt_png}"),
    case("wrong type", "caption --ckpt {ckpt} {bef} {text_file}", "{text_file}"),
    case(
        "out of range",
        "caption --ckpt {ckpt} {bef} {big_png}",
        "PROCAP_MAX_IMAGE_PIXELS",
        PROCAP_MAX_IMAGE_PIXELS="100",
    ),
    case("wrong type", "caption --ckpt {ckpt} {bef}", "odd number"),
    case("wrong type", "caption --ckpt {torch_pickle} {bef} {aft}", "procap convert --from authors"),
    case("out of range", "caption --ckpt {ckpt} {bef} {aft} --beams 0", "--beams"),
    # 100000 beams grew to 22.9 GB and were killed by the kernel without a message
    case("out of range", "caption --ckpt {ckpt} {bef} {aft} --beams 100000", "--beams"),
    case("out of range", "caption --ckpt {ckpt} {bef} {aft} --strategy sample --temperature 0", "--temperature"),
    case("out of range", "caption --ckpt {ckpt} {bef} {aft} --strategy sample --seed -1", "--seed must be at least 0"),
    case("wrong type", "caption --ckpt {ckpt} {bef} {aft} --strategy sample --beams 2", "takes no --beams"),
    case("wrong type", "caption --ckpt {ckpt} {bef} {aft} --strategy nucleus", "--strategy"),
    case("missing", f"caption --ckpt {{missing}} {PAIR}", "{missing}"),
    case("directory", f"caption --ckpt {{some_dir}} {PAIR}", "--ckpt"),
    case("empty", f"caption --ckpt {{empty}} {PAIR}", "{empty}"),
    case("corrupt", f"caption --ckpt {{text_ckpt}} {PAIR}", "{text_ckpt}"),
    case("corrupt", f"caption --ckpt {{huge_ckpt}} {PAIR}", "enc_dim"),
    case("wrong type", f"caption --ckpt {{vqgan}} {PAIR}", "{vqgan}"),
    case("corrupt", f"caption --ckpt {{nan_ckpt}} {PAIR}", "{nan_ckpt}"),
    case("wrong type", f"caption --ckpt {{int_ckpt}} {PAIR}", "is int32 where the model holds floating-point"),
    case("out of range", f"caption --ckpt {{ckpt}} {PAIR} --batch-size 0", "--batch-size"),
    case("out of range", f"caption --ckpt {{ckpt}} {PAIR} --max-len 1", "--max-len"),
    case("out of range", f"caption --ckpt {{ckpt}} {PAIR} --max-len 999", "max_len"),
    case("wrong type", f"caption --ckpt {{ckpt}} {PAIR} --device bogus", "--device"),
    case("wrong type", f"caption --ckpt {{ckpt}} {PAIR} --dtype fp8", "--dtype"),
    case("wrong type", f"caption --ckpt {{float8_ckpt}} {PAIR}", "float8_e4m3fn"),
    case("wrong type", f"caption --ckpt {{ckpt}} {PAIR} --device cpu", "PROCAP_ATTENTION", PROCAP_ATTENTION="bogus"),
    case("wrong type", f"caption --ckpt {{ckpt}} {PAIR} --device cpu", "PROCAP_ATTENTION", PROCAP_ATTENTION="flash"),
    case("existing", f"caption --ckpt {{ckpt}} {PAIR} --out {{old_captions}}", "--overwrite"),
    case("corrupt", f"caption --ckpt {{ckpt}} {PAIR} --out {{old_captions}} --resume", "not a caption file"),
    case("corrupt", "caption --ckpt {ckpt} --before-dir {data}/images --after-dir {data}/sc_images", "only in"),
    case("missing", "caption --ckpt {ckpt} --pairs {missing}", "{missing}"),
    case("wrong type", "caption --ckpt {ckpt} --pairs {refs}", "must be a .csv or .jsonl"),
    case("wrong type", f"caption --ckpt {{ckpt}} {PAIR} --out {{out}}/captions.txt", "--out"),
    case("unwritable", f"caption --ckpt {{ckpt}} {PAIR} --out {{unwritable}}.jsonl", "--out"),
    # score
    case("missing", "score --pred {missing} --refs {refs}", "{missing}"),
    case("directory", "score --pred {some_dir} --refs {refs}", "is a directory"),
    case("empty", "score --pred {empty} --refs {refs}", "{empty}"),
    case("corrupt", "score --pred {corrupt_json} --refs {refs}", "{corrupt_json}"),
    case("wrong type", "score --pred {list_json} --refs {refs}", "{list_json}"),
    case("wrong type", "score --pred {pred_null_caption} --refs {refs}", "{pred_null_caption}"),
    case("missing", "score --pred {pred} --refs {missing}", "{missing}"),
    case("corrupt", "score --pred {pred} --refs {corrupt_json}", "{corrupt_json}"),
    case("wrong type", "score --pred {pred} --refs {list_json}", "{list_json}"),
    case("wrong type", "score --pred {pred} --refs {refs} --types {list_json}", "{list_json}"),
    case("empty", "score --pred {pred} --refs {refs} --types {other_types}", "no change type for id 'p1'"),
    case("wrong type", "score --pred {pred} --refs {refs} --metrics blue", "--metrics"),
    case("wrong type", "score --pred {pred} --refs {other_refs}", "{other_refs}"),
    case("missing", "score --pred {pred}", "--refs"),
    case("missing", "score --pred {pred} --dataset clevr-change --root {missing}", "{missing}"),
    case("unwritable", "score --pred {pred} --refs {refs} --metrics bleu --out {unwritable}", "--out"),
    case("existing", "score --pred {pred} --refs {refs} --metrics bleu --out {some_dir}", "--out"),
    # info
    case("wrong type", "info huge", "huge"),
    case("missing", "info", "preset"),
    # profile
    case("missing", "profile --ckpt {missing} --out {out}", "{missing}"),
    case("directory", "profile --ckpt {some_dir} --out {out}", "--ckpt"),
    case("empty", "profile --ckpt {empty} --out {out}", "{empty}"),
    case("corrupt", "profile --ckpt {text_ckpt} --out {out}", "{text_ckpt}"),
    case("wrong type", "profile --ckpt {vqgan} --out {out}", "{vqgan}"),
    case("out of range", "profile --ckpt {ckpt} --out {out} --batch-size 0", "--batch-size"),
    case("out of range", "profile --ckpt {ckpt} --out {out} --steps 100000000", "--steps must be at most 1,000"),
    case("out of range", "profile --ckpt {ckpt} --out {out} --batch-size 1000000000000", "--batch-size"),
    case("out of range", "profile --ckpt {ckpt} --out {out} --steps 0", "--steps"),
    case("wrong type", "profile --ckpt {ckpt} --out {out} --device bogus", "--device"),
    case("unwritable", "profile --ckpt {ckpt} --out {unwritable}", "--out"),
    case("existing", "profile --ckpt {ckpt} --out {file}", "--out"),
]

# Inputs that used to give a silently wrong result with exit 0.
CASES += [
    case("corrupt", "score --pred {dup_key_pred} --refs {refs}", "'p1' twice"),
    case("corrupt", "score --pred {pred} --refs {dup_key_refs}", "'p1' twice"),
    case("empty", "score --pred {pred} --refs {blank_refs}", "no reference caption for id 'p1'"),
    case("corrupt", "vocab --dataset clevr-change --root {dup_split_clevr} --out {out}/v.json", "twice"),
    case("corrupt", f"evaluate {EVAL_OK} --data {{dup_split_clevr}}", "lists pair CLEVR_semantic_"),
    case("wrong type", f"train {TRAIN_OK} --config {{config_text_steps}}", "steps must be an integer, got 'ten'"),
    case("wrong type", f"pretrain {TRAIN_OK} --config {{config_list_lr}}", "lr must be a number, got [1, 2]"),
    case("wrong type", "vqgan --out {out} --config {config_number_data}", "data must be text, got 5"),
    case("wrong type", f"train {TRAIN_OK} --config {{config_yes_amp}}", "amp must be true or false"),
    case(
        "corrupt",
        "prepare --dataset clevr-change --root {changed_data} --vqgan {vqgan} --out {stale_cache} --limit 2",
        "changed since cache {stale_cache} was built from it",
    ),
]

# One JSON (and YAML) reader: a key given twice, or two names for one thing, is refused wherever it is read.
CASES += [
    case(
        "corrupt", f"train {TRAIN_OK} --config {{config_dup_steps}}", "{config_dup_steps} names the key 'steps' twice"
    ),
    case("corrupt", f"pretrain {TRAIN_OK} --config {{config_dup_yaml}}", "{config_dup_yaml} names the key 'lr' twice"),
    case("corrupt", "vocab --dataset clevr-change --root {two_names_clevr} --out {out}/v.json", "names scene 1 twice"),
    case("corrupt", f"evaluate {EVAL_OK} --data {{two_types_clevr}}", "type_mapping.json lists scene"),
    case("corrupt", "score --pred {pred} --refs {refs} --types {types_total}", "{types_total}"),
    case("corrupt", f"caption --ckpt {{dup_meta_ckpt}} {PAIR}", "names the key 'stage' twice"),
]

# Outputs that would destroy an input, and outputs the operating system refuses mid-run.
CASES += [
    case("output is input", "score --pred {pred} --refs {refs} --metrics bleu --out {pred}", "--pred"),
    case("output is input", "score --pred {pred} --refs {refs} --metrics bleu --out {refs}", "--refs"),
    case("output is input", "score --pred {pred} --refs {refs} --metrics bleu --out {refs_hard_link}", "--refs"),
    case("output is input", "score --pred {pred} --refs {refs} --metrics bleu --out {refs_symlink}", "--refs"),
    case("output is input", "vocab --dataset clevr-change --root {data} --out {data}/splits.json", "--root"),
    case("output is input", "vocab --dataset clevr-change --root {data} --out {data}/vocab.json", "--root"),
    case("existing", "synth --out {data} --scenes 2", "--overwrite"),
    case("existing", "synth --out {clevr_like} --scenes 2 --overwrite", "{clevr_like}"),
    case("output is input", "prepare --dataset clevr-change --root {data} --vqgan {vqgan} --out {data}/c", "--root"),
    case("output is input", f"train {TRAIN_OK} --out {{data}}/run", "--data"),
    case("output is input", f"train {TRAIN_OK} --out {{run}} --init {{run}}/best.safetensors", "--init"),
    case("output is input", f"evaluate {EVAL_OK} --out {{data}}/eval", "--data"),
    # a run folder belongs to one run: a finished or foreign one is refused without --resume or --overwrite
    case("existing", f"pretrain {TRAIN_OK} --out {{stage1_run}}", "finished `procap pretrain` run; pass --resume"),
    case("existing", f"vqgan {TRAIN_OK} --out {{stage1_run}}", "a `procap vqgan` run may not write into"),
    case(
        "existing",
        f"train {TRAIN_OK} --init {{stage1_run}}/stage1.safetensors --out {{stage1_run}}",
        "a `procap train` run may not write into",
    ),
    case("existing", f"train {TRAIN_OK} --out {{stage1_run}} --resume", "not a `procap train` run to continue"),
    case("existing", f"pretrain {TRAIN_OK} --out {{run}}", "the files of a procap run"),
    case(
        "output is input",
        f"train {TRAIN_OK} --init {{stage1_run}}/stage1.safetensors --out {{stage1_run}} --overwrite",
        "which this run reads",
    ),
    case("wrong type", f"pretrain {TRAIN_OK} --out {{stage1_run}} --resume --overwrite", "not both"),
    # an --out from a --config file gets the rules of the command line (relative to the file: data/run)
    case("output is input", "train --config {config_out_in_data}", "lies inside --data"),
    # what a file says about itself is checked where it is used: a stage-1 checkpoint cannot caption
    case("wrong type", f"caption --ckpt {{stage1_run}}/stage1.safetensors {PAIR}", "records stage 'stage1'"),
    case("wrong type", f"evaluate {EVAL_OK} --ckpt {{stage1_run}}/stage1.safetensors", "records stage 'stage1'"),
    case("wrong type", "profile --ckpt {stage1_run}/stage1.safetensors --out {out}", "records stage 'stage1'"),
    # predictions of one id of two are no score of the whole
    case("empty", "score --pred {pred} --refs {refs_two}", "covers 1 of the 2 ids of reference file {refs_two}"),
    case("output is input", f"imagine --ckpt {{ckpt}} {PAIR} --out {{bef}}", "BEFORE"),
    case("output is input", f"procedure {PROC_OK} --out {{some_dir}}/p.png", "--cache"),
    case("output is input", "convert --from authors {text_taming} --vocab {word2idx} --out {word2idx}", "--vocab"),
    disk_full("score --pred {pred} --refs {refs} --metrics bleu --out {out}/new/s.json", "{out}/new/s.json"),
    disk_full("vocab --dataset clevr-change --root {data} --out {out}/v.json", "{out}/v.json"),
    disk_full("synth --out {out}/d --scenes 2 --no-progress", "{out}/d"),
    disk_full(f"train {TRAIN_OK}", "{out}"),
    disk_full(f"evaluate {EVAL_OK}", "{out}"),
    disk_full(f"imagine --ckpt {{ckpt}} {PAIR} --out {{out}}/s.png", "{out}/s.png"),
    disk_full(f"caption --ckpt {{ckpt}} {PAIR} --out {{out}}/c.jsonl", "{out}/c.jsonl"),
]


# ---------------------------------------------------------------------------------------------- workspace
def _partial_cache(root: Path) -> None:
    import numpy as np

    from procap.procedure.cache import CacheWriter

    writer = CacheWriter(root)
    ramp = np.linspace(1.0, 0.0, 3, dtype=np.float32)
    writer.write("sc_videos", "999999.png", np.zeros((3, 3, 16, 16), np.uint8), ramp, ramp[::-1].copy())
    writer.close()


def _rewrite_metadata(src: Path, dst: Path, **changes: str) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as handle:
        metadata = dict(handle.metadata())
    save_file(load_file(str(src)), str(dst), metadata={**metadata, **changes})
    return dst


def _datasets(ws: Path) -> dict[str, Path]:
    """The synthetic benchmark and broken dataset roots."""
    from procap.data.synthetic import generate

    generate(ws / "data", 20, size=16, seed=3, progress=False)  # 10 / 5 / 5 scenes
    (ws / "empty_dir").mkdir()
    corrupt = ws / "corrupt_clevr"
    corrupt.mkdir()
    (corrupt / "splits.json").write_text('{"train": [0, 1', encoding="utf-8")
    spot = ws / "typed_spot" / "annotations"
    spot.mkdir(parents=True)
    (spot / "train.json").write_text(json.dumps([{"img_id": {"a": 1}, "sentences": ["x"]}]), encoding="utf-8")
    (ws / "typed_ier").mkdir()
    entry = {"img0": 7, "img1": "b.png", "sents": ["make it red"], "uid": "1"}
    (ws / "typed_ier" / "train.json").write_text(json.dumps([entry]), encoding="utf-8")
    dup_split = ws / "dup_split_clevr"  # a scene listed twice in a split: trained on and scored twice
    shutil.copytree(ws / "data", dup_split)
    splits = json.loads((dup_split / "splits.json").read_text(encoding="utf-8"))
    splits["train"].append(splits["train"][0])
    splits["test"].append(splits["test"][0])
    (dup_split / "splits.json").write_text(json.dumps(splits), encoding="utf-8")
    two_names = ws / "two_names_clevr"  # scene 1 under its full name and its short one: one caption list was lost
    shutil.copytree(ws / "data", two_names)
    captions = json.loads((two_names / "change_captions.json").read_text(encoding="utf-8"))
    captions["000001.png"] = ["the scene was described twice"]
    (two_names / "change_captions.json").write_text(json.dumps(captions), encoding="utf-8")
    two_types = ws / "two_types_clevr"  # a scene under two change types: the later one won
    shutil.copytree(ws / "data", two_types)
    mapping = json.loads((two_types / "type_mapping.json").read_text(encoding="utf-8"))
    kinds = [kind for kind, names in mapping.items() if names]
    mapping[kinds[1]].append(mapping[kinds[0]][0])
    (two_types / "type_mapping.json").write_text(json.dumps(mapping), encoding="utf-8")
    return {name: ws / name for name in ("data", "empty_dir", "corrupt_clevr", "typed_ier")} | {
        "typed_spot": ws / "typed_spot",
        "dup_split_clevr": dup_split,
        "two_names_clevr": two_names,
        "two_types_clevr": two_types,
    }


def _models(ws: Path, data: Path) -> dict[str, Path]:
    """A checkpoint, a VQGAN file and checkpoints with crafted metadata."""
    import torch
    from safetensors.torch import load_file, save_file

    from procap.data import load_split
    from procap.loading.checkpoint import save_checkpoint
    from procap.train.common import build_vocab
    from procap.train.vqgan_train import save_vqgan

    vocab = build_vocab(load_split("clevr-change", data, "train"), "clevr-change")
    model = micro_model(len(vocab))
    ckpt = save_checkpoint(ws / "model.safetensors", model, vocab)
    vqgan = save_vqgan(ws / "vqgan.safetensors", model.vqgan)
    config = json.loads(_metadata(ckpt)["config"])
    huge = _rewrite_metadata(ckpt, ws / "huge.safetensors", config=json.dumps({**config, "enc_dim": 1_000_000}))
    bad_vocab = _rewrite_metadata(ckpt, ws / "vocab.safetensors", vocab=json.dumps({"a": 0}))
    vq_config = json.loads(_metadata(vqgan)["vqgan_config"])
    huge_vqgan = _rewrite_metadata(
        vqgan, ws / "vqgan_huge.safetensors", vqgan_config=json.dumps({**vq_config, "ch": 10**7})
    )
    nan_ckpt = ws / "nan.safetensors"  # a diverged run's weights: captioned '' with exit 0 before the check
    save_file(
        {k: v.fill_(float("nan")) if v.is_floating_point() else v for k, v in load_file(ckpt).items()},
        nan_ckpt,
        metadata=_metadata(ckpt),
    )
    int_ckpt = ws / "int.safetensors"  # float weights stored as integers: cast silently, captions garbage
    save_file(
        {k: v.to(torch.int32) if v.is_floating_point() else v for k, v in load_file(ckpt).items()},
        int_ckpt,
        metadata=_metadata(ckpt),
    )
    float8_ckpt = ws / "float8.safetensors"  # PyTorch cannot test float8 for NaN: a NotImplementedError traceback
    save_file(
        {k: v.to(torch.float8_e4m3fn) if v.is_floating_point() else v for k, v in load_file(ckpt).items()},
        float8_ckpt,
        metadata=_metadata(ckpt),
    )
    # metadata naming a key twice: json.loads kept the last value
    dup_meta = _rewrite_metadata(ckpt, ws / "dup_meta.safetensors", extra='{"stage": "stage2", "stage": "stage1"}')
    return {"ckpt": ckpt, "vqgan": vqgan, "huge_ckpt": huge, "vocab_ckpt": bad_vocab, "huge_vqgan": huge_vqgan} | {
        "nan_ckpt": nan_ckpt,
        "int_ckpt": int_ckpt,
        "float8_ckpt": float8_ckpt,
        "dup_meta_ckpt": dup_meta,
    }


def _metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata())


def _files(ws: Path, data: Path) -> dict[str, Path]:
    """Small good and bad files."""
    paths = {
        "bef": data / "images" / "CLEVR_default_000000.png",
        "aft": data / "sc_images" / "CLEVR_semantic_000000.png",
    }
    texts = {
        "text_file": "this is not an image\n",
        "text_ckpt": "not a checkpoint\n",
        "empty": "",
        "corrupt_json": '{"a": ',
        "list_json": "[1, 2]",
        "file": "an ordinary file\n",
        "pred": json.dumps([{"image_id": "p1", "caption": "the cube moved"}]),
        "pred_null_caption": json.dumps([{"image_id": "p1", "caption": None}]),
        "refs": json.dumps({"p1": ["the cube moved"]}),
        "dup_key_pred": '{"p1": "the cube moved", "p1": "a sphere"}',  # json.load kept the last caption
        "dup_key_refs": '{"p1": ["the cube moved"], "p1": ["a sphere"]}',
        "blank_refs": json.dumps({"p1": ["", " "]}),
        "refs_two": json.dumps({"p1": ["the cube moved"], "p2": ["the sphere is gone"]}),  # scored against nothing
        "old_captions": "captions of an earlier run\n",  # kept unless --resume or --overwrite says otherwise
        "config_text_steps": json.dumps({"steps": "ten"}),  # reached the range checks as text: a traceback
        "config_list_lr": json.dumps({"lr": [1, 2]}),
        "config_number_data": json.dumps({"data": 5}),
        "config_yes_amp": json.dumps({"amp": "yes"}),
        "config_dup_steps": '{"steps": 1, "steps": 5}',  # the last value won silently
        "config_dup_yaml": "lr: 0.1\nlr: 0.001\n",
        "types_total": json.dumps({"p1": "total"}),  # counted twice in the total, whose score it replaced
        "other_refs": json.dumps({"q9": ["the cube moved"]}),
        "other_types": json.dumps({"q9": "color"}),  # types for other ids: p1 was in no group of the breakdown
        "word2idx": json.dumps(
            {
                w: i
                for i, w in enumerate(
                    ["[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "the", "cube"]
                )
            }
        ),
    }
    texts |= {"text_taming": "not a torch file\n", "empty_taming": ""}
    suffix = {"text_ckpt": ".safetensors", "text_file": ".png", "empty": ".safetensors", "config_dup_yaml": ".yaml"}
    suffix |= {"old_captions": ".jsonl"}
    suffix |= {"text_taming": ".ckpt", "empty_taming": ".ckpt"}
    for name, text in texts.items():
        paths[name] = ws / f"{name}{suffix.get(name, '.json' if text[:1] in '[{' else '.txt')}"
        paths[name].write_text(text, encoding="utf-8")
    paths["corrupt_png"] = ws / "corrupt.png"
    paths["corrupt_png"].write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    paths["big_png"] = ws / "big.png"
    Image.new("RGB", (40, 40)).save(paths["big_png"])
    paths["some_dir"] = ws / "some_dir"
    paths["some_dir"].mkdir()
    paths["torch_pickle"] = ws / "model.chkpt"  # what the authors release: a torch.save archive, not safetensors
    torch.save({"model": {"w": torch.zeros(1)}}, paths["torch_pickle"])
    paths["stride_zero_taming"] = ws / "stride_zero.chkpt"
    torch.save({"model": {"w": torch.zeros(1).expand(2**14, 2**14)}, "model_cfg": {}}, paths["stride_zero_taming"])
    paths["corrupt_cache"] = ws / "corrupt_cache"  # a procedure cache whose HDF5 file is text
    paths["corrupt_cache"].mkdir()
    (paths["corrupt_cache"] / "sc_videos.h5").write_text("not HDF5\n", encoding="utf-8")
    paths["partial_cache"] = ws / "partial_cache"  # a valid cache without the training pairs (e.g. another split)
    _partial_cache(paths["partial_cache"])
    return paths


def _stale_cache(ws: Path, data: Path, vqgan: Path) -> dict[str, Path]:
    """A procedure cache of two pairs, and its dataset with one of their images since redrawn under its name."""
    from procap.data import load_split

    changed = ws / "changed_data"
    shutil.copytree(data, changed)
    cache = ws / "stale_cache"
    argv = ["prepare", "--dataset", "clevr-change", "--root", str(changed), "--vqgan", str(vqgan)]
    assert main([*argv, "--out", str(cache), "--workers", "1", "--limit", "2", "--no-progress"]) == 0
    image = load_split("clevr-change", changed, "train")[0].before_path
    Image.new("RGB", Image.open(image).size, (200, 30, 30)).save(image)
    return {"changed_data": changed, "stale_cache": cache}


def _stage1_run(ws: Path, ckpt: Path) -> dict[str, Path]:
    """The folder of a finished `procap pretrain` run, as the run leaves it."""
    run = ws / "stage1_run"
    run.mkdir()
    for name in ("stage1.safetensors", "last.safetensors"):
        _rewrite_metadata(ckpt, run / name, extra=json.dumps({"stage": "stage1", "step": 1}))
    (run / "stage1_config.json").write_text(json.dumps({"stage": "pretrain", "preset": "tiny"}), encoding="utf-8")
    (run / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n", encoding="utf-8")
    (run / "run.json").write_text(json.dumps({"kind": "pretrain", "state": "finished"}), encoding="utf-8")
    return {"stage1_run": run}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, str]:
    ws = tmp_path_factory.mktemp("bad_inputs")
    places = _datasets(ws)
    places |= _models(ws, places["data"])
    places |= _files(ws, places["data"])
    places["missing"] = ws / "no_such_thing"
    places["unwritable"] = places["file"] / "sub" / "target"  # below a file: no folder can be made there
    places["root"] = ws
    places["refs_hard_link"] = ws / "refs_hard_link.json"
    places["refs_hard_link"].hardlink_to(places["refs"])
    places["refs_symlink"] = ws / "refs_symlink.json"
    places["refs_symlink"].symlink_to(places["refs"])
    places["clevr_like"] = ws / "clevr_like"  # a real CLEVR-Change root is no synthetic benchmark to replace
    (places["clevr_like"] / "images").mkdir(parents=True)
    places |= _stale_cache(ws, places["data"], places["vqgan"])
    places |= _stage1_run(ws, places["ckpt"])
    places["config_out_in_data"] = ws / "config_out_in_data.json"  # paths relative to the file's folder
    options = {"data": "data", "out": "data/run", "preset": "tiny", "steps": 1, "batch_size": 2}
    places["config_out_in_data"].write_text(json.dumps(options), encoding="utf-8")
    places["demo_at_none"] = ws / "demo_at_none"  # a demo folder whose benchmark has no view change
    (places["demo_at_none"] / "data").mkdir(parents=True)
    (places["demo_at_none"] / "data" / "scenes.json").write_text(json.dumps({"scenes": [], "viewpoint": "none"}))
    places["run"] = ws / "run"  # a finished run whose checkpoint a new run starts from
    places["run"].mkdir()
    (places["run"] / "best.safetensors").write_bytes(places["ckpt"].read_bytes())
    return {name: str(path) for name, path in places.items()}


@contextlib.contextmanager
def file_size_limit(limit: int | None):
    """Files may not grow beyond ``limit`` bytes while inside: writes fail with EFBIG, as on a full disk."""
    if limit is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for root in roots for p in root.rglob("*")}


# ---------------------------------------------------------------------------------------------- the table
DEFAULT_NOTE = re.compile(r"procap (vqgan|pretrain|train): no --(preset|vqgan) given: using ")


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_sentence_and_leaves_nothing(bad: Case, workspace, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # commands with default output folders write below the working directory
    for name, value in bad.env:
        monkeypatch.setenv(name, value)
    places = {**workspace, "out": str(tmp_path / "out")}
    argv = [part.format(**places) for part in bad.argv]
    before = _snapshot(Path(workspace["root"]), tmp_path)
    try:
        with file_size_limit(bad.file_size_limit):
            code = main(argv)
    except SystemExit as exit_info:  # argparse rejects its own way, through sys.exit
        code = exit_info.code
    err = capsys.readouterr().err
    # the defaults a training command fills in are said once its data has been read (docs/training.md); what the run
    # itself refuses later (a procedure cache, a full disk) follows them: they are notes, not part of the error
    lines = [line for line in err.splitlines() if line.strip() and not DEFAULT_NOTE.match(line)]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert bad.needle.format(**places) in lines[0], lines[0]
    assert lines[0].startswith("procap"), lines[0]
    assert _snapshot(Path(workspace["root"]), tmp_path) == before, "files were created, changed or removed"


def _options(command: str) -> tuple[set[str], set[str]]:
    """(every option of ``command``, its numeric options)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actions = sub.choices[command]._actions
    numeric = {opt for a in actions if a.type in (int, float) for opt in a.option_strings}
    return {opt for a in actions for opt in a.option_strings}, numeric


def test_every_command_is_in_the_table():
    """Each command has cases; one with --out covers unwritable and existing outputs; one reading files covers
    missing and directory inputs."""
    by_command: dict[str, set[str]] = {}
    for c in CASES:
        by_command.setdefault(c.command, set()).add(c.kind)
    assert set(by_command) == set(COMMANDS), "add the new command's bad inputs to CASES"
    for command, kinds in by_command.items():
        options, numeric = _options(command)
        assert kinds <= set(KINDS)
        if "--out" in options:
            assert {"unwritable", "existing"} <= kinds, command
        if options & {"--ckpt", "--data", "--root", "--pred", "--init"}:
            assert {"missing", "directory", "empty", "corrupt", "wrong type"} <= kinds, command
        if numeric:
            assert "out of range" in kinds, command


def test_the_table_holds_no_duplicate_cases():
    keys = [dataclasses.astuple(c) for c in CASES]
    assert len(keys) == len(set(keys))


def test_the_docs_table_lists_every_category():
    """docs/errors.md mirrors this table: one row per category."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in docs.splitlines() if line.startswith("| ")}
    assert set(KINDS) <= rows, set(KINDS) - rows
