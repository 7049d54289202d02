"""Building blocks of the typed configs (the run config of :mod:`agentrl.runner`, the SFT config of
:mod:`agentrl.sft`): a shared module below both, so neither imports the other's private parts.

- :class:`Section`: the base of every config section, a frozen pydantic model that refuses unknown keys.
- :class:`RunFields`: lets a section hold a runtime dataclass directly (``SamplingParams``,
  ``SchedulerConfig``...) instead of a copy of its fields. pydantic validates the dataclass from its
  own annotations (types and :mod:`agentrl._limits` markers); the dataclass's ``__post_init__``
  then checks what spans fields. Each field is defined once, in the dataclass.

A section that is a runtime dataclass::

    sampling: Annotated[SamplingParams, RUN_SAMPLING] = Field(default_factory=RUN_SAMPLING.default)

where ``RUN_SAMPLING = RunFields(SamplingParams, max_new_tokens=1024)`` gives the run's own default
for a field (the rest keep the dataclass's). ``keys`` (optional) names the fields a config file may
set, in the order they are written out; the others stay at their defaults and are left out of
``to_dict()`` and so of the run's hash (e.g. the ports of ``RouterConfig``, which the runner picks).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

__all__ = ["RunFields", "Section", "TemplateName"]

T = TypeVar("T")

TemplateName = Literal["qwen3", "qwen3_5", "qwen3_coder"]
"""The chat templates that ship with agentrl (:meth:`agentrl.chat.ChatTemplate.from_name`)."""


class Section(BaseModel):
    """Frozen after validation; an unknown key is an error that names it (``extra="forbid"``).

    Mapping fields (``options``, ``fields``...) are plain dicts: the section cannot be re-assigned,
    but do not mutate them in place (the run's hash is computed from their contents).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class RunFields(Generic[T]):
    """``Annotated`` metadata that validates the runtime dataclass ``cls`` as a config section (see the
    module doc): run defaults filled in, unknown keys refused as in a :class:`Section`, and an error of
    the dataclass's ``__post_init__`` that names one of its fields (``"Class.field=..."``) reported at
    that field's key."""

    def __init__(self, cls: type[T], *, keys: tuple[str, ...] | None = None, **defaults: Any) -> None:
        names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        unknown = sorted({*(keys or ()), *defaults} - set(names))
        if unknown:
            raise TypeError(f"RunFields({cls.__name__}): no field(s) {unknown}")
        self.cls, self.defaults = cls, defaults
        self.keys: tuple[str, ...] = keys if keys is not None else tuple(names)

    def default(self) -> T:
        """The dataclass with the run defaults (a ``default_factory``)."""
        return self.cls(**self.defaults)

    def field_types(self) -> dict[str, Any]:
        """The annotation of each key a config may set (what :mod:`agentrl.cli` types overrides by)."""
        import typing

        hints = typing.get_type_hints(self.cls, include_extras=True)
        return {name: hints[name] for name in self.keys}

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        inner = handler(source)
        return core_schema.no_info_wrap_validator_function(
            self._validate, inner,
            serialization=core_schema.wrap_serializer_function_ser_schema(self._serialize, schema=inner))

    def _serialize(self, value: Any, serialize: Callable[[Any], Any]) -> Any:
        data = serialize(value)
        return {k: data[k] for k in self.keys} if isinstance(data, Mapping) else data

    def _validate(self, value: Any, validate: Callable[[Any], T]) -> T:
        if not isinstance(value, Mapping):
            return validate(value)
        extra = [InitErrorDetails(type="extra_forbidden", loc=(str(k),), input=v)
                 for k, v in value.items() if k not in self.keys]
        if extra:
            raise ValidationError.from_exception_data(self.cls.__name__, extra)
        data = {**self.defaults, **value}
        try:
            return validate(data)
        except ValidationError as exc:
            raise self._at_fields(exc, data) from None

    def _at_fields(self, exc: ValidationError, data: Mapping[str, Any]) -> ValidationError:
        """``exc`` with each ``__post_init__`` error that names a field moved to that field's key."""
        prefix = re.compile(rf"^{re.escape(self.cls.__name__)}\.(\w+)\b")
        out: list[InitErrorDetails] = []
        for err in exc.errors():
            loc, text = tuple(err["loc"]), str(err.get("ctx", {}).get("error", ""))
            named = prefix.match(text) if err["type"] == "value_error" and not loc else None
            if named is not None and named.group(1) in self.keys:
                field = named.group(1)
                out.append(InitErrorDetails(type="value_error", loc=(field,), input=data.get(field),
                                            ctx={"error": text[len(self.cls.__name__) + 1:]}))
            elif err["type"] == "unexpected_keyword_argument":
                out.append(InitErrorDetails(type="extra_forbidden", loc=loc, input=err["input"]))
            else:
                out.append(_same(err))
        return ValidationError.from_exception_data(exc.title, out)


def _same(err: Any) -> InitErrorDetails:
    """The error ``err`` (one of ``ValidationError.errors()``) as it was: by its known type, with its context."""
    known = InitErrorDetails(type=err["type"], loc=tuple(err["loc"]), input=err["input"])
    if "ctx" in err:
        known["ctx"] = err["ctx"]
    try:
        ValidationError.from_exception_data("check", [known])
    except (KeyError, TypeError, ValueError):  # not a pydantic error type: keep its message
        return InitErrorDetails(type=PydanticCustomError(err["type"], err["msg"]), loc=tuple(err["loc"]),
                                input=err["input"])
    return known
