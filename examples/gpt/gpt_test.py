"""End-to-end tests of the GPT example (examples/gpt), registered with CTest by examples/gpt/CMakeLists.txt.

usage: gpt_test.py CASE GPT_BINARY
  CASE: bad_corpus | fused_dropout | checkpoint_modes | resume | json | real_corpus
Each case exits 0 on success and prints what failed otherwise. The cases train a tiny model for a few
steps on a corpus the test writes (so they do not need the fortunes package) and take well under a
second each in the optimised build; real_corpus uses /usr/share/games/fortunes and skips if it is absent.
Only the standard library is used.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

CASE, GPT = sys.argv[1], sys.argv[2]
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


def run(*args, expect=0):
    p = subprocess.run([GPT, *map(str, args)], capture_output=True)
    p.stdout, p.stderr = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode != expect:
        check(False, f"gpt {' '.join(map(str, args))}: exit code {p.returncode}, expected {expect}\n"
                     f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p


def run_json(*args):
    p = run(*args, "--json")
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
            # Every mode but none holds fewer residuals (selective with fused attention: a region holding
            # only the fused op drops nothing).
            for m in MODES[1:]:
                if attention == "fused" and m == "attention":
                    check(runs[m].get("saved_bytes") == runs["none"].get("saved_bytes"), f"fused {m}: saved bytes")
                else:
                    check(runs[m].get("saved_bytes", 1e18) < runs["none"].get("saved_bytes", 0),
                          f"{attention}, dropout {dropout}, {m}: saved {runs[m].get('saved_bytes')} bytes, "
                          f"not below none's {runs['none'].get('saved_bytes')}")
            results[(attention, dropout)] = runs["none"]
        # Fused attention computes the softmax from a log-sum-exp, so it agrees with unfused to rounding
        # only, not bitwise (docs/gpt.md §Training).
        a, b = results[("unfused", 0)], results[("fused", 0)]
        rel = abs(a.get("parameter_checksum", 0) - b.get("parameter_checksum", 1)) / abs(a.get("parameter_checksum", 1))
        check(rel < 1e-4, f"fused and unfused checksums differ by {rel:g} (relative)")


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


{"bad_corpus": case_bad_corpus, "fused_dropout": case_fused_dropout, "checkpoint_modes": case_checkpoint_modes,
 "resume": case_resume, "json": case_json, "real_corpus": case_real_corpus}[CASE]()
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
