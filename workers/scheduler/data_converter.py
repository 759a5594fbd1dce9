"""The data converter every timeshare process talks to Temporal with: the
SDK's pydantic converter (temporalio.contrib.pydantic), byte for byte, made
once per process instead of once per serialization context.

The SDK clones its data converter for each serialization context: twice per
workflow activation (temporalio.worker._workflow, `_CommandAwareDataConverter
.create` before decoding and again before encoding) and once per activity a
workflow schedules (`_payload_converter_with_context`). Each clone calls
`payload_converter_class()`, and PydanticPayloadConverter builds a composite
of seven converters, a pydantic SchemaSerializer and an empty cache of
TypeAdapters each time: so every activity's result also built its
TypeAdapter afresh. Live in the scheduler under `python -m bench scale --quick
--period 5` those clones took 60-75 µs each and, with the context checks
below, about 5 % of its CPU (docs/benchmarks.md, "Scale"). Here every clone is an
empty shell over one shared PydanticPayloadConverter, whose TypeAdapters are
cached for the process, and a context leaves the converter as it is.

Nothing about the payloads changes: the same converters write and read the
same bytes, so histories written with the SDK's `pydantic_data_converter`
replay with this one and the other way round (tests/integration/test_replay.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Self

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter, PayloadConverter, SerializationContext


class SharedPydanticPayloadConverter(PayloadConverter):
    """Free to make: every instance hands its work to one
    PydanticPayloadConverter per process. It takes no serialization context
    (nor does the SDK's pydantic converter), so the SDK keeps each clone's
    converter as it is."""

    shared: ClassVar[PydanticPayloadConverter] = PydanticPayloadConverter()

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        return self.shared.to_payloads(values)

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        return self.shared.from_payloads(payloads, type_hints)


class ContextFreeDataConverter(DataConverter):
    """A data converter none of whose parts takes a serialization context
    (the shared converter above, the SDK's default failure converter, no
    codec, no external storage): every context gives back the converter
    itself. The SDK's own ``with_context`` comes to the same after checking
    each part against an abstract class, which it asks for while it
    decodes activations and encodes completions (about four times per
    activation, 11 µs each, live). tests/unit/test_data_converter.py checks that
    it still comes to the same."""

    def with_context(self, context: SerializationContext) -> Self:
        if self.payload_codec is None and self.external_storage is None:
            return self
        return super().with_context(context)


DATA_CONVERTER = ContextFreeDataConverter(payload_converter_class=SharedPydanticPayloadConverter)
