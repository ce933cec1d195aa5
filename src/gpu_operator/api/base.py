"""The base model for CRD types and the markers the CRD schema generator understands."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator
from pydantic_core import PydanticCustomError


class K8sModel(BaseModel):
    """A CRD object or sub-object: upstream spellings, strict scalar types like the API server.

    Unknown fields are dropped here (the real API server prunes them too); `manifests` reports
    them as warnings before they are lost.
    """

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        """Serialise as the API server would store it: upstream spellings, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class IntOrStringMarker:
    """Schema marker: the field is `x-kubernetes-int-or-string`."""


@dataclass(frozen=True)
class PreserveUnknownMarker:
    """Schema marker: the field is a free-form object (`x-kubernetes-preserve-unknown-fields`)."""


@dataclass(frozen=True)
class QuantityMarker:
    """Schema marker: a resource quantity (`int-or-string` with the Kubernetes quantity pattern)."""


QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_QUANTITY = re.compile(QUANTITY_PATTERN)


def _int_or_string(value: object) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise PydanticCustomError(
            "int_or_string", "expected an integer or a string, got {got}", {"got": repr(value)}
        )
    return value


def _quantity(value: object) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise PydanticCustomError(
            "quantity", 'expected a quantity like 500m, 2 or "1Gi", got {got}', {"got": repr(value)}
        )
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise PydanticCustomError(
            "quantity", 'expected a quantity like 500m, 2 or "1Gi", got "{got}"', {"got": value}
        )
    return value


IntOrString = Annotated[int | str, IntOrStringMarker(), PlainValidator(_int_or_string)]
Quantity = Annotated[int | str, QuantityMarker(), PlainValidator(_quantity)]
FreeForm = Annotated[dict[str, Any], PreserveUnknownMarker()]
NonNegativeInt = Annotated[int, Field(ge=0)]
