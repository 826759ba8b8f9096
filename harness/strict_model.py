"""What every configuration model stands on: the strict base model and the field types.

Scenario settings (``harness.scenario.schema``) and algorithm parameters
(``harness.algorithms.params``) are both :class:`StrictModel` with these field types, so a
scenario file and an algorithm's parameters refuse the same things in the same words
(:class:`harness.errors.ParamError`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.errors import ParamError

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]


class StrictModel(BaseModel):
    """Base of every configuration model: frozen, strict types, no NaN or infinity, unknown keys
    refused by name.

    ``input_only_keys`` lists keys a before-validator consumes (e.g. ``latency_ms``).

    A field's documentation is the docstring right after it: ``harness.field_docs`` makes it the
    field's ``description`` when the scenario file's JSON Schema (``harness.scenario.json_schema``)
    or reference page (``harness.scenario.reference``) is made, not at every import.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    input_only_keys: ClassVar[tuple[str, ...]] = ()
    listed_last: ClassVar[tuple[str, ...]] = ()  # fields the unknown-key message names after the others

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        # extra="forbid" alone says "Extra inputs are not permitted"; say which keys would do.
        if isinstance(data, dict):
            fields = sorted(cls.model_fields.items(), key=lambda item: item[0] in cls.listed_last)
            valid = [f.alias or name for name, f in fields] + list(cls.input_only_keys)
            for key in data:
                if key not in valid:
                    raise ParamError(
                        (key,) if isinstance(key, (str, int)) else (repr(key),),
                        f"unknown key (valid: {', '.join(valid)})",
                        key,
                    ).to_pydantic()
        return data
