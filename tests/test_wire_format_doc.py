"""FORMAT.md's byte tables must describe exactly the dtypes the code uses."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import dspark_proxy.wire as wire

DOC = Path(wire.__file__).with_name("FORMAT.md")
_TYPES = {"u8": "u1", "u16": "<u2", "u32": "<u4", "u64": "<u8", "i32": "<i4", "i64": "<i8",
          "f32": "<f4", "f64": "<f8"}


def _tables() -> dict[str, list[tuple[int, str, str]]]:
    out: dict[str, list[tuple[int, str, str]]] = {}
    name = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"^### (\w+)$", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        if name is None:
            continue
        if line.startswith("|"):
            if re.match(r"^\| \d+ \|", line):
                cells = [c.strip() for c in line.strip("|").split("|")]
                out[name].append((int(cells[0]), cells[1], cells[2]))
        elif out[name]:
            name = None  # the table under the heading ended
    return out


@pytest.mark.parametrize("name", ["APP_HEADER_DTYPE", "STEP_HDR_DTYPE", "ENTRY_DTYPE", "SAMPLE_DTYPE",
                                  "REPLY_HDR_DTYPE"])
def test_doc_table_matches_dtype(name):
    rows = _tables()[name]
    dt: np.dtype = getattr(wire, name)
    assert [r[1] for r in rows] == list(dt.names), f"{name}: field names/order differ from FORMAT.md"
    for off, field, typ in rows:
        ftype, foff = dt.fields[field][:2]
        assert foff == off, f"{name}.{field}: doc offset {off}, dtype {foff}"
        assert np.dtype(_TYPES[typ]) == ftype, f"{name}.{field}: doc type {typ}, dtype {ftype}"


def test_sizes_and_alignment():
    assert wire.APP_HEADER_SIZE == 40 and wire.ENTRY_DTYPE.itemsize == 40
    assert wire.SAMPLE_DTYPE.itemsize == 16
    for n in range(0, 300, 7):
        for sampled in (False, True):
            assert wire.rows_offset_for(n, sampled) % 8 == 0
            assert wire.step_prefix_bytes(n, sampled) == wire.APP_HEADER_SIZE + wire.rows_offset_for(n, sampled)


def test_status_tables():
    assert wire.USABLE_REQ_STATUS == {wire.RS_OK, wire.RS_PARTIAL_WINDOW}
    assert wire.USABLE_STATUS_TABLE.shape == (256,)
    assert set(np.flatnonzero(wire.USABLE_STATUS_TABLE)) == set(wire.USABLE_REQ_STATUS)
    assert set(wire.REQ_STATUS_NAMES) == set(range(wire.RS_MAX + 1))
    assert wire.REQ_STATUS_NAMES[wire.RS_GAP] == "gap"
    text = DOC.read_text()
    for code, name in wire.REQ_STATUS_NAMES.items():
        assert f"| {code} | {name} |" in text


def test_entries_and_sample_views_write_in_place():
    n = 5
    prefix = bytearray(wire.step_prefix_bytes(8, True))
    ev = wire.entries_view(prefix, n)
    sv = wire.sample_view(prefix, n)
    ev["slot"] = np.arange(n)
    sv["seed"] = 100 + np.arange(n)
    off = wire.APP_HEADER_SIZE + wire.STEP_HDR_SIZE
    assert int.from_bytes(prefix[off + 40:off + 44], "little") == 1
    so = off + n * 40
    assert int.from_bytes(prefix[so + 16:so + 24], "little") == 101
