"""Loaders that validate public benchmark files and convert them into :class:`~memrl.data.schemas.Episode`."""

from memrl.data.loaders.common import convert, read_records
from memrl.data.loaders.formats import LOADERS, load_amabench, load_generic, load_locomo, load_memoryarena

__all__ = ["LOADERS", "convert", "load_amabench", "load_generic", "load_locomo", "load_memoryarena", "read_records"]
