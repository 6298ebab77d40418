"""Decoding strategies: how a caption decoder's tokens are chosen, one object per rule, named in one registry.

A strategy holds its settings (its *options*, the dataclass fields) and gives two forms of the same rule over any
:class:`~procap.model.decoder.CachedDecoder`:

- :meth:`~DecodingStrategy.oracle`: eager, the whole prefix through the decoder every step (``ProCap.generate``);
- :meth:`~DecodingStrategy.cached`: the decoder's static KV caches (``procap.fast.Captioner`` off its graphs).

``captured_step`` says whether the cached form is the decoder's own fixed-shape greedy step, which
``procap.fast`` pads to buckets and captures in CUDA graphs (greedy decoding); any other strategy runs its cached
form eagerly there.

:data:`STRATEGIES` names every rule. ``ProCap.generate``, the Captioner and the commands take a strategy by name
with its options (``strategy="sample", strategy_options={"top_p": 0.9}``; ``--strategy sample --top-p 0.9``), or a
strategy object, and :func:`resolve_strategy` checks them once; ``num_beams`` / ``--beams`` stay the short form of
beam search. Each option declares its flag, help and range where it is defined (:func:`option`), so the command
line's flags and the checks come from the same lines: a new rule is a class here and a line in :data:`STRATEGIES`.

This module imports no torch: the command line builds its parsers from the registry, and ``procap --help`` stays
torch-free (``tests/test_cli_startup.py``); the loops the strategies run are imported where they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from procap.core import validate
from procap.core.config import MAX_BEAMS
from procap.core.errors import ProCapError, shown

if TYPE_CHECKING:  # annotations only: no torch at run time (module docstring)
    import torch

    from procap.model.decoder import CachedDecoder


class DecodingStrategy(Protocol):
    """The interface every strategy offers (both forms return (B, max_len - 1) int64 tokens after BOS)."""

    name: ClassVar[str]
    captured_step: ClassVar[bool]

    def oracle(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor: ...

    def cached(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor: ...

    def options(self) -> dict[str, Any]: ...


def option(default: Any, flag: str, help: str, kind: type, **bounds: float) -> Any:
    """A strategy's option: a dataclass field carrying its command-line ``flag``, ``help``, ``kind`` (int or float)
    and the ``bounds`` of :func:`procap.core.validate.number` (``minimum``, ``maximum``, ``above``)."""
    return dataclasses.field(default=default, metadata={"flag": flag, "help": help, "kind": kind, "bounds": bounds})


def check_option(field: dataclasses.Field[Any], value: Any, spelled: str) -> int | float:
    """``value`` of the option ``field`` when it is of its kind and within its bounds (a float option takes an int
    and gives a float), else one sentence naming ``spelled`` (the argument or flag as the caller wrote it)."""
    kind, bounds = field.metadata["kind"], field.metadata["bounds"]
    if kind is int:
        return validate.integer(value, spelled, **bounds)
    if value is None:  # validate.number lets None (a flag not given) pass
        raise ProCapError(f"{spelled} must be a number, got None.")
    validate.number(value, spelled, **bounds)
    return float(value)


class StrategyOptions:
    """What every strategy shares: its options checked on construction, and read back by name."""

    # Every subclass is a dataclass (which sets this); declared so that ``dataclasses.fields(self)`` type-checks.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            # frozen dataclasses: the checked value (an int given for a float option becomes a float) set in place
            object.__setattr__(self, field.name, check_option(field, getattr(self, field.name), field.name))

    def options(self) -> dict[str, Any]:
        """The options by name (what caption files and ``metrics.json`` record beside :attr:`name`)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


