#!/usr/bin/env python3
"""End-to-end tests of the ResNet example (examples/resnet), run by ctest:

  resnet_test.py checkpoint_modes <resnet binary> <data dir>
      one short epoch (512 images, batch 64) under --checkpoint none, block, dots, sqrt and a budget: the final
      losses are the same text (bitwise the same doubles), the saved bytes fall from none to dots to block, and
      dots saves exactly docs/resnet.md's formula; then bf16 and int8 (compressed residuals) save fewer bytes than
      none, int8 fewest, with a final loss that differs from the exact one by under 5 %
  resnet_test.py estimate <resnet binary> <data dir>
      --estimate's saved and peak bytes (shapes only, no data) equal those of a real step, for none, block and int8
  resnet_test.py save_load <resnet binary> <data dir>
      a short training run (2,048 images) with --save, then --load with --epochs 0: the same test accuracy (and
      not the untrained model's); the file holds PyTorch's state_dict names and shapes (conv.weight [8,1,3,3],
      bn.running_var [8], fc.weight [10,32])
"""
import os
import struct
import tempfile
import json
import subprocess
import sys

# Every case evaluates on the first 1,000 test images (--test-limit): all 10,000 took most of each short run's time.
SMALL = ["--limit", "512", "--test-limit", "1000", "--batch", "64", "--epochs", "1", "--width", "8", "--threads", "2",
         "--json"]


def run(binary, data, *flags):
    out = subprocess.run([binary, "--data", data, *flags], check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def dots_saved_bytes(batch, width, blocks):
    """docs/resnet.md's formula for --checkpoint dots: the images, 2.5 + 5.25·blocks stage-1 feature maps, the
    linear layer's input, the loss's softmax and the stem batch norm's statistics, in float32 bytes."""
    s1 = 4 * batch * width * 28 * 28
    return 4 * batch * 784 + (10 + 21 * blocks) * s1 // 4 + 4 * batch * (4 * width + 10) + 8 * width


def checkpoint_modes(binary, data):
    results = {m: run(binary, data, *SMALL, "--checkpoint", m) for m in ["none", "block", "dots", "sqrt"]}
    peak = results["none"]["peak_bytes"]
    results["budget"] = run(binary, data, *SMALL, "--checkpoint", f"budget={peak * 7 // 10}")
    losses = {m: r["final_loss"] for m, r in results.items()}
    assert len(set(losses.values())) == 1, f"losses differ between checkpoint modes: {losses}"
    saved = {m: r["saved_bytes"] for m, r in results.items()}
    assert saved["block"] < saved["dots"] < saved["none"], f"saved bytes not ordered: {saved}"
    assert saved["dots"] == dots_saved_bytes(64, 8, 2), (saved["dots"], dots_saved_bytes(64, 8, 2))
    assert results["budget"]["peak_bytes"] <= peak * 7 // 10, results["budget"]
    print("checkpoint modes: same loss", losses["none"], "saved", saved)
    # Compressed residuals (docs/compression.md): fewer bytes saved, the loss within a few % of the exact one.
    for m in ["bf16", "int8"]:
        results[m] = run(binary, data, *SMALL, "--checkpoint", m)
    saved = {m: r["saved_bytes"] for m, r in results.items()}
    assert saved["int8"] < saved["bf16"] < saved["none"], f"compressed saved bytes not ordered: {saved}"
    for m in ["bf16", "int8"]:
        loss = results[m]["final_loss"]
        assert loss != losses["none"] and abs(loss - losses["none"]) < 0.05 * losses["none"], (m, loss, losses["none"])
    print("compressed: saved", saved["bf16"], saved["int8"], "losses", results["bf16"]["final_loss"],
          results["int8"]["final_loss"])


def estimate(binary, data):
    for mode in ["none", "block", "int8"]:
        e = run(binary, data, "--estimate", "--batch", "64", "--width", "8", "--json", "--checkpoint", mode)
        r = run(binary, data, *SMALL, "--checkpoint", mode)
        assert (e["saved_bytes"], e["peak_bytes"]) == (r["saved_bytes"], r["peak_bytes"]), (mode, e, r)
        print(mode, "estimate equals the run:", e["saved_bytes"], e["peak_bytes"])


def safetensors_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def save_load(binary, data):
    flags = ["--limit", "2048", "--test-limit", "1000", "--batch", "64", "--width", "8", "--threads", "2",
             "--json"]  # above chance
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet.safetensors")
        trained = run(binary, data, *flags, "--epochs", "1", "--save", path)
        h = safetensors_header(path)
        shapes = {"conv.weight": [8, 1, 3, 3], "bn.running_var": [8], "blocks.2.shortcut.0.weight": [16, 8, 1, 1],
                  "fc.weight": [10, 32], "fc.bias": [10]}
        for name, shape in shapes.items():
            assert h[name]["shape"] == shape, (name, h.get(name))
        # PyTorch's num_batches_tracked, I64 []: one count per training step (2048 / 64 = 32), none for evaluation.
        counter = h["blocks.1.bn2.num_batches_tracked"]
        assert (counter["dtype"], counter["shape"]) == ("I64", []), counter
        with open(path, "rb") as f:
            header_bytes = struct.unpack("<Q", f.read(8))[0]
            f.seek(8 + header_bytes + counter["data_offsets"][0])
            assert struct.unpack("<q", f.read(8))[0] == 32, "num_batches_tracked after 32 steps"
        loaded = run(binary, data, *flags, "--epochs", "0", "--load", path)
        initial = run(binary, data, *flags, "--epochs", "0")
        assert loaded["test_accuracy"] == trained["test_accuracy"] != initial["test_accuracy"], (trained, loaded, initial)
        print("save and load: test accuracy", trained["test_accuracy"], "from", len(h) - 1, "tensors; untrained",
              initial["test_accuracy"])


if __name__ == "__main__":
    case, binary, data = sys.argv[1:4]
    {"checkpoint_modes": checkpoint_modes, "estimate": estimate, "save_load": save_load}[case](binary, data)
