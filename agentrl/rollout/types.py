"""Typed request and result objects of the inference client (SGLang native ``/generate``).

:class:`SamplingParams` is immutable and passed explicitly with every request; it serialises only
fields SGLang 0.5.23 accepts inside ``sampling_params`` (an unknown key there is an HTTP 400), and
defaults to the settings RL needs so that ``text`` and the token ids agree (``no_stop_trim``,
``skip_special_tokens=False``, ``spaces_between_special_tokens=False``).

:class:`GenerateResult` carries the engine's answer exactly as returned: output ids and their
per-token logprobs (the EOS token included when the engine emits it), the typed finish reason, the
weight version that produced the tokens and the prompt/cached token counts. All objects here are
frozen and picklable.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le

from agentrl._enum import NamedEnum
from agentrl._limits import check_limits

__all__ = [
    "AbortCause",
    "FinishKind",
    "FinishReason",
    "GenerateResult",
    "InferenceError",
    "PromptTooLongError",
    "ProtocolError",
    "RequestRejectedError",
    "RoutingShape",
    "SamplingParams",
    "continuation_budget",
]


class InferenceError(Exception):
    """Base class of the client's errors."""


class RequestRejectedError(InferenceError):
    """The engine or router answered 4xx: a deterministic client error, never retried."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{url} rejected the request with HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.url = url

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.message, self.url))


class PromptTooLongError(RequestRejectedError):
    """HTTP 400 because prompt (+ budget) exceeds the context: mark the episode truncated."""


class ProtocolError(InferenceError):
    """The engine's answer does not have the shape the client relies on (never guessed around)."""


