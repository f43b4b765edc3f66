"""End-to-end tests of the GPT example (examples/gpt), registered with CTest by examples/gpt/CMakeLists.txt.

usage: gpt_test.py CASE GPT_BINARY [MPIEXEC]
  CASE: bad_corpus | fused_dropout | checkpoint_modes | estimate | resume | json | real_corpus | weights
        | distributed_equals_single_process | distributed_faults (these two run GPT under MPIEXEC)
Each case exits 0 on success and prints what failed otherwise. The cases train a tiny model for a few
steps on a corpus the test writes (so they do not need the fortunes package) and take well under a
second each in the optimised build (the distributed ones a few seconds: each mpiexec starts its ranks);
real_corpus uses /usr/share/games/fortunes and skips if it is absent. Only the standard library is used.
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

CASE, GPT = sys.argv[1], sys.argv[2]
MPI = [sys.argv[3], "--oversubscribe", "--allow-run-as-root"] if len(sys.argv) > 3 else None
FORTUNES = "/usr/share/games/fortunes"
MODES = ("none", "block", "attention", "dots_no_batch", "sqrt")
# A tiny model: 3 blocks (sqrt: 2 segments), S = 16, B = 4.
TINY = ["--layers", 3, "--width", 32, "--heads", 2, "--seq-len", 16, "--batch", 4, "--steps", 20, "--warmup", 5,
        "--log-every", 5, "--eval-every", 10, "--eval-batches", 2, "--sample-bytes", 40]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)
    return condition


def run(*args, expect=0, launcher=(), timeout=120):
    """Runs gpt with `args` (after `launcher`, e.g. mpiexec -np 2); expect: the exit code, or "nonzero"."""
    command = [*map(str, launcher), GPT, *map(str, args)]
    try:
        p = subprocess.run(command, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        check(False, f"still running after {timeout} s (a hang): {' '.join(command)}")
        return subprocess.CompletedProcess(command, -1, "", "")
    p.stdout, p.stderr = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode != expect and not (expect == "nonzero" and p.returncode != 0):
        check(False, f"{' '.join(command)}: exit code {p.returncode}, expected {expect}\n"
                     f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p


def run_json(*args, launcher=()):
    p = run(*args, "--json", launcher=launcher)
    lines = p.stdout.strip().splitlines()
    if not check(lines, f"gpt {' '.join(map(str, args))}: no output"):
        return {}
    return json.loads(lines[-1])


def write_corpus(directory, size=24 * 1024):
    """Deterministic pseudo-English, fortune-file style, in two files (plus files the reader must skip)."""
    os.makedirs(directory, exist_ok=True)
    words = ("the cat sat on a mat and then it ran off to see why all good things come to those who wait "
             "for a bus in the rain while thinking of tea").split()
    state, text = 12345, []
    while sum(map(len, text)) < size:
        line = []
        for _ in range(8):
            state = (state * 1103515245 + 12345) % 2**31
            line.append(words[state % len(words)])
        text.append(" ".join(line).capitalize() + ".\n%\n")
    body = "".join(text).encode()
    half = len(body) // 2
    with open(os.path.join(directory, "a-first"), "wb") as f:
        f.write(body[:half])
    with open(os.path.join(directory, "b-second"), "wb") as f:
        f.write(body[half:])
    with open(os.path.join(directory, "a-first.dat"), "wb") as f:  # a fortune index file: not text
        f.write(b"\0\1\2\3" * 100)
    os.symlink("a-first", os.path.join(directory, "a-first.u8"))  # as Debian's package: a duplicate
    os.symlink("b-second", os.path.join(directory, "c-link"))  # any symlink is skipped
    return len(body)


def one_error_line(p, words, what):
    err = p.stderr.strip()
    check(len(err.splitlines()) == 1, f"{what}: expected one error line, got {err!r}")
    check(err.startswith("gpt: error: "), f"{what}: not a 'gpt: error:' line: {err!r}")
    for w in words:
        check(w in err, f"{what}: the error does not say {w!r}: {err!r}")


def case_bad_corpus():
    with tempfile.TemporaryDirectory() as tmp:
        missing = os.path.join(tmp, "absent")
        one_error_line(run("--data", missing, *TINY, expect=2), [missing, "no such directory"], "missing directory")
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        with open(os.path.join(empty, "x.dat"), "wb") as f:
            f.write(b"index")
        one_error_line(run("--data", empty, *TINY, expect=2), [empty, "empty"], "empty corpus")
        small = os.path.join(tmp, "small")
        write_corpus(small, size=4000)
        one_error_line(run("--data", small, *TINY, expect=2), [small, "too small"], "too small a corpus")
        # The command line: --help succeeds, a bad value is a usage error (exit 2).
        check("--checkpoint" in run("--help").stdout, "--help does not list --checkpoint")
        run("--checkpoint", "everything", expect=2)
        run("--attention", "flash", expect=2)
        one_error_line(run("--data", small, "--width", 30, "--heads", 4, expect=2), ["divisible"], "width % heads")


def case_fused_dropout():
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        write_corpus(data)
        p = run("--data", data, *TINY, "--attention", "fused", "--dropout", 0.1, expect=2)
        one_error_line(p, ["--attention fused", "dropout"], "fused + dropout")
        check(p.stdout == "", f"fused + dropout trained anyway: {p.stdout[:200]!r}")
        # The dropout may come from a state file instead of the command line.
        state = os.path.join(tmp, "dropout.state")
        run("--data", data, *TINY, "--dropout", 0.1, "--stop-after", 2, "--state", state)
        one_error_line(run("--data", data, "--state", state, "--attention", "fused", expect=2),
                       ["--attention fused", "dropout 0.1"], "fused + a state file with dropout")


def case_checkpoint_modes():
    """Replay recomputes the same ops on the same inputs and dropout redraws its masks from the step's
    seed, so every mode trains bitwise identically: equal parameter checksum and CRC-32 of the bytes."""
    keys = ("parameter_checksum", "parameters_crc32", "train_loss", "val_loss", "sample")
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(tmp)
        results = {}
        for attention, dropout in (("unfused", 0), ("fused", 0), ("unfused", 0.1)):
            runs = {m: run_json("--data", tmp, *TINY, "--checkpoint", m, "--attention", attention,
                                "--dropout", dropout) for m in MODES}
            for m in MODES[1:]:
                for k in keys:
                    check(k in runs["none"] and runs[m].get(k) == runs["none"].get(k),
                          f"{attention}, dropout {dropout}: {m} differs from none in {k}: "
                          f"{runs[m].get(k)} vs {runs['none'].get(k)}")
            # Every mode but none holds fewer residuals (selective with fused attention too: its region drops
            # the fused op's statistics and re-runs it).
            for m in MODES[1:]:
                check(runs[m].get("saved_bytes", 1e18) < runs["none"].get("saved_bytes", 0),
                      f"{attention}, dropout {dropout}, {m}: saved {runs[m].get('saved_bytes')} bytes, "
                      f"not below none's {runs['none'].get('saved_bytes')}")
            results[(attention, dropout)] = runs["none"]
        # Fused attention computes the softmax from a log-sum-exp, so it agrees with unfused to rounding
        # only, not bitwise (docs/gpt.md §Training).
        a, b = results[("unfused", 0)], results[("fused", 0)]
        rel = abs(a.get("parameter_checksum", 0) - b.get("parameter_checksum", 1)) / abs(a.get("parameter_checksum", 1))
        check(rel < 1e-4, f"fused and unfused checksums differ by {rel:g} (relative)")


def case_estimate():
    """--estimate counts one training step from shapes alone, reading no corpus: its saved and peak bytes equal
    the training run's (saved after the forward pass, peak over forward + backward), exactly, in every mode."""
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(tmp)
        for attention, dropout in (("unfused", 0.1), ("fused", 0)):
            for m in MODES:
                settings = [*TINY, "--checkpoint", m, "--attention", attention, "--dropout", dropout]
                real = run_json("--data", tmp, *settings)
                args = ["--data", os.path.join(tmp, "absent"), *settings, "--estimate"]
                p = run(*args)
                for key, label in (("saved_bytes", "saved after the forward pass"),
                                   ("peak_bytes", "peak of forward + backward")):
                    value = real.get(key, -1)
                    # "<label>: <MB> MB (<bytes> bytes)", the columns aligned with spaces
                    line = re.compile(re.escape(f"{label}:") + " +" +
                                      re.escape(f"{value / 1e6:.2f} MB ({value} bytes)"))
                    check(line.search(p.stdout),
                          f"--estimate {m} {attention}: no line {line.pattern!r} in {p.stdout!r}")
                check("loss" not in p.stdout, f"--estimate trained: {p.stdout!r}")
                e = run_json(*args)
                for key in ("saved_bytes", "peak_bytes"):
                    check(e.get("estimate") is True and key in e and e.get(key) == real.get(key),
                          f"--estimate {m} {attention}: {key} {e.get(key)}, the training run's {real.get(key)}")


