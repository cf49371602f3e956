"""Reading a run folder's record files from the benches, which only read: one pydantic record a
line, as the stages write them (`ArtifactStore.read_records` is the store's own, checked against
the stage's manifest)."""

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Record = TypeVar("Record", bound=BaseModel)


def read_records(path: Path, kind: type[Record]) -> list[Record]:
    """Every non-blank line of `path` as a `kind`; a line that is not one names its file and line."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(kind.model_validate_json(line))
        except ValidationError as error:
            raise ValueError(
                f"{path}, line {number}: not a {kind.__name__} record "
                f"({error.error_count()} errors; first: {error.errors()[0]['msg']})"
            ) from None
    return records
