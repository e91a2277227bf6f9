"""Loaders that validate public benchmark files and convert them into :class:`~data.schemas.Episode`."""

from data.loaders.common import convert, read_records
from data.loaders.formats import LOADERS, load_amabench, load_generic, load_locomo, load_memoryarena

__all__ = ["LOADERS", "convert", "load_amabench", "load_generic", "load_locomo", "load_memoryarena", "read_records"]
