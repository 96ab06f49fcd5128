"""The Milvus collection of one version's family: row, augmented vector, the row's metadata.

The gallery row is the primary key; the row's metadata.sqlite record is stored beside it as
scalar fields (item_id, text, uri as VARCHAR; extra as JSON), so a Milvus cluster can filter
and return what an item is without the version dir. The service still reads metadata from the
version dir: it is the one copy that always matches the memory-mapped arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

ROW_FIELD, VECTOR_FIELD = "row", "vector"
ID_FIELD, TEXT_FIELD, URI_FIELD, EXTRA_FIELD = "item_id", "text", "uri", "extra"
METADATA_FIELDS = (ID_FIELD, TEXT_FIELD, URI_FIELD, EXTRA_FIELD)
VARCHAR_MAX_BYTES = 65535  # Milvus's largest VARCHAR


class MetadataTooLongError(ValueError):
    """A metadata string is longer than a Milvus VARCHAR field holds."""


def create_collection(
    client: Any, name: str, dim: int, index_type: str, metric: str, build: dict[str, Any]
) -> None:
    """(Re)create collection `name` with the schema above and its vector index."""
    from pymilvus import DataType

    if client.has_collection(name):  # a failed earlier attempt of the same version
        client.drop_collection(name)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(ROW_FIELD, DataType.INT64, is_primary=True)
    schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field(ID_FIELD, DataType.VARCHAR, max_length=VARCHAR_MAX_BYTES)
    schema.add_field(TEXT_FIELD, DataType.VARCHAR, max_length=VARCHAR_MAX_BYTES, nullable=True)
    schema.add_field(URI_FIELD, DataType.VARCHAR, max_length=VARCHAR_MAX_BYTES, nullable=True)
    schema.add_field(EXTRA_FIELD, DataType.JSON)
    index_params = client.prepare_index_params()
    index_params.add_index(VECTOR_FIELD, index_type=index_type, metric_type=metric, params=build)
    client.create_collection(name, schema=schema, index_params=index_params)


def entities(
    rows: np.ndarray, vectors: np.ndarray, records: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Insertable entities from rows (n,), their vectors (n, D') and metadata records
    ({"id", "text"?, "uri"?, "extra"} as indexer.store.MetadataReader returns them)."""
    out = []
    for row, vector, record in zip(rows, vectors, records, strict=True):
        entity = {
            ROW_FIELD: int(row),
            VECTOR_FIELD: vector,
            ID_FIELD: record["id"],
            TEXT_FIELD: record.get("text"),
            URI_FIELD: record.get("uri"),
            EXTRA_FIELD: record.get("extra") or {},
        }
        for field in (ID_FIELD, TEXT_FIELD, URI_FIELD):
            value = entity[field]
            if value is not None and len(value.encode()) > VARCHAR_MAX_BYTES:
                raise MetadataTooLongError(
                    f"row {int(row)}: its {field} is {len(value.encode())} bytes, over the"
                    f" {VARCHAR_MAX_BYTES} a Milvus VARCHAR holds; shorten it in the gallery"
                )
        out.append(entity)
    return out
