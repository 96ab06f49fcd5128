"""The record naming a gallery's active version, and how it is written to its two stores.

Both stores (the pointer file <root>/<modality>/ACTIVE and the Redis key) hold the same JSON
record: the version and a generation number that each activation raises by one. A reader
takes the record with the higher generation, so a store that comes back from a pause, a
snapshot or a lagging replica with an older record never wins, and writers only ever replace
a record by one of a higher generation (ActiveRegistry repairs the lower store this way).
A store written by an older probsearch holds the bare version name: generation 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ActiveRecord:
    """Which version is active, and the generation of the activation that made it so."""

    version: str
    generation: int

    def to_text(self) -> str:
        return json.dumps({"version": self.version, "generation": self.generation})


def parse_record(text: str | bytes | None) -> ActiveRecord | None:
    """The record in a store's text; None for an empty store. ValueError if unreadable."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    text = text.strip()
    if not text:
        return None
    if not text.startswith("{"):
        return ActiveRecord(text, 0)
    try:
        fields = json.loads(text)
        return ActiveRecord(str(fields["version"]), int(fields["generation"]))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"unreadable active-version record {text[:80]!r}: {error}") from None


def newest(*records: ActiveRecord | None) -> ActiveRecord | None:
    """The record of the highest generation; on a tie the first given wins."""
    best = None
    for record in records:
        if record is not None and (best is None or record.generation > best.generation):
            best = record
    return best


# Set KEYS[1] to ARGV[1] only if the record there is of a lower generation than ARGV[2].
# A value that is not a JSON object is a bare version name from an older probsearch:
# generation 0. Returns 1 when it wrote.
SET_IF_NEWER = """
local current = redis.call('get', KEYS[1])
local generation = -1
if current then
  local ok, fields = pcall(cjson.decode, current)
  if ok and type(fields) == 'table' then
    generation = tonumber(fields['generation']) or 0
  else
    generation = 0
  end
end
if tonumber(ARGV[2]) > generation then
  redis.call('set', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
