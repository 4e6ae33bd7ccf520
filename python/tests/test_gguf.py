"""GGUF reader and dequantizers (`scalesweep inspect FILE.gguf`) against gguf-py 0.19.0.

Files are written with gguf-py's GGUFWriter: per ggml type, tensors of random raw block bytes
plus random metadata of every value type. Our dequantization (`--dump-dequant`, fp32
safetensors) must equal `gguf.quants.dequantize` bit for bit (uint32 views compared with
np.array_equal). NaN handling: F32/F16/BF16 data is fully random, NaNs included, and must match
bit for bit too (payload and sign: numpy converts f16 -> f32 by bits); in the block types the
f16 scale fields (d, dmin, m) are made finite (an exponent of all ones is cleared), so their
outputs are finite; NVFP4/MXFP4 scale bytes stay fully random (gguf-py decodes every UE4M3 /
E8M0 byte, 0x7F and 0xFF included, to a finite scale).
"""
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_common import BIN, need_bin

gguf = pytest.importorskip("gguf", reason="`pip install gguf` (gguf-py) for the GGUF checks")
st_numpy = pytest.importorskip("safetensors.numpy", reason="`pip install safetensors`")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"

# Byte offsets of the f16 scale fields inside one block.
F16_SCALES = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.F32: [], Q.F16: [], Q.BF16: [], Q.MXFP4: [], Q.NVFP4: [],
}
TYPES = list(F16_SCALES)


def run_cli(*args, check=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"scalesweep {' '.join(map(str, args))} failed:\n{r.stderr}")
    return r


def random_blocks(rng, qtype, rows, blocks_per_row):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, block_bytes), dtype=np.uint8)
    for off in F16_SCALES[qtype]:
        h = raw[..., off:off + 2].copy().view(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & ~np.uint16(0x4000), h).astype(np.uint16)
        raw[..., off:off + 2] = h.view(np.uint8)
    if qtype == Q.NVFP4:  # make sure the special scale bytes occur
        raw[0, 0, :4] = [0x7F, 0xFF, 0x00, 0x80]
    if qtype == Q.MXFP4:
        raw[0, 0, 0] = 0xFF
        if blocks_per_row > 1:
            raw[0, 1, 0] = 0x00
    return raw.reshape(rows, blocks_per_row * block_bytes), block_elems


def random_metadata(rng):
    """[(key, vtype, sub_type, value)] covering every value type, arrays of each and nested."""
    ints = {V.UINT8: (0, 2**8), V.INT8: (-2**7, 2**7), V.UINT16: (0, 2**16),
            V.INT16: (-2**15, 2**15), V.UINT32: (0, 2**32), V.INT32: (-2**31, 2**31),
            V.UINT64: (0, 2**64), V.INT64: (-2**63, 2**63)}

    def scalar(t):
        if t in ints:
            lo, hi = ints[t]
            return int(rng.integers(lo, hi, dtype=np.int64 if lo < 0 else np.uint64))
        if t == V.FLOAT32:
            return float(np.float32(rng.standard_normal() * 10.0 ** rng.integers(-30, 30)))
        if t == V.FLOAT64:
            return float(rng.standard_normal() * 10.0 ** rng.integers(-300, 300))
        if t == V.BOOL:
            return bool(rng.integers(0, 2))
        n = int(rng.integers(0, 12))
        return "".join(chr(int(c)) for c in rng.choice([0x41, 0x7A, 0x20, 0xE9, 0x4E2D, 0x1F600],
                                                       size=n))

    kvs = []
    scalar_types = [*ints, V.FLOAT32, V.FLOAT64, V.BOOL, V.STRING]
    for t in scalar_types:
        kvs.append((f"test.scalar.{t.name.lower()}", t, None, scalar(t)))
        n = int(rng.integers(1, 6))
        kvs.append((f"test.array.{t.name.lower()}", V.ARRAY, t, [scalar(t) for _ in range(n)]))
    nested = [[scalar(V.INT32) for _ in range(int(rng.integers(1, 4)))] for _ in range(3)]
    kvs.append(("test.array.nested_i32", V.ARRAY, V.ARRAY, nested))
    kvs.append(("test.array.nested_str", V.ARRAY, V.ARRAY, [["a", "bc"], ["", "é"]]))
    return kvs


