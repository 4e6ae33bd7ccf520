"""Faults during `quantize`, `convert`, `tensor -o` and `calibrate -o` (issue 14, part 3).

- A full disk: RLIMIT_FSIZE with SIGXFSZ ignored (set in preexec_fn), so write() fails with
  EFBIG; portable, no root, no mount.
- SIGKILL while the temp output exists: no cleanup can run; the temp ".NAME.tmp.PID.XXXXXX"
  stays, and the next run writing the same output removes it with a note.
- An input truncated while mapped (SIGBUS): one message naming the file, exit status 1.

After each fault the output path is absent, or holds its previous content byte for byte; the
user gets ONE error line (no repeated lines, no 'std::bad_alloc', no abort).
"""
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_data

pytestmark = [need_bin, need_data]


def run(*args, check=True, preexec_fn=None, timeout=300):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                       preexec_fn=preexec_fn, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr}"
    return r


def disk_full(limit):
    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def snapshot(path: Path):
    """Bytes of a file, or {relative name: bytes} of a directory tree; None when absent."""
    if not path.exists():
        return None
    if path.is_file():
        return path.read_bytes()
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def temps_of(path: Path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.tmp."))


def assert_one_error(stderr, *must):
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert len(errors) == 1, stderr
    for bad in ("bad_alloc", "terminate called", "Aborted", "core dumped"):
        assert bad not in stderr, stderr
    for m in must:
        assert m in errors[0], (m, stderr)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fault_inputs")
    hf = d / "stories-bf16"
    run("convert", MODEL, "--tokenizer", TOK, "-o", hf, "--dtype", "bf16", "--shard-mb", "0.2")
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    np.save(d / "x.npy", x)
    return {"hf": hf, "npy": d / "x.npy"}


# name -> (argument list for an output path, whether the output is a directory)
def commands(inputs):
    return {
        "quantize": (lambda out: ["quantize", inputs["hf"], "-o", out, "--method", "absmax"], True),
        "convert": (lambda out: ["convert", MODEL, "--tokenizer", TOK, "-o", out], True),
        "tensor": (lambda out: ["tensor", inputs["npy"], "--method", "sweep-mse", "-o", out],
                   False),
        "calibrate": (lambda out: ["calibrate", MODEL, "--tokenizer", TOK, "--calib", VAL,
                                   "--nsamples", "4", "--seqlen", "32", "-o", out], False),
    }


NAMES = ["quantize", "convert", "tensor", "calibrate"]
# The cases: every command, with no previous output and over a previous one.
EACH_COMMAND = pytest.mark.parametrize("name", NAMES)
WITH_PREVIOUS = pytest.mark.parametrize("previous", [False, True], ids=["no-previous", "previous"])


def output_name(name):
    return {"quantize": "q", "convert": "c", "tensor": "t.safetensors",
            "calibrate": "s.safetensors"}[name]


def start_state(args, out, previous):
    """Writes a previous output with `args` when asked. Returns (the options a second write
    needs, the snapshot the output must still have after a failed one)."""
    extra = []
    if previous:
        run(*args)
        extra = ["--force"]
    return extra, snapshot(out)


def start_case(inputs, tmp_path, name, previous):
    """Command `name` writing into tmp_path: (its argument list for an output path, the output
    path, then start_state's (options of a second write, snapshot))."""
    make, _ = commands(inputs)[name]
    out = tmp_path / output_name(name)
    return (make, out, *start_state(make(out), out, previous))


@WITH_PREVIOUS
@EACH_COMMAND
def test_disk_full(inputs, tmp_path, name, previous):
    make, out, extra, before = start_case(inputs, tmp_path, name, previous)
    r = run(*make(out), *extra, check=False, preexec_fn=disk_full(32 * 1024))
    assert r.returncode == 1, r.stderr
    assert_one_error(r.stderr, "File too large")
    assert snapshot(out) == before
    assert temps_of(out) == []


def kill_when_temp_appears(args, out: Path):
    """Starts the command and SIGKILLs it as soon as its temp output exists. Returns the pid
    killed, or None when the run finished first: before a temp could be seen, or (a fast
    command on a loaded machine) after the temp was seen but renamed into place before the
    signal landed, so that no temp is left."""
    p = subprocess.Popen([BIN, *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 120:
        if temps_of(out):
            p.send_signal(signal.SIGKILL)
            p.wait()
            return p.pid if temps_of(out) else None
    p.wait()
    return None


@WITH_PREVIOUS
@EACH_COMMAND
def test_sigkill_then_next_run_cleans(inputs, tmp_path, name, previous):
    make, out, extra, before = start_case(inputs, tmp_path, name, previous)
    pid = None
    for _ in range(8):
        pid = kill_when_temp_appears([*make(out), *extra], out)
        if pid is not None:
            break
        # The run completed before its temp was seen: put the starting state back.
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        if previous:
            run(*make(out))
            before = snapshot(out)
    assert pid is not None, "every run finished before its temp output could be seen"
    # What SIGKILL leaves: the temp of the killed pid; the output absent or untouched.
    left = temps_of(out)
    assert left and all(n.startswith(f".{out.name}.tmp.{pid}.") for n in left), left
    assert snapshot(out) == before
    # The next run removes it, says so once, and writes the output.
    r = run(*make(out), "--force")
    notes = [ln for ln in r.stderr.splitlines() if str(pid) in ln]
    assert len(notes) == len(left) and all("killed" in n for n in notes), r.stderr
    assert temps_of(out) == []
    assert snapshot(out) is not None


def mapped_files(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {ln.split(None, 5)[5].strip() for ln in f if len(ln.split(None, 5)) == 6}
    except OSError:
        return set()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/PID/maps")
@WITH_PREVIOUS
def test_input_truncated_while_mapped(inputs, tmp_path, previous):
    """Streamed quantize maps the shards of the HF directory and reads them layer by layer;
    truncating the shards under it gives SIGBUS on the next page read: one message naming the
    file, exit status 1, no output and no temp left."""
    hf = tmp_path / "hf"
    shutil.copytree(inputs["hf"], hf)
    shards = sorted(str(p) for p in hf.glob("*.safetensors"))
    out = tmp_path / "q"
    args = ["quantize", hf, "-o", out, "--method", "sweep-wmse", "--gptq", "--quant", "WA",
            "--calib", VAL, "--nsamples", "16", "--seqlen", "128"]
    extra, before = start_state(args, out, previous)
    p = subprocess.Popen([BIN, *map(str, args), *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    seen = set()
    while p.poll() is None and time.monotonic() - t0 < 60:
        seen = mapped_files(p.pid) & set(shards)
        if seen:
            break
    assert seen, "the shards were never seen mapped"
    last = max(seen)  # the shard holding the last layers, read last
    os.truncate(last, 0)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 1, (p.returncode, stderr)
    # Two correct outcomes, by timing: the shard is truncated while mapped (SIGBUS on the next
    # page read: our handler's message), or the streamed reader had unmapped it and opens it
    # again after the truncation (the open refuses it). The SIGBUS path itself is tested
    # deterministically by io/atomic_file_test.cc (MappedFileDeathTest).
    assert_one_error(stderr, last)
    assert ("changed or was truncated while being read" in stderr
            or "truncated: 0 bytes" in stderr), stderr
    assert snapshot(out) == before
    assert temps_of(out) == []


def test_out_of_memory_is_one_message():
    """std::bad_alloc (here: RLIMIT_AS below a 16 GiB bench input) is one readable line, not
    'std::bad_alloc'."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    r = run("bench", "--rows", "65536", "--cols", "65536", "--repeat", "1", check=False,
            preexec_fn=limit_memory)
    assert r.returncode == 1, r.stderr
    assert_one_error(r.stderr, "scalesweep bench: error: out of memory")