def case_resume():
    """20 steps straight = 10 steps (--stop-after, as if interrupted) + resumed from the state file to 20,
    with dropout on: the file holds the parameters, AdamW's moments and step, and the batch generator."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        write_corpus(data)
        common = ["--data", data, *TINY, "--dropout", 0.1]
        whole = run_json(*common)
        state = os.path.join(tmp, "run.state")
        first = run_json(*common, "--state", state, "--stop-after", 10, "--save-every", 3)
        check(first.get("steps") == 10, f"the first part ran {first.get('steps')} steps, not 10")
        check(os.path.exists(state), "no state file after the first part")
        # The settings come from the file: the second part gives only what does not change the result.
        p = run("--data", data, "--state", state, "--eval-batches", 2, "--sample-bytes", 40, "--log-every", 5,
                "--eval-every", 10, "--json")
        check("resumed from" in p.stdout and "at step 10" in p.stdout, f"no resume line: {p.stdout[:600]!r}")
        second = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
        for k in ("steps", "parameter_checksum", "parameters_crc32", "train_loss", "val_loss", "sample"):
            check(k in whole and whole.get(k) == second.get(k),
                  f"resumed run differs in {k}: {second.get(k)} vs straight {whole.get(k)}")
        check(sorted(os.listdir(tmp)) == ["corpus", "run.state"], f"left-over files: {sorted(os.listdir(tmp))}")
        # A flag that contradicts the file is refused, and the file is left as it was.
        before = open(state, "rb").read()
        one_error_line(run("--data", data, "--state", state, "--width", 64, expect=2), [state, "--width"],
                       "conflicting --width")
        one_error_line(run("--data", os.path.join(tmp, "other"), "--state", state, expect=2), ["no such directory"],
                       "resume on a missing corpus")
        with open(state, "r+b") as f:  # a damaged file is rejected (the common format's checksum)
            f.seek(len(before) // 2)
            f.write(bytes([before[len(before) // 2] ^ 1]))
        one_error_line(run("--data", data, "--state", state, expect=2), [state, "checksum mismatch"], "damaged state")


def case_json():
    with tempfile.TemporaryDirectory() as tmp:
        size = write_corpus(tmp)
        d = run_json("--data", tmp, *TINY, "--temperature", 0)
        for k in ("steps", "train_loss", "val_loss", "val_bits_per_byte", "unigram_nats_per_byte",
                  "unigram_bits_per_byte", "tokens_per_second", "saved_bytes", "peak_bytes", "parameter_checksum",
                  "parameters_crc32", "parameters", "corpus_bytes", "train_bytes", "val_bytes", "sample"):
            check(k in d, f"--json has no {k!r}: {sorted(d)}")
        check(d.get("steps") == 20, f"steps {d.get('steps')}")
        # The .dat file and both symlinks are not corpus text; every 20th 1 KiB block is validation.
        check(d.get("corpus_bytes") == size, f"corpus_bytes {d.get('corpus_bytes')}, the text files hold {size}")
        blocks = (size + 1023) // 1024
        val = sum(min(1024, size - k * 1024) for k in range(blocks) if k % 20 == 19)
        check(d.get("val_bytes") == val and d.get("train_bytes") == size - val,
              f"split {d.get('train_bytes')}/{d.get('val_bytes')}, expected {size - val}/{val}")
        check(math.isclose(d.get("val_bits_per_byte", 0), d.get("val_loss", 1) / math.log(2), rel_tol=1e-12),
              "val_bits_per_byte is not val_loss / ln 2")
        check(0 < d.get("unigram_nats_per_byte", 0) < math.log(256), f"unigram {d.get('unigram_nats_per_byte')}")
        check(d.get("saved_bytes", 0) > 0 and d.get("peak_bytes", 0) >= d.get("saved_bytes", 0),
              f"saved {d.get('saved_bytes')} / peak {d.get('peak_bytes')}")
        check(isinstance(d.get("sample"), str) and len(d.get("sample", "").encode()) >= 40,
              f"sample {d.get('sample')!r}")
        # Greedy sampling is deterministic and does not depend on the seed of the sampler.
        again = run_json("--data", tmp, *TINY, "--temperature", 0)
        check(again.get("sample") == d.get("sample"), "greedy samples differ between equal runs")


def case_real_corpus():
    if not os.path.isdir(FORTUNES):
        print(f"skipped: {FORTUNES} is absent (Debian's fortunes package; scripts/install-deps.sh installs it)")
        return
    text = [n for n in sorted(os.listdir(FORTUNES)) if not n.endswith((".dat", ".u8"))
            and not os.path.islink(os.path.join(FORTUNES, n)) and os.path.isfile(os.path.join(FORTUNES, n))]
    size = sum(os.path.getsize(os.path.join(FORTUNES, n)) for n in text)
    d = run_json("--layers", 2, "--width", 32, "--heads", 2, "--seq-len", 32, "--batch", 8, "--steps", 60,
                 "--warmup", 10, "--log-every", 20, "--eval-every", 0, "--eval-batches", 4, "--sample-bytes", 40)
    check(d.get("corpus_bytes") == size, f"corpus_bytes {d.get('corpus_bytes')}, the {len(text)} files hold {size}")
    # Even 60 steps of a tiny model beat the unigram model (3.32 vs 3.17 nats/byte when measured).
    check(d.get("val_loss", 99) < d.get("unigram_nats_per_byte", 0),
          f"validation {d.get('val_loss')} not below the unigram baseline {d.get('unigram_nats_per_byte')}")


def read_state(path):
    """The parameters and AdamW first moments of a state file (main.cpp's encode_state after the common
    header: examples/common/state_file.hpp), as lists of floats in the optimizer's order."""
    data = open(path, "rb").read()[8 + 4 + 8 + 4:]
    offset = 8 + 6 * 4 + 8 + 8 + 8 + 8 + 4 + 8 + 8 + 8  # settings, corpus, step, batch stream, last loss
    (count,) = struct.unpack_from("<I", data, offset)
    offset += 4
    values, moments = [], []
    for _ in range(count):
        for out in (values, moments, None):
            rows, cols = struct.unpack_from("<QQ", data, offset)
            offset += 16
            floats = struct.unpack_from(f"<{rows * cols}f", data, offset)
            offset += 4 * rows * cols
            if out is not None:
                out.append(floats)
    return values, moments