@dataclass(frozen=True)
class Greedy(StrategyOptions):
    """The decoder's greedy rule (its ``greedy_oracle``; the cached loop is its ``decode_step``)."""

    name: ClassVar[str] = "greedy"
    captured_step: ClassVar[bool] = True

    def oracle(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return decoder.greedy_oracle(memory, max_len)

    def cached(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return decoder.generate_cached(memory, max_len)


@dataclass(frozen=True)
class BeamSearch(StrategyOptions):
    """Beam search (:mod:`procap.model.beam`): ``num_beams`` hypotheses a pair, finished captions ranked by
    log-probability / length ** ``length_penalty``."""

    num_beams: int = option(
        3,
        "--beams",
        f"beam search with N beams, 1 to {MAX_BEAMS} (default 1: greedy)",
        int,
        minimum=1,
        maximum=MAX_BEAMS,
    )
    length_penalty: float = option(
        1.0, "--length-penalty", "beam search ranks captions by log-probability / length ** this (default 1.0)", float
    )
    name: ClassVar[str] = "beam"
    captured_step: ClassVar[bool] = False

    def oracle(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        from procap.model.beam import beam_search  # here: this module stays torch-free (see the module docstring)

        return beam_search(decoder, memory, max_len, self.num_beams, self.length_penalty)

    def cached(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        from procap.model.beam import beam_search_cached

        return beam_search_cached(decoder, memory, max_len, self.num_beams, self.length_penalty)


@dataclass(frozen=True)
class Sampling(StrategyOptions):
    """Sampling (:mod:`procap.model.sampling`): each token drawn from the softmax of the logits / ``temperature``,
    kept to the ``top_k`` most likely tokens (0: all) and to the smallest set holding ``top_p`` of the probability,
    with a generator seeded by ``seed`` on the memory's device: the same seed gives the same captions."""

    temperature: float = option(
        1.0, "--temperature", "sampling: divide the logits by this (> 0; default 1.0)", float, above=0
    )
    top_k: int = option(
        0, "--top-k", "sampling: draw from the K most likely tokens only (default 0: all)", int, minimum=0
    )
    top_p: float = option(
        1.0,
        "--top-p",
        "sampling: draw from the fewest most likely tokens holding this much probability, in (0, 1] (default 1.0)",
        float,
        above=0,
        maximum=1,
    )
    seed: int = option(
        0, "--seed", "sampling: the random generator's seed (default 0)", int, minimum=0, maximum=validate.MAX_SEED
    )
    name: ClassVar[str] = "sample"
    captured_step: ClassVar[bool] = False

    def oracle(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        from procap.model.sampling import sample_decode  # here: this module stays torch-free

        return sample_decode(decoder, memory, max_len, **self.options())

    def cached(self, decoder: CachedDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        from procap.model.sampling import sample_decode_cached

        return sample_decode_cached(decoder, memory, max_len, **self.options())


STRATEGY_CLASSES = (Greedy, BeamSearch, Sampling)
STRATEGIES: dict[str, type[Greedy | BeamSearch | Sampling]] = {strategy.name: strategy for strategy in STRATEGY_CLASSES}
# The short form of beam search (``num_beams`` / ``--beams``): these options without a strategy name mean beams.
SHORT_FORM = BeamSearch


def option_fields(strategy: type[StrategyOptions]) -> dict[str, dataclasses.Field[Any]]:
    """A registered strategy's options by name."""
    return {field.name: field for field in dataclasses.fields(strategy)}


def resolve_strategy(
    strategy: str | DecodingStrategy | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    spelled: Mapping[str, str] | None = None,
) -> DecodingStrategy:
    """The strategy the arguments of ``ProCap.generate``, the Captioner or a command ask for, checked once.

    Args:
        strategy: a name of :data:`STRATEGIES` (``"greedy"``, ``"beam"``, ``"sample"``), a strategy object, or
            None: greedy, or with ``num_beams`` > 1 beam search (the short form).
        options: the named strategy's options (``{"top_p": 0.9, "seed": 1}``); unset ones take their defaults.
        num_beams, length_penalty: beam search's options given on their own (the short form), or beside
            ``strategy="beam"``.
        spelled: how messages name each argument (``{"num_beams": "--beams", ...}`` on the command line).

    Raises:
        ProCapError: an unknown name, an option the strategy does not take, or a value outside its range, in one
            sentence naming the argument.
    """
    say = {"strategy": "strategy", "options": "strategy_options", **(spelled or {})}

    def named(name: str) -> str:
        return say.get(name, name)

    short = {
        name: value
        for name, value in (("num_beams", num_beams), ("length_penalty", length_penalty))
        if value is not None
    }
    given = dict(options or {})
    if isinstance(strategy, STRATEGY_CLASSES):
        _refuse_options_beside(strategy, [named(name) for name in (*given, *short)], named)
        return strategy
    if strategy is None:
        return _short_form(given, short, named)
    return _named_strategy(strategy, given, short, named)


def _refuse_options_beside(strategy: DecodingStrategy, given: list[str], named: Callable[[str], str]) -> None:
    """A strategy object holds its options: refuse the options ``given`` (as spelled) beside it."""
    if given:
        raise ProCapError(
            f"{named('strategy')} is a {type(strategy).__name__} object, which holds its options; "
            f"leave out {', '.join(given)}."
        )


def _short_form(
    options: dict[str, Any], short: dict[str, int | float], named: Callable[[str], str]
) -> DecodingStrategy:
    """No strategy named: options of a named strategy are refused; ``num_beams`` / ``length_penalty`` alone mean
    beam search, greedy for one beam (what beam search with one beam decodes, without the beams' bookkeeping)."""
    for name in options:
        owners = [key for key, cls in STRATEGIES.items() if name in option_fields(cls)]
        if not owners:
            raise ProCapError(f"{named(name)} is no option of any decoding strategy ({', '.join(STRATEGIES)}).")
        raise ProCapError(f"{named(name)} applies to {named('strategy')} {' / '.join(owners)} only; name it.")
    fields = option_fields(SHORT_FORM)
    # Any: each value was checked against its own field's kind, which one dict type cannot say per key.
    checked: dict[str, Any] = {name: check_option(fields[name], value, named(name)) for name, value in short.items()}
    return Greedy() if checked.get("num_beams", 1) == 1 else SHORT_FORM(**checked)


def _named_strategy(
    strategy: object, options: dict[str, Any], short: dict[str, int | float], named: Callable[[str], str]
) -> DecodingStrategy:
    """The strategy of :data:`STRATEGIES` called ``strategy``, with ``options`` and the short form's options given
    beside it, each once and each one it takes."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ProCapError(
            f"{named('strategy')} must be one of {', '.join(STRATEGIES)} or a decoding strategy, got {shown(strategy)}."
        )
    cls = STRATEGIES[strategy]
    for name, value in short.items():
        if name in options:
            raise ProCapError(f"{named(name)} is given twice, on its own and in {named('options')}; give it once.")
        options[name] = value
    fields = option_fields(cls)
    for name in options:
        if name not in fields:
            takes = f"its options: {', '.join(named(field) for field in fields)}" if fields else "it has none"
            raise ProCapError(f"{named('strategy')} {strategy} takes no {named(name)} ({takes}).")
    # Any: as in _short_form, each value is of its own field's kind.
    checked: dict[str, Any] = {name: check_option(fields[name], value, named(name)) for name, value in options.items()}
    return cls(**checked)


def decoding_strategy(num_beams: int = 1, length_penalty: float = 1.0) -> DecodingStrategy:
    """The strategy the ``num_beams`` / ``length_penalty`` arguments ask for: greedy for one beam, beam search for more
    (:func:`resolve_strategy`'s short form).

    Raises:
        ProCapError: a beam count outside 1..MAX_BEAMS or a non-finite length penalty, in one sentence.
    """
    return resolve_strategy(num_beams=num_beams, length_penalty=length_penalty)


def strategy_record(strategy: DecodingStrategy) -> dict[str, Any]:
    """``{"strategy": name, **options}``: what decoded a file's captions, as ``metrics.json`` records it."""
    return {"strategy": strategy.name, **strategy.options()}
