"""`procap info PRESET`: print a preset's configuration and parameter counts."""

from __future__ import annotations

import argparse
import json

from procap.core.config import PRESETS, get_preset
from procap.core.errors import ProCapError

HELP = "Show a model preset's configuration and parameter counts."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help=f"one of: {', '.join(sorted(PRESETS))}")
    parser.add_argument("--json", action="store_true", help="print the configuration as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        config = get_preset(args.preset)
    except KeyError as exc:
        raise ProCapError(exc.args[0]) from None
    from procap.core.weights import meta_build
    from procap.model.procap import ProCap, count_parameters

    with meta_build():  # shapes only: the counts need no weights, their initialisation nor torch._dynamo
        model = ProCap(config)
    counts = count_parameters(model)
    if args.json:
        print(json.dumps({"config": config.to_dict(), "parameters": counts}, indent=2))
        return 0
    print(
        f"preset {config.name}: k={config.num_keyframes}, l={config.num_generated_frames}, "
        f"encoder {config.enc_layers}x{config.enc_dim}, decoder {config.dec_layers}x{config.dec_dim}, "
        f"{config.tokens_per_frame} tokens/frame"
        + (f" ({merge}x{merge} latent cells each)" if (merge := config.departures.token_merge) > 1 else "")
        + f", {config.memory_tokens} memory tokens"
    )
    for part, n in counts.items():
        print(f"  {part:<12} {n / 1e6:10.2f} M")
    return 0