def write_gguf(path, qtype, rng, alignment=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    kvs = random_metadata(rng)
    for key, vt, sub, val in kvs:
        w.add_key_value(key, val, vt, sub_type=sub)
    shapes = [(3, 2), (1, 5), (2, 1)]  # (rows, blocks per row)
    block_elems = 1
    for i, (rows, bpr) in enumerate(shapes):
        raw, block_elems = random_blocks(rng, qtype, rows, bpr)
        if block_elems == 1:  # F32/F16/BF16: make rows longer than one element
            raw, _ = random_blocks(rng, qtype, rows, bpr * 33)
        w.add_tensor(f"t{i}.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kvs


def json_value(entry):
    """Our --json rendering of a metadata entry back to Python (non-finite f32/f64 values are
    the strings "nan", "inf", "-inf")."""
    floats = entry["type"] in ("f32", "f64") or entry.get("elem_type") in ("f32", "f64")

    def conv(v):
        if isinstance(v, list):
            return [conv(x) for x in v]
        if floats and isinstance(v, str):
            return float(v)
        return v
    return conv(entry["value"])


def reader_value(field):
    t = field.types[0]
    if t == V.ARRAY and field.types[-1] != V.STRING:
        return [x for x in field.contents()]
    return field.contents()


def assert_bits_equal(ours, ref, what):
    assert ours.dtype == np.float32 and ref.dtype == np.float32, what
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a.ravel() != b.ravel())
        i = bad[0]
        raise AssertionError(f"{what}: {bad.size} elements differ, first at {i}: "
                             f"{ours.ravel()[i]!r} ({a.ravel()[i]:#010x}) vs "
                             f"{ref.ravel()[i]!r} ({b.ravel()[i]:#010x})")


def check_file(path, tmp_path, kvs=None):
    """Our inspect --json and --dump-dequant against gguf-py's GGUFReader and dequantize."""
    out = tmp_path / (path.stem + ".deq.safetensors")
    r = run_cli("inspect", path, "--json", "--dump-dequant", out)
    info = json.loads(r.stdout)
    reader = gguf.GGUFReader(str(path))
    assert info["version"] == 3
    assert info["alignment"] == reader.alignment
    assert info["data_offset"] == reader.data_offset
    # Metadata: every key, in file order, with its type and value.
    ours = {m["key"]: m for m in info["metadata"]}
    ref_keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert [m["key"] for m in info["metadata"]] == ref_keys
    for k in ref_keys:
        f = reader.fields[k]
        assert ours[k]["type"] == {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16",
                                   V.UINT32: "u32", V.INT32: "i32", V.FLOAT32: "f32",
                                   V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array",
                                   V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}[f.types[0]]
        if len(f.types) > 1 and f.types[1] == V.ARRAY:
            continue  # nested: gguf-py's contents() flattens them; checked against kvs below
        assert json_value(ours[k]) == reader_value(f), k
    for key, _vt, _sub, val in kvs or []:
        assert json_value(ours[key]) == val, key
    # Tensors: names, types, shapes, offsets, sizes; data bit for bit.
    deq = st_numpy.load_file(str(out))
    assert [t["name"] for t in info["tensors"]] == [t.name for t in reader.tensors]
    assert sorted(deq) == sorted(t.name for t in reader.tensors)
    for ti, t in zip(info["tensors"], reader.tensors):
        assert ti["type"] == t.tensor_type.name
        assert ti["ne"] == [int(x) for x in t.shape]
        assert ti["offset"] + info["data_offset"] == t.data_offset
        assert ti["nbytes"] == t.n_bytes
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert_bits_equal(deq[t.name], np.ascontiguousarray(ref, dtype=np.float32),
                          f"{path.name}:{t.name} ({t.tensor_type.name})")
    return info


@need_bin
@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequant_matches_gguf_py(tmp_path, qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    path = tmp_path / f"{qtype.name}.gguf"
    kvs = write_gguf(path, qtype, rng)
    check_file(path, tmp_path, kvs)


@need_bin
def test_custom_alignment(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "aligned.gguf"
    write_gguf(path, Q.Q8_0, rng, alignment=256)
    info = check_file(path, tmp_path)
    assert info["alignment"] == 256
    assert info["data_offset"] % 256 == 0
    assert all(t["offset"] % 256 == 0 for t in info["tensors"])


@need_bin
def test_tensor_selection_and_dump_policy(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "sel.gguf"
    write_gguf(path, Q.Q4_K, rng)
    out = tmp_path / "one.safetensors"
    run_cli("inspect", path, "--dump-dequant", out, "--tensor", "t1.weight")
    assert list(st_numpy.load_file(str(out))) == ["t1.weight"]
    r = run_cli("inspect", path, "--dump-dequant", out, check=False)
    assert r.returncode != 0 and "already exists" in r.stderr and "--force" in r.stderr
    run_cli("inspect", path, "--dump-dequant", out, "--force")
    assert sorted(st_numpy.load_file(str(out))) == ["t0.weight", "t1.weight", "t2.weight"]
    r = run_cli("inspect", path, "--dump-dequant", path, "--force", check=False)
    assert r.returncode != 0 and path.read_bytes()[:4] == b"GGUF"
    r = run_cli("inspect", path, "--dump-dequant", tmp_path / "x.safetensors", "--tensor", "nope",
                check=False)
    assert r.returncode != 0 and "'nope'" in r.stderr and str(path) in r.stderr
    assert not (tmp_path / "x.safetensors").exists()
    # Text listing names every tensor and key.
    r = run_cli("inspect", path)
    for name in ("t0.weight", "t2.weight", "test.scalar.uint64", "Q4_K"):
        assert name in r.stdout


@need_bin
def test_refuses_unsupported_type(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "q2k.gguf"), "llama")
    w.add_tensor("w", np.zeros((1, gguf.GGML_QUANT_SIZES[Q.Q2_K][1]), np.uint8), raw_dtype=Q.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli("inspect", tmp_path / "q2k.gguf", "--json")
    assert json.loads(r.stdout)["tensors"][0]["type"] == "Q2_K"
    r = run_cli("inspect", tmp_path / "q2k.gguf", "--dump-dequant", tmp_path / "o.safetensors",
                check=False)
    assert r.returncode != 0 and "Q2_K" in r.stderr and "'w'" in r.stderr


@need_bin
@pytest.mark.skipif(not FIXTURE.exists(),
                    reason=f"fixture {FIXTURE} absent (scripts/get-models.sh installs it)")
def test_fixture_smollm2_q4_1(tmp_path):
    t0 = time.perf_counter()
    info = check_file(FIXTURE, tmp_path)
    elapsed = time.perf_counter() - t0
    assert len(info["tensors"]) == 272
    md = {m["key"]: m["value"] for m in info["metadata"]}
    assert md["general.architecture"] == "llama"
    assert len(md["tokenizer.ggml.tokens"]) == 49152
    print(f"fixture checked (ours + gguf-py) in {elapsed:.2f} s")


@need_bin
def test_nonfinite_float_metadata(tmp_path):
    path = tmp_path / "nf.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("f32.nan", float("nan"), V.FLOAT32)
    w.add_key_value("f64.ninf", float("-inf"), V.FLOAT64)
    w.add_key_value("arr.f32", [1.5, float("inf")], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("s.inf", "inf", V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    md = {m["key"]: m for m in json.loads(run_cli("inspect", path, "--json").stdout)["metadata"]}
    assert md["f32.nan"]["value"] == "nan" and np.isnan(json_value(md["f32.nan"]))
    assert json_value(md["f64.ninf"]) == float("-inf")
    assert json_value(md["arr.f32"]) == [1.5, float("inf")]
    assert md["s.inf"]["value"] == "inf" and json_value(md["s.inf"]) == "inf"