def relative_difference(a, b):
    """‖a − b‖ / ‖b‖ (0 when both are 0)."""
    norm = math.sqrt(sum(y * y for y in b))
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return diff / norm if norm > 0 else diff


# One optimizer step of a tiny model (3 blocks: sqrt has 2 segments; B = 4 sequences: 2+2 on 2 ranks,
# 1+1+2 on 3), then the state file holds the parameters after the step and AdamW's first moment
# m = (1 − β1)·g, g the clipped gradient of the step.
DIST = ["--layers", 3, "--width", 32, "--heads", 2, "--seq-len", 16, "--batch", 4, "--steps", 2, "--warmup", 1,
        "--stop-after", 1, "--log-every", 1, "--eval-every", 0, "--eval-batches", 2, "--sample-bytes", 0,
        "--threads", 1]


def case_distributed_equals_single_process():
    """N ranks train on shards of the same global batch: after one step the loss and the gradient equal one
    process's to 1e-6 relative (float sums in another order), the parameters as below, for checkpointed modes and
    both attentions; the ranks' parameters are bitwise equal (the example compares their CRC-32 at the end
    and fails otherwise); only rank 0 prints; --timing reports the one reduction.

    The gradient: its norm before clipping (a gradient reduced twice, or weighed wrongly, changes it) and, per
    tensor, its direction (AdamW's first moment after one step is 0.1 × the gradient clipped to norm 1).
    The parameters: over the whole parameter vector, not per tensor. AdamW's first update is lr·g/(|g| + ε)
    with ε = 1e-8, which turns the rounding of gradients near ε into update differences of up to lr·1 % (the
    key bias's gradient is 0 but for rounding: softmax ignores a constant added to every key; some weights'
    are ~1e-9), up to 5e-5 of a small bias tensor's norm: the whole vector differs by 3e-7 with OpenBLAS's
    Haswell kernels and 1.5e-6 with its AVX-512 (Cooper Lake) ones on Zen 5 (2 ranks). So the parameters
    whose gradient is ≥ 1e-6 (85 % of them) are compared at 1e-6 (they differ by 6e-9 either way), the
    whole vector at 1e-5."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        write_corpus(data)
        single = {}
        for attention in ("unfused", "fused"):
            state = os.path.join(tmp, f"single-{attention}.state")
            single[attention] = (run_json("--data", data, *DIST, "--attention", attention, "--state", state),
                                 read_state(state))
        for ranks, mode, attention in ((2, "block", "unfused"), (2, "attention", "unfused"), (2, "sqrt", "unfused"),
                                       (3, "dots_no_batch", "fused")):
            what = f"{ranks} ranks, --checkpoint {mode}, {attention}"
            state = os.path.join(tmp, f"{ranks}-{mode}.state")
            p = run("--data", data, *DIST, "--checkpoint", mode, "--attention", attention, "--state", state,
                    "--distributed", "--timing", "--json", launcher=[*MPI, "-np", ranks])
            if not check(p.returncode == 0 and p.stdout.strip(), f"{what}: no result"):
                continue
            check(p.stdout.count('"train_loss"') == 1 and p.stdout.count("data parallel: ") == 1,
                  f"{what}: only rank 0 prints, got:\n{p.stdout}")
            d = json.loads(p.stdout.strip().splitlines()[-1])
            s, (s_values, s_moments) = single[attention]
            check(d.get("ranks") == ranks and d.get("steps") == 1, f"{what}: ranks {d.get('ranks')}, {d.get('steps')} steps")
            check(abs(d.get("train_loss", 0) - s["train_loss"]) <= 1e-6 * abs(s["train_loss"]),
                  f"{what}: loss {d.get('train_loss')} vs one process {s['train_loss']}")
            check(abs(d.get("grad_norm", 0) - s["grad_norm"]) <= 1e-6 * s["grad_norm"],
                  f"{what}: gradient norm {d.get('grad_norm')} vs one process {s['grad_norm']}")
            values, moments = read_state(state)
            flat = lambda tensors: [x for t in tensors for x in t]
            check(len(values) == len(s_values) and len(values) > 0, f"{what}: {len(values)} parameters in {state}")
            # Where one process's gradient g = 10·m is ≥ 100·ε, AdamW's update lr·g/(|g| + ε) is insensitive
            # to g's rounding; below, it is not: compared there only with the whole vector, at 1e-5.
            steady = [abs(10 * m) >= 1e-6 for m in flat(s_moments)]
            pick = lambda xs: [x for x, keep in zip(xs, steady) if keep]
            difference = relative_difference(pick(flat(values)), pick(flat(s_values)))
            check(difference <= 1e-6, f"{what}: parameters whose gradient is ≥ 1e-6 differ from one process's by "
                                      f"{difference:g} (relative)")
            difference = relative_difference(flat(values), flat(s_values))
            check(difference <= 1e-5, f"{what}: parameters differ from one process's by {difference:g} (relative)")
            worst = max((relative_difference(a, b), k) for k, (a, b) in enumerate(zip(moments, s_moments)))
            check(worst[0] <= 1e-6, f"{what}: the gradient of parameter {worst[1]} (optimizer order) differs from "
                                    f"one process's by {worst[0]:g} (relative)")
            t = d.get("timing", {})
            gradient_bytes = 4 * (d.get("parameters", 0) + len(values))  # every gradient and one flag each
            check(t.get("reduced_steps") == 1 and t.get("bytes_per_step") == gradient_bytes,
                  f"{what}: --timing says {t}, expected one step of {gradient_bytes} bytes")
            check(t.get("hidden_fraction") is not None and 0 <= t["hidden_fraction"] <= 1,
                  f"{what}: hidden fraction {t.get('hidden_fraction')}")


def case_distributed_faults():
    """Ranks started with different model flags, a batch smaller than the ranks, and ranks resuming from
    different state files stop at start-up with a message on stderr and a non-zero exit, instead of hanging
    or training apart."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        write_corpus(data)
        one = [*MPI, "-np", 1]  # MPMD: mpiexec -np 1 gpt FLAGS : -np 1 gpt OTHER_FLAGS
        common = ["--data", data, *DIST, "--distributed"]

        def changed(flag, value):
            flags = [str(a) for a in common]
            flags[flags.index(flag) + 1] = str(value)
            return flags

        p = run(*common, ":", "-np", 1, GPT, *changed("--width", 16), expect="nonzero", launcher=one, timeout=60)
        # Both ranks see the mismatch; whichever aborts first is the one that prints.
        check(any(f"gpt: rank {r} of 2: error: broadcast_parameters: parameter 0 is [256,32] on rank 0 but [256,16] "
                  "on rank 1" in p.stderr for r in (0, 1)), f"mismatched --width: stderr {p.stderr[-3000:]!r}")
        p = run(*changed("--batch", 1), expect="nonzero", launcher=[*MPI, "-np", 2], timeout=60)
        check("error: --batch 1 is smaller than the 2 ranks" in p.stderr,
              f"--batch 1 on 2 ranks: stderr {p.stderr[-3000:]!r}")
        state = os.path.join(tmp, "run.state")
        run("--data", data, *DIST, "--state", state)  # one process, one step
        p = run(*common, "--state", state, ":", "-np", 1, GPT, *common, "--state", os.path.join(tmp, "absent.state"),
                expect="nonzero", launcher=one, timeout=60)
        check("the step to start from (--state): rank 0 has 1 but rank 1 has 0; every rank must be given the same "
              "--seed and --state file" in p.stderr,
              f"different --state files: stderr {p.stderr[-3000:]!r}")


