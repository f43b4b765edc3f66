"""End-to-end tests of the MLP example (examples/mlp), registered with CTest by examples/mlp/CMakeLists.txt.

usage: mlp_test.py CASE MLP_BINARY DATA_DIR LIMIT
  CASE: corrupt_input | save_resume | save_load_weights | checkpoint_modes | accuracy
Each case exits 0 on success and prints what failed otherwise. Only the standard library is used.
"""
import filecmp
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

CASE, MLP, DATA, LIMIT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)
    return condition


def run(*args, expect=0):
    p = subprocess.run([MLP, *map(str, args)], capture_output=True, text=True)
    if p.returncode != expect:
        check(False, f"mlp {' '.join(map(str, args))}: exit code {p.returncode}, expected {expect}\n"
                     f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p


def run_json(*args):
    p = run(*args, "--json")
    lines = p.stdout.strip().splitlines()
    if not lines:
        check(False, "no output")
        return {}
    return json.loads(lines[-1])


# ---- IDX files written by the test itself ----

def images_bytes(count, rows=28, cols=28, magic=2051, pixels=None):
    header = struct.pack(">IIII", magic, count, rows, cols)
    body = pixels if pixels is not None else bytes((i * 7 + j) % 256 for i in range(count) for j in range(rows * cols))
    return header + body


def labels_bytes(count, magic=2049, labels=None):
    return struct.pack(">II", magic, count) + (labels if labels is not None else bytes(i % 10 for i in range(count)))


def write_dataset(directory, files):
    """files: prefix → raw bytes (gzip-compressed unless the name says .raw)."""
    os.makedirs(directory, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(gzip.compress(data) if isinstance(data, bytes) else data[0])


def valid_files(n=20, n_test=10):
    return {
        "train-images-idx3-ubyte.gz": images_bytes(n),
        "train-labels-idx1-ubyte.gz": labels_bytes(n),
        "t10k-images-idx3-ubyte.gz": images_bytes(n_test),
        "t10k-labels-idx1-ubyte.gz": labels_bytes(n_test),
    }


def expect_data_error(tmp, name, files, file_name, words):
    directory = os.path.join(tmp, name)
    write_dataset(directory, files)
    p = run("--data", directory, "--epochs", 1, "--batch", 4, expect=2)
    err = p.stderr.strip()
    check(len(err.splitlines()) == 1, f"{name}: expected one error line, got {err!r}")
    check(file_name in err, f"{name}: the error does not name {file_name}: {err!r}")
    for w in words:
        check(w in err, f"{name}: the error does not say {w!r}: {err!r}")
    check("Sanitizer" not in p.stderr and "terminate" not in p.stderr, f"{name}: crashed: {p.stderr}")


def case_corrupt_input():
    with tempfile.TemporaryDirectory() as tmp:
        # The synthetic files themselves are valid: one epoch trains and reports.
        write_dataset(os.path.join(tmp, "valid"), valid_files())
        d = run_json("--data", os.path.join(tmp, "valid"), "--epochs", 1, "--batch", 4, "--hidden", 8)
        check(d.get("epochs") == 1 and d.get("train_images") == 20, f"valid synthetic data: {d}")

        p = run("--data", os.path.join(tmp, "absent"), expect=2)
        check("absent/train-images-idx3-ubyte.gz: cannot open" in p.stderr, f"missing directory: {p.stderr!r}")

        f = valid_files()
        del f["t10k-labels-idx1-ubyte.gz"]
        expect_data_error(tmp, "missing_file", f, "t10k-labels-idx1-ubyte.gz", ["cannot open"])

        f = valid_files()
        f["train-images-idx3-ubyte.gz"] = images_bytes(20, magic=2049)
        expect_data_error(tmp, "image_magic", f, "train-images-idx3-ubyte.gz", ["bad magic number 2049", "2051"])

        f = valid_files()
        f["train-labels-idx1-ubyte.gz"] = labels_bytes(20, magic=2051)
        expect_data_error(tmp, "label_magic", f, "train-labels-idx1-ubyte.gz", ["bad magic number 2051", "2049"])

        f = valid_files()
        f["train-images-idx3-ubyte.gz"] = images_bytes(20)[:16 + 20 * 784 - 5]
        expect_data_error(tmp, "truncated_pixels", f, "train-images-idx3-ubyte.gz", ["truncated"])

        f = valid_files()
        f["train-images-idx3-ubyte.gz"] = images_bytes(20)[:10]
        expect_data_error(tmp, "truncated_header", f, "train-images-idx3-ubyte.gz", ["truncated", "header"])

        f = valid_files()
        f["train-labels-idx1-ubyte.gz"] = labels_bytes(20) + b"\0\0\0"
        expect_data_error(tmp, "trailing_bytes", f, "train-labels-idx1-ubyte.gz", ["length mismatch"])

        f = valid_files()
        f["train-images-idx3-ubyte.gz"] = images_bytes(20, rows=0)[:16]
        expect_data_error(tmp, "zero_rows", f, "train-images-idx3-ubyte.gz", ["implausible image size"])

        f = valid_files()
        f["train-images-idx3-ubyte.gz"] = struct.pack(">IIII", 2051, 4000000000, 28, 28)
        expect_data_error(tmp, "huge_count", f, "train-images-idx3-ubyte.gz", ["implausible image count"])

        f = valid_files()
        f["train-labels-idx1-ubyte.gz"] = labels_bytes(20, labels=bytes([3] * 19 + [12]))
        expect_data_error(tmp, "label_range", f, "train-labels-idx1-ubyte.gz", ["label 12 at index 19", "0..9"])

        f = valid_files()
        f["train-labels-idx1-ubyte.gz"] = labels_bytes(19)
        expect_data_error(tmp, "count_mismatch", f, "train-labels-idx1-ubyte.gz", ["19 labels", "20 images"])

        f = valid_files()
        f["t10k-images-idx3-ubyte.gz"] = images_bytes(10, rows=14, cols=56)
        expect_data_error(tmp, "test_size", f, "t10k-images-idx3-ubyte.gz", ["14x56", "28x28"])

        # Compressed stream cut short: zlib reports an unexpected end of file.
        f = valid_files()
        packed = gzip.compress(images_bytes(20))
        f["train-images-idx3-ubyte.gz"] = (packed[: len(packed) // 2],)
        expect_data_error(tmp, "truncated_gzip", f, "train-images-idx3-ubyte.gz", ["truncated"])

        # Cut inside the 8-byte CRC-32 and length trailer: the data is all there, but unchecked, so truncated.
        f = valid_files()
        packed = gzip.compress(images_bytes(100))
        f["train-images-idx3-ubyte.gz"] = (packed[:-3],)
        expect_data_error(tmp, "truncated_trailer", f, "train-images-idx3-ubyte.gz", ["truncated", "trailer"])

        # Damaged deflate data or trailer: the CRC-32 check (or the inflater) fails.
        f = valid_files()
        damaged = bytearray(gzip.compress(images_bytes(20)))
        damaged[-6] ^= 0xFF  # inside the trailer's CRC-32
        f["train-images-idx3-ubyte.gz"] = (bytes(damaged),)
        expect_data_error(tmp, "bad_crc", f, "train-images-idx3-ubyte.gz", ["corrupt"])

        f = valid_files()
        damaged = bytearray(gzip.compress(images_bytes(20)))
        for i in range(20, 40):
            damaged[i] ^= 0x5A
        f["train-images-idx3-ubyte.gz"] = (bytes(damaged),)
        expect_data_error(tmp, "bad_deflate", f, "train-images-idx3-ubyte.gz", ["corrupt"])

        # --save-weights writes a safetensors file; --load-weights refuses a damaged one, or one of another
        # network, with one line naming the file (and the tensor), before training.
        weights = os.path.join(tmp, "weights.safetensors")
        run_json("--data", os.path.join(tmp, "valid"), "--epochs", 1, "--batch", 4, "--hidden", 8,
                 "--save-weights", weights)
        good = open(weights, "rb").read()
        for name, data, words in (("cut.safetensors", good[:-5], ["truncated"]),
                                  ("header.safetensors", good[:8] + b"[" + good[9:], ["begin with '{'"]),
                                  ("length.safetensors", b"\xff" * 8 + good[8:], ["header length"])):
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            p = run("--data", os.path.join(tmp, "valid"), "--epochs", 1, "--batch", 4, "--hidden", 8,
                    "--load-weights", path, expect=2)
            err = p.stderr.strip()
            check(len(err.splitlines()) == 1 and path in err and all(w in err for w in words),
                  f"--load-weights {name}: {err!r}")
            check("Sanitizer" not in p.stderr, f"--load-weights {name}: {p.stderr}")
        p = run("--data", os.path.join(tmp, "valid"), "--epochs", 1, "--batch", 4, "--hidden", 16,
                "--load-weights", weights, expect=2)
        check("layers.0.weight" in p.stderr and "[8,784]" in p.stderr and "[784,16]" in p.stderr,
              f"--load-weights into another --hidden: {p.stderr!r}")

        # The command line: --help succeeds, a bad value is a usage error (exit 2).
        check("--checkpoint" in run("--help").stdout, "--help does not list --checkpoint")
        run("--checkpoint", "everything", expect=2)
        run("--activation", "swish", expect=2)


def state_files_in(directory):
    return sorted(os.listdir(directory))


def case_save_resume():
    common = ["--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--dropout", "0.1", "--batch", 100]
    with tempfile.TemporaryDirectory() as tmp:
        whole = os.path.join(tmp, "whole.state")
        part = os.path.join(tmp, "part.state")
        a = run_json(*common, "--epochs", 3, "--save", whole)
        # The same run interrupted after its first epoch (--stop-after), then resumed from its file: the
        # settings (seed, dropout, batch, schedule, epochs) come from the file.
        b1 = run_json(*common, "--epochs", 3, "--stop-after", 1, "--save", part)
        check(b1.get("epochs") == 1 and b1.get("losses") == a.get("losses", [])[:1], f"first part: {b1}")
        b = run_json("--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--resume", part, "--save", part)
        for key in ("epochs", "losses", "train_accuracies", "test_accuracies", "test_accuracy", "parameters_crc32",
                    "dropout", "batch", "schedule"):
            check(key in a and a.get(key) == b.get(key), f"resume differs in {key}: {a.get(key)} vs {b.get(key)}")
        check(state_files_in(tmp) == ["part.state", "whole.state"], f"left-over files: {state_files_in(tmp)}")

        # A flag that contradicts the file is refused before anything is written.
        before = open(part, "rb").read()
        p = run("--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--resume", part, "--save", part, "--epochs", 4,
                "--batch", 50, expect=2)
        check("--batch" in p.stderr, f"conflicting --batch: {p.stderr!r}")
        p = run("--data", DATA, "--limit", LIMIT, "--hidden", "64,64", "--resume", part, "--save", part, "--epochs", 4,
                expect=2)
        check("check --hidden" in p.stderr, f"other --hidden: {p.stderr!r}")
        check(open(part, "rb").read() == before, "a refused resume changed the file")

        def damaged(name, mutate, words):
            path = os.path.join(tmp, name)
            data = bytearray(before)
            data = mutate(data)
            with open(path, "wb") as f:
                f.write(data)
            p = run("--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--resume", path, "--save", path,
                    "--epochs", 4, expect=2)
            err = p.stderr.strip()
            check(len(err.splitlines()) == 1 and name in err, f"{name}: one line naming the file expected: {err!r}")
            for w in words:
                check(w in err, f"{name}: the error does not say {w!r}: {err!r}")
            check(open(path, "rb").read() == bytes(data), f"{name}: the rejected file was overwritten")
            os.remove(path)

        def flip(offset):
            def f(d):
                d[offset] ^= 0x01
                return d
            return f

        damaged("truncated.state", lambda d: d[: len(d) - 7], ["truncated"])
        damaged("header_only.state", lambda d: d[:10], ["truncated"])
        damaged("extended.state", lambda d: d + b"x", ["length mismatch"])
        damaged("altered.state", flip(len(before) // 2), ["checksum mismatch"])
        damaged("altered_last.state", flip(len(before) - 1), ["checksum mismatch"])
        damaged("magic.state", flip(0), ["bad magic"])
        damaged("version.state", flip(8), ["version"])
        damaged("empty.state", lambda d: bytearray(), ["truncated"])
        p = run("--data", DATA, "--resume", os.path.join(tmp, "none.state"), expect=2)
        check("none.state: cannot open" in p.stderr, f"missing state file: {p.stderr!r}")
        # --save into a directory that does not exist fails cleanly before the first epoch.
        p = run("--data", DATA, "--limit", LIMIT, "--hidden", "8", "--epochs", 1, "--save",
                os.path.join(tmp, "no", "such.state"), expect=2)
        check("cannot create a temporary file" in p.stderr and "epoch  1/" not in p.stdout, f"unwritable --save: {p.stderr!r}")


def read_safetensors_header(path):
    """The JSON header of a safetensors file, read by the format's rules without remat."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    check(n % 8 == 0 and data[8:8 + n].rstrip(b" ").endswith(b"}"), f"{path}: header not padded to 8 bytes")
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    check(8 + n + end == len(data), f"{path}: the tensors do not end at the end of the file")
    return header


def case_save_load_weights():
    common = ["--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--batch", 100]
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "weights.safetensors")
        state = os.path.join(tmp, "run.state")
        a = run_json(*common, "--epochs", 1, "--save-weights", weights, "--save", state)
        # PyTorch's names and layout of nn.Linear layers in a ModuleList `layers`: weight [out,in], bias [out].
        header = read_safetensors_header(weights)
        expected = {"layers.0.weight": [64, 784], "layers.0.bias": [64], "layers.1.weight": [32, 64],
                    "layers.1.bias": [32], "layers.2.weight": [10, 32], "layers.2.bias": [10]}
        shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        check(shapes == expected, f"tensors in {weights}: {shapes}")
        check(all(v["dtype"] == "F32" for k, v in header.items() if k != "__metadata__"), f"dtypes: {header}")
        meta = header.get("__metadata__", {})
        check(meta.get("format") == "pt" and meta.get("epochs") == "1", f"metadata: {meta}")

        # The loaded weights evaluate exactly as the run that saved them.
        b = run_json(*common, "--epochs", 0, "--load-weights", weights)
        for key in ("test_accuracy", "parameters_crc32"):
            check(key in a and a.get(key) == b.get(key), f"--load-weights differs in {key}: {a.get(key)} vs {b.get(key)}")
        # Training goes on from them (a fresh optimizer), and --resume of the same run's state still works.
        c = run_json(*common, "--epochs", 1, "--load-weights", weights)
        check(c.get("epochs") == 1 and c.get("parameters_crc32") != a.get("parameters_crc32"), f"training on: {c}")
        d = run_json("--data", DATA, "--limit", LIMIT, "--hidden", "64,32", "--epochs", 2, "--resume", state)
        check(d.get("epochs") == 2, f"--resume next to --save-weights: {d}")

        before = open(weights, "rb").read()
        p = run(*common, "--epochs", 1, "--load-weights", weights, "--resume", state, expect=2)
        check("drop --load-weights" in p.stderr, f"--load-weights with --resume: {p.stderr!r}")
        p = run("--data", DATA, "--limit", LIMIT, "--hidden", "64,16", "--epochs", 0, "--load-weights", weights,
                expect=2)
        check(weights in p.stderr and "layers.1.weight" in p.stderr, f"--load-weights into 64,16: {p.stderr!r}")
        p = run(*common, "--epochs", 1, "--save-weights", os.path.join(tmp, "no", "w.safetensors"), expect=2)
        check("cannot create a temporary file" in p.stderr and "epoch  1/" not in p.stdout,
              f"unwritable --save-weights: {p.stderr!r}")
        check(open(weights, "rb").read() == before, "a refused run changed the weights file")
        check(sorted(os.listdir(tmp)) == ["run.state", "weights.safetensors"], f"left-over files: {os.listdir(tmp)}")


def case_checkpoint_modes():
    hidden = [48, 40, 32, 24]
    batch = 100
    limit = LIMIT - LIMIT % batch
    runs = {}
    for mode in ("none", "layer", "sqrt", "dots", "sign", "bf16", "int8"):
        runs[mode] = run_json("--data", DATA, "--limit", limit, "--hidden", ",".join(map(str, hidden)),
                              "--dropout", "0.25", "--batch", batch, "--epochs", 2, "--checkpoint", mode)
    for mode in ("layer", "sqrt", "dots", "sign"):
        for key in ("losses", "train_accuracies", "test_accuracies", "parameters_crc32"):
            check(key in runs["none"] and runs[mode].get(key) == runs["none"].get(key),
                  f"{mode} differs from none in {key}: {runs[mode].get(key)} vs {runs['none'].get(key)}")
    # Lossy residuals move the parameters (the gradients differ by about the format's step) but not the first loss.
    for mode in ("bf16", "int8"):
        check(runs[mode].get("parameters_crc32") != runs["none"].get("parameters_crc32"), f"{mode} changed nothing")
        check(runs[mode]["losses"][0] == runs["none"]["losses"][0] or
              abs(runs[mode]["losses"][0] - runs["none"]["losses"][0]) < 0.05 * runs["none"]["losses"][0],
              f"{mode}: first epoch's loss {runs[mode]['losses'][0]} vs {runs['none']['losses'][0]}")
    # Saved bytes right after the forward pass, as docs/mlp.md derives them (float32, 4 bytes):
    # the input x [B,784] and the softmax [B,10] always; per hidden layer i the activation output r_i
    # (relu's backward reads it) and the dropout output d_i (the next linear's input).
    B = batch
    x, softmax = 4 * B * 784, 4 * B * 10
    act = [4 * B * w for w in hidden]
    expected = {
        "none": x + sum(2 * a for a in act) + softmax,
        # each hidden layer a region saving nothing: only the region outputs d_i stay
        "layer": x + sum(act) + softmax,
        # dots_saveable keeps each linear output z_i, because the replay of relu (whose backward reads its
        # output) recomputes from it (JAX's partial evaluation): z_i instead of r_i, so as many bytes as none
        "dots": x + sum(2 * a for a in act) + softmax,
    }
    # The whole network one region, its residuals compressed (docs/compression.md). sign: each r_i in one bit,
    # ceil(B·w / 64) words of 8 bytes (only relu's backward reads it: dropout's reads its seed), d_i as it is.
    # bf16: r_i and d_i in 2 bytes an element. int8 with a scale per 64 consecutive elements: a byte an element
    # (B·w is a multiple of 4) and 4 bytes for each of the ceil(B·w / 64) groups, which run across the rows (every
    # w here is under 64). Both keep r_i's exact sign beside it for relu's backward, as sign does.
    masks = sum((B * w + 63) // 64 * 8 for w in hidden)
    expected["sign"] = x + sum(act) + masks + softmax
    expected["bf16"] = x + sum(act) + masks + softmax
    expected["int8"] = x + sum(2 * (B * w + 4 * ((B * w + 63) // 64)) for w in hidden) + masks + softmax
    # sqrt: L = 5 layers (4 hidden + output), round(sqrt(5)) = 2 segments of ceil(5/2) = 3, both regions:
    # layers 1-3 (keeps x, returns d_3) and layer 4 + the output layer (returns the logits, which the
    # loss does not read: cross_entropy keeps its softmax instead).
    expected["sqrt"] = x + act[2] + softmax
    for mode, value in expected.items():
        check(runs[mode].get("saved_bytes_per_step") == value,
              f"{mode}: saved_bytes_per_step {runs[mode].get('saved_bytes_per_step')}, expected {value}")
    # --estimate counts the same step from shapes alone, without the data (a directory that does not exist):
    # its saved and peak bytes equal the training run's, exactly, and it prints them in MB and in bytes.
    for mode in runs:
        args = ["--data", "/nonexistent", "--hidden", ",".join(map(str, hidden)), "--dropout", "0.25", "--batch", batch,
                "--checkpoint", mode, "--estimate"]
        p = run(*args)
        for key, label in (("saved_bytes_per_step", "saved after the forward pass"),
                           ("peak_bytes_per_step", "peak of forward + backward")):
            value = runs[mode].get(key, -1)
            # "<label>: <MB> MB (<bytes> bytes)", the columns aligned with spaces
            line = re.compile(re.escape(f"{label}:") + " +" +
                              re.escape(f"{value / 1e6:.2f} MB ({value} bytes)"))
            check(line.search(p.stdout), f"--estimate --checkpoint {mode}: no line {line.pattern!r} in {p.stdout!r}")
        e = run_json(*args)
        check(e.get("estimate") is True, f"--estimate --json: {e}")
        for key in ("saved_bytes_per_step", "peak_bytes_per_step"):
            check(key in e and e.get(key) == runs[mode].get(key),
                  f"--estimate --checkpoint {mode}: {key} {e.get(key)}, the training run's {runs[mode].get(key)}")
    run("--estimate", "--resume", "x.state", expect=2)


def case_accuracy():
    d = run_json("--data", DATA, "--epochs", 1, "--limit", LIMIT)
    print(f"1 epoch on {LIMIT} images: test accuracy {d.get('test_accuracy')}")
    check(d.get("test_accuracy", 0) >= 0.80, f"test accuracy {d.get('test_accuracy')} < 0.80")


{"corrupt_input": case_corrupt_input, "save_resume": case_save_resume, "save_load_weights": case_save_load_weights,
 "checkpoint_modes": case_checkpoint_modes, "accuracy": case_accuracy}[CASE]()
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