class FinishKind(NamedEnum):
    """Why generation stopped. ``ABORT`` is resumable: it is not a completed turn."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class AbortCause(NamedEnum):
    """Who ended an ``ABORT`` turn. Only ``ENGINE`` and ``CLIENT`` aborts are deliberate (resumable);
    ``UNAVAILABLE`` and ``DEADLINE`` are engine failures the agent loop records as such."""

    ENGINE = "engine"  # the engine aborted it (abort_request, pause_generation, a weight update)
    CLIENT = "client"  # this client's abort() / abort_all()
    UNAVAILABLE = "unavailable"  # transport errors, 429 or 5xx on every attempt: no answer at all
    DEADLINE = "deadline"  # the request's deadline ran out

    @property
    def failure(self) -> bool:
        """True when the abort means the engine failed rather than someone asking for it."""
        return self in (AbortCause.UNAVAILABLE, AbortCause.DEADLINE)


@dataclass(frozen=True)
class FinishReason:
    """``kind`` plus what matched (a stop token id, a stop string or a list of ids) for ``STOP``,
    and the engine's or client's message for ``ABORT`` (``status_code`` when one was given).

    ``cause`` says who ended an ``ABORT`` (:class:`AbortCause`); an abort the engine reports is
    ``ENGINE`` unless the client knows better (it asked for it, or it gave up on the engine)."""

    kind: FinishKind
    matched: int | str | tuple[int, ...] | None = None
    message: str | None = None
    status_code: int | None = None
    cause: AbortCause | None = None

    def __post_init__(self) -> None:
        if self.kind is FinishKind.ABORT and self.cause is None:
            object.__setattr__(self, "cause", AbortCause.ENGINE)
        elif self.kind is not FinishKind.ABORT and self.cause is not None:
            raise ValueError(f"FinishReason.cause={self.cause!r}: only an 'abort' finish has a cause, got kind "
                             f"{self.kind.value!r}")

    @classmethod
    def from_meta(cls, raw: Any) -> FinishReason:
        """Parses ``meta_info.finish_reason``; an unknown type is a :class:`ProtocolError`."""
        if not isinstance(raw, dict) or "type" not in raw:
            raise ProtocolError(f"meta_info.finish_reason: expected an object with 'type', got {raw!r}")
        try:
            kind = FinishKind(raw["type"])
        except ValueError:
            raise ProtocolError(
                f"meta_info.finish_reason.type: got {raw['type']!r}, expected one of "
                f"{[k.value for k in FinishKind]}"
            ) from None
        matched = raw.get("matched")
        if isinstance(matched, list):
            matched = tuple(int(m) for m in matched)
        status = raw.get("status_code")
        return cls(kind=kind, matched=matched, message=raw.get("message"),
                   status_code=int(status) if isinstance(status, int) else None)


def _check_grammar(params: SamplingParams) -> None:
    """Constrained decoding: at most one of regex / json_schema / ebnf, each non-empty text; a
    json_schema given as a mapping is stored as its JSON text (what SGLang expects)."""
    for name in ("regex", "ebnf"):
        value = getattr(params, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"SamplingParams.{name}={value!r}: expected None or a non-empty string")
    schema = params.json_schema
    if schema is not None:
        if isinstance(schema, Mapping):
            try:
                schema = json.dumps(dict(schema), ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"SamplingParams.json_schema: expected a JSON-serialisable schema ({exc})") from None
        try:
            decoded = json.loads(schema) if isinstance(schema, str) else None
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise ValueError(f"SamplingParams.json_schema={params.json_schema!r:.120}: expected a JSON schema "
                             "object (a dict or its JSON text)")
        object.__setattr__(params, "json_schema", schema)
    given = [n for n in ("regex", "json_schema", "ebnf") if getattr(params, n) is not None]
    if len(given) > 1:
        raise ValueError(f"SamplingParams: {' and '.join(given)} are all set; expected at most one of regex, "
                         "json_schema and ebnf (SGLang constrains a request by one grammar)")


def _check_logit_bias(params: SamplingParams) -> None:
    bias = params.logit_bias
    if bias is None:
        return
    if not isinstance(bias, Mapping):
        raise ValueError(f"SamplingParams.logit_bias={bias!r:.120}: expected a mapping of token id to bias")
    clean: dict[int, float] = {}
    for key, value in bias.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise ValueError(f"SamplingParams.logit_bias: key {key!r}: expected a token id (int >= 0)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"SamplingParams.logit_bias[{key}]={value!r}: expected a finite number")
        clean[key] = float(value)
    object.__setattr__(params, "logit_bias", clean)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; every field maps to one SGLang ``sampling_params`` key.

    ``None`` leaves the engine default. Use :meth:`replace` (or ``dataclasses.replace``) to derive a
    variant, e.g. the remaining budget of a resumed turn.

    Constrained decoding and biasing pass straight through to SGLang: ``regex``, ``json_schema``
    (a dict or its JSON text; stored as text) or ``ebnf`` — at most one — and ``logit_bias``
    (token id → additive bias; the engine checks ids against its vocabulary). Note that the
    logprobs the engine returns are those of the constrained distribution.
    """

    max_new_tokens: Annotated[int, Ge(0)] = 128
    temperature: Annotated[float, Ge(0.0), Le(1e6)] = 1.0
    top_p: Annotated[float, Gt(0.0), Le(1.0)] = 1.0
    top_k: int | None = None
    min_p: Annotated[float, Ge(0.0), Le(1.0)] | None = None
    min_new_tokens: Annotated[int, Ge(0)] | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    sampling_seed: int | None = None
    skip_special_tokens: bool = False
    no_stop_trim: bool = True
    spaces_between_special_tokens: bool = False
    regex: str | None = None
    json_schema: str | Mapping[str, Any] | None = None
    ebnf: str | None = None
    logit_bias: Mapping[int, float] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        check_limits(self)
        if self.top_k is not None and (self.top_k < 1 and self.top_k != -1):
            raise ValueError(f"SamplingParams.top_k={self.top_k!r}: expected -1 (off) or an int >= 1")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"SamplingParams.stop={self.stop!r}: expected a tuple of strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids={self.stop_token_ids!r}: expected a tuple of ids >= 0")
        # Lists are accepted for convenience but stored as tuples so the object stays immutable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check_grammar(self)
        _check_logit_bias(self)

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_payload(self) -> dict[str, Any]:
        """The ``sampling_params`` JSON object: only SGLang keys, ``None`` and empty stops left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (isinstance(value, tuple) and not value):
                continue
            if f.name == "logit_bias":
                out[f.name] = {str(k): v for k, v in value.items()}  # SGLang's JSON keys are strings
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class GenerateResult:
    """One ``/generate`` answer, exactly as the engine returned it.

    ``output_ids[i]`` was sampled with log-probability ``output_logprobs[i]``; both have
    ``completion_tokens`` entries (for an aborted request: the tokens produced before the abort).
    ``input_logprobs`` is filled when the request asked for prompt scoring (``logprob_start_len``);
    its first entry is ``None`` as SGLang returns it. ``weight_version_spans`` lists
    ``(version, start, end)`` output-token ranges when the engine reports them: more than one span
    means the weights changed while this request was generating.
    """

    rid: str
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    text: str = ""
    input_logprobs: tuple[float | None, ...] = ()
    input_ids_scored: tuple[int, ...] = ()
    top_logprobs: tuple[tuple[tuple[float, int], ...], ...] = ()
    weight_version_spans: tuple[tuple[str, int, int], ...] = ()
    e2e_latency_s: float | None = None
    attempts: int = 1
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    routed_experts: Any = field(default=None, compare=False, repr=False)
    routed_experts_start: int = 0

    @property
    def aborted(self) -> bool:
        return self.finish_reason.kind is FinishKind.ABORT

    def first_misscored(self, sent: Sequence[int]) -> int | None:
        """The first index where the ids the engine says it scored (``input_ids_scored``) are not
        ``sent`` (the request's ids from ``logprob_start_len`` on), or ``None`` when they agree or the
        engine named none. SGLang reports every id ``>= vocab_size - 1`` as ``0`` there (it clips
        image-token hashes so that they detokenize), and a model may sample its last, often unused,
        vocabulary row: a reported ``0`` therefore matches any id; a shift or another sequence does not."""
        scored = self.input_ids_scored
        if not scored:
            return None
        if len(scored) != len(sent):
            return min(len(scored), len(sent))
        for i, (got, want) in enumerate(zip(scored, sent, strict=True)):
            if got != want and got != 0:
                return i
        return None


@dataclass(frozen=True)
class RoutingShape:
    """What a mixture-of-experts engine returns per position when asked for its routing: for each of
    ``layers`` decoder layers the ``top_k`` experts (ids below ``experts``) the position went to.

    Stored in a trajectory's ``routed_experts`` channel as ``dtype`` (one byte per expert id up to 256
    experts, two beyond): ``layers × top_k × itemsize`` bytes per token."""

    layers: int
    top_k: int
    experts: int

    def __post_init__(self) -> None:
        for name in ("layers", "top_k", "experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RoutingShape.{name}={value!r}: expected an int >= 1")
        if self.top_k > self.experts:
            raise ValueError(f"RoutingShape.top_k={self.top_k}: expected at most experts={self.experts}")
        if self.experts > 65536:
            raise ValueError(f"RoutingShape.experts={self.experts}: expected at most 65536 (uint16 ids)")

    @property
    def dtype(self) -> str:
        return "uint8" if self.experts <= 256 else "uint16"

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.top_k * (1 if self.dtype == "uint8" else 2)

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any]) -> RoutingShape | None:
        """The routing of a Hugging Face ``config.json`` (its ``text_config`` for a multimodal
        model): ``num_hidden_layers`` × ``num_experts_per_tok`` of ``num_experts``; None for a dense
        model."""
        text = config.get("text_config")
        if isinstance(text, Mapping) and not config.get("num_experts"):
            config = text
        experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
        if not experts:
            return None
        return cls(layers=int(config["num_hidden_layers"]), top_k=int(config["num_experts_per_tok"]),
                   experts=int(experts))


def continuation_budget(max_new_tokens: int, generated: int, prompt_tokens: int, context_length: int) -> int:
    """How many tokens a resumed turn may still ask for.

    ``max_new_tokens`` is the turn's total budget, ``generated`` what earlier (aborted) requests of the
    same turn already produced, ``prompt_tokens`` the length of the prompt the next request sends
    (original prompt + tokens generated so far) and ``context_length`` the engine's limit. The answer
    is ``min(max_new_tokens - generated, context_length - prompt_tokens)`` clamped at 0; 0 means the
    turn is truncated and no request must be sent.
    """
    for name, value in (("max_new_tokens", max_new_tokens), ("generated", generated),
                        ("prompt_tokens", prompt_tokens), ("context_length", context_length)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"continuation_budget: {name}={value!r}, expected an int >= 0")
    return max(0, min(max_new_tokens - generated, context_length - prompt_tokens))