# ---- --save-weights / --load-weights: safetensors files read and written here with json and struct ----

def read_safetensors(path):
    """(header, {name: (shape, list of floats)}) of a safetensors file, read by the format's rules alone."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    check(n % 8 == 0, f"{path}: header not padded to 8 bytes")
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        code = {"F32": "f", "F64": "d"}[t["dtype"]]
        count = (end - begin) // struct.calcsize(code)
        tensors[name] = (t["shape"], list(struct.unpack(f"<{count}{code}", data[8 + n + begin:8 + n + end])))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    check(8 + n + end == len(data), f"{path}: the tensors do not end at the end of the file")
    return header, tensors


def write_safetensors(path, tensors, dtypes=None):
    """A safetensors file as another writer (PyTorch's) would make it: no metadata, tensors in reverse name
    order, F32 unless `dtypes` says F64."""
    dtypes = dtypes or {}
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors, reverse=True):
        shape, values = tensors[name]
        dtype = dtypes.get(name, "F32")
        chunk = struct.pack(f"<{len(values)}{'f' if dtype == 'F32' else 'd'}", *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(chunk)
        offset += len(chunk)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def nanogpt_logits(tensors, layers, heads, context):
    """The logits of the last byte of `context`, computed in double from the file's tensors alone, as a
    nanoGPT-style PyTorch module does with them (nn.Linear: y = x·Wᵀ + b with W [out,in]; c_attn's output is
    q, k, v; head h is columns h·d … h·d+d−1; GELU's tanh form; layer norm with eps 1e-5; causal attention)."""
    def t(name):
        shape, values = tensors[name]
        return [values[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])] if len(shape) == 2 else values

    def linear(x, prefix):
        w, b = t(prefix + ".weight"), t(prefix + ".bias")
        return [[sum(wi * xi for wi, xi in zip(row, v)) + bo for row, bo in zip(w, b)] for v in x]

    def layer_norm(x, prefix):
        g, b, out = t(prefix + ".weight"), t(prefix + ".bias"), []
        for v in x:
            mean = sum(v) / len(v)
            var = sum((e - mean) ** 2 for e in v) / len(v)
            out.append([(e - mean) / math.sqrt(var + 1e-5) * gi + bi for e, gi, bi in zip(v, g, b)])
        return out

    def gelu(z):
        return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

    wte, wpe = t("transformer.wte.weight"), t("transformer.wpe.weight")
    x = [[a + b for a, b in zip(wte[c], wpe[s])] for s, c in enumerate(context)]
    H = len(x[0])
    d = H // heads
    for l in range(layers):
        p = f"transformer.h.{l}."
        qkv = linear(layer_norm(x, p + "ln_1"), p + "attn.c_attn")
        y = [[0.0] * H for _ in x]
        for h in range(heads):
            q = [r[h * d:(h + 1) * d] for r in qkv]
            k = [r[H + h * d:H + (h + 1) * d] for r in qkv]
            v = [r[2 * H + h * d:2 * H + (h + 1) * d] for r in qkv]
            for i in range(len(x)):
                scores = [sum(a * b for a, b in zip(q[i], k[j])) / math.sqrt(d) for j in range(i + 1)]
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                for c in range(d):
                    y[i][h * d + c] = sum(e[j] * v[j][c] for j in range(i + 1)) / sum(e)
        x = [[a + b for a, b in zip(r, o)] for r, o in zip(x, linear(y, p + "attn.c_proj"))]
        m = [[gelu(z) for z in r] for r in linear(layer_norm(x, p + "ln_2"), p + "mlp.c_fc")]
        x = [[a + b for a, b in zip(r, o)] for r, o in zip(x, linear(m, p + "mlp.c_proj"))]
    return linear(layer_norm(x[-1:], "transformer.ln_f"), "lm_head")[0]


def case_weights():
    """--save-weights writes nanoGPT's names in PyTorch's layouts; --load-weights --steps 0 evaluates exactly the
    saving run's parameters; files of another model, dtype or --heads, and --load-weights with a state file to
    resume, are refused with one line naming the file and the tensor."""
    L, H, heads, S = 2, 16, 2, 16
    model = ["--layers", L, "--width", H, "--heads", heads, "--seq-len", S, "--batch", 4, "--warmup", 5,
             "--log-every", 5, "--eval-every", 0, "--eval-batches", 2]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        write_corpus(data)
        common = ["--data", data, *model]
        weights = os.path.join(tmp, "w.safetensors")
        a = run_json(*common, "--steps", 20, "--save-weights", weights)

        header, tensors = read_safetensors(weights)
        expected = {"transformer.wte.weight": [256, H], "transformer.wpe.weight": [S, H],
                    "transformer.ln_f.weight": [H], "transformer.ln_f.bias": [H],
                    "lm_head.weight": [256, H], "lm_head.bias": [256]}
        for l in range(L):
            p = f"transformer.h.{l}."
            expected.update({p + "ln_1.weight": [H], p + "ln_1.bias": [H], p + "attn.c_attn.weight": [3 * H, H],
                             p + "attn.c_attn.bias": [3 * H], p + "attn.c_proj.weight": [H, H],
                             p + "attn.c_proj.bias": [H], p + "ln_2.weight": [H], p + "ln_2.bias": [H],
                             p + "mlp.c_fc.weight": [4 * H, H], p + "mlp.c_fc.bias": [4 * H],
                             p + "mlp.c_proj.weight": [H, 4 * H], p + "mlp.c_proj.bias": [H]})
        shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        check(shapes == expected, f"tensors in {weights}: {sorted(shapes.items())}")
        check(all(v["dtype"] == "F32" for k, v in header.items() if k != "__metadata__"), f"dtypes: {header}")
        meta = header.get("__metadata__", {})
        check(meta.get("format") == "pt" and meta.get("layers") == str(L) and meta.get("width") == str(H) and
              meta.get("heads") == str(heads) and meta.get("seq_len") == str(S) and meta.get("vocab") == "256" and
              meta.get("steps") == "20", f"metadata: {meta}")
        check(sum(len(v) for _, v in tensors.values()) == a.get("parameters"), "not every parameter is in the file")

        # Zero steps from the loaded weights evaluate exactly as the run that saved them. Without the file the
        # same command evaluates the initialisation, which differs: the comparison sees a load that did nothing.
        prompt = ["--prompt", "The cat ", "--temperature", 0, "--sample-bytes", 6]
        b = run_json(*common, "--steps", 0, "--load-weights", weights, *prompt)
        for key in ("val_loss", "parameter_checksum", "parameters_crc32"):
            check(key in a and a.get(key) == b.get(key),
                  f"--load-weights differs in {key}: {a.get(key)} vs {b.get(key)}")
        check(b.get("steps") == 0 and b.get("train_loss") is None, f"--steps 0 trained: {b}")
        fresh = run_json(*common, "--steps", 0)
        check(fresh.get("val_loss") != a.get("val_loss"), f"the initialisation evaluates as the trained model: {fresh}")

        # The names and layouts mean what nanoGPT means by them: its forward pass on the file's tensors, in
        # double, scores the bytes the example sampled greedily from the loaded weights highest (to rounding).
        # (The JSON sample is the bytes themselves unless they are not UTF-8: a greedy sample of these weights is.)
        sample = b.get("sample", "")
        check("\ufffd" not in sample, f"the sample is not UTF-8, its bytes are lost: {sample!r}")
        context = list(b"The cat ")
        for i, byte in enumerate(sample.encode()[:6] if "\ufffd" not in sample else b""):
            logits = nanogpt_logits(tensors, L, heads, context)
            check(max(logits) - logits[byte] < 1e-4,
                  f"sample byte {i} is {byte}, but nanoGPT's forward scores {logits.index(max(logits))} higher by "
                  f"{max(logits) - logits[byte]:g}")
            context.append(byte)
        check(len(sample.encode()) == 6, f"the sample is not 6 bytes: {sample!r}")

        # Another writer's file (no metadata, another order) loads the same; training goes on from it.
        foreign = os.path.join(tmp, "foreign.safetensors")
        write_safetensors(foreign, tensors)
        c = run_json(*common, "--steps", 0, "--load-weights", foreign)
        check("val_loss" in a and c.get("val_loss") == a.get("val_loss"),
              f"a file without metadata: {c.get('val_loss')} vs {a.get('val_loss')}")
        d = run_json(*common, "--steps", 10, "--load-weights", weights)
        check(d.get("steps") == 10 and d.get("parameters_crc32") != a.get("parameters_crc32"), f"training on: {d}")

        # Refused, with one line naming the file and the tensor, before anything is trained.
        def refused(args, words, what):
            p = run(*args, expect=2)
            one_error_line(p, words, what)
            check("step " not in p.stdout, f"{what}: trained anyway: {p.stdout[-500:]!r}")

        shorter = [str(v) for v in common]
        shorter[shorter.index("--seq-len") + 1] = "8"
        refused([*shorter, "--steps", 0, "--load-weights", weights],
                [weights, '"transformer.wpe.weight"', "[16,16]", "--seq-len 16"], "another --seq-len")
        deeper = [str(v) for v in common]
        deeper[deeper.index("--layers") + 1] = "3"
        refused([*deeper, "--steps", 0, "--load-weights", weights], [weights, "transformer.h.2."], "another --layers")
        more_heads = [str(v) for v in common]
        more_heads[more_heads.index("--heads") + 1] = "4"
        refused([*more_heads, "--steps", 0, "--load-weights", weights], [weights, "2 heads", "--heads is 4"],
                "another --heads")
        doubles = os.path.join(tmp, "f64.safetensors")
        write_safetensors(doubles, tensors, {"transformer.h.1.mlp.c_fc.bias": "F64"})
        refused([*common, "--steps", 0, "--load-weights", doubles], [doubles, "transformer.h.1.mlp.c_fc.bias", "F64"],
                "an F64 tensor")
        cut = os.path.join(tmp, "cut.safetensors")
        with open(weights, "rb") as f, open(cut, "wb") as g:
            g.write(f.read()[:-4])
        refused([*common, "--steps", 0, "--load-weights", cut], [cut, "truncated"], "a truncated file")
        refused([*common, "--steps", 0, "--load-weights", os.path.join(tmp, "absent")], ["absent"], "a missing file")

        # A state file that exists holds the weights to resume from: refused beside --load-weights. A new one
        # is a fresh run from the loaded weights.
        state = os.path.join(tmp, "run.state")
        e = run_json(*common, "--steps", 10, "--load-weights", weights, "--state", state, "--stop-after", 5)
        check(e.get("steps") == 5, f"--load-weights with a new --state: {e}")
        before = open(state, "rb").read()
        refused([*common, "--steps", 10, "--load-weights", weights, "--state", state], [state, "drop --load-weights"],
                "--load-weights with a state file to resume")
        check(open(state, "rb").read() == before, "a refused run changed the state file")
        refused([*common, "--steps", 0, "--state", os.path.join(tmp, "new.state")], ["--steps 0", "--state"],
                "--steps 0 with --state")
        before = open(weights, "rb").read()
        refused([*common, "--steps", 10, "--save-weights", os.path.join(tmp, "no", "w.safetensors")],
                [os.path.join(tmp, "no", "w.safetensors")], "an unwritable --save-weights")
        check(open(weights, "rb").read() == before, "a refused run changed the weights file")
        check(sorted(os.listdir(tmp)) == ["corpus", "cut.safetensors", "f64.safetensors", "foreign.safetensors",
                                          "run.state", "w.safetensors"], f"left-over files: {os.listdir(tmp)}")


{"bad_corpus": case_bad_corpus, "fused_dropout": case_fused_dropout, "checkpoint_modes": case_checkpoint_modes,
 "estimate": case_estimate, "resume": case_resume, "json": case_json, "real_corpus": case_real_corpus,
 "weights": case_weights,
 "distributed_equals_single_process": case_distributed_equals_single_process,
 "distributed_faults": case_distributed_faults}[CASE]()
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
