"""End-to-end tests of the GPT example (examples/gpt), registered with CTest by examples/gpt/CMakeLists.txt.

usage: gpt_test.py CASE GPT_BINARY [MPIEXEC]
  CASE: bad_corpus | fused_dropout | checkpoint_modes | estimate | resume | json | real_corpus
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


{"bad_corpus": case_bad_corpus, "fused_dropout": case_fused_dropout, "checkpoint_modes": case_checkpoint_modes,
 "estimate": case_estimate, "resume": case_resume, "json": case_json, "real_corpus": case_real_corpus,
 "distributed_equals_single_process": case_distributed_equals_single_process,
 "distributed_faults": case_distributed_faults}[CASE]()
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
