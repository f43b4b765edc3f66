#!/usr/bin/env python3
"""End-to-end tests of the ResNet example (examples/resnet), run by ctest:

  resnet_test.py checkpoint_modes <resnet binary> <data dir>
      one short epoch (512 images, batch 64) under --checkpoint none, block, dots, sqrt and a budget: the final
      losses are the same text (bitwise the same doubles), and the saved bytes fall from none to dots to block
  resnet_test.py estimate <resnet binary> <data dir>
      --estimate's saved and peak bytes (shapes only, no data) equal those of a real step, for none and block
"""
import json
import subprocess
import sys

SMALL = ["--limit", "512", "--batch", "64", "--epochs", "1", "--width", "8", "--threads", "2", "--json"]


def run(binary, data, *flags):
    out = subprocess.run([binary, "--data", data, *flags], check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def checkpoint_modes(binary, data):
    results = {m: run(binary, data, *SMALL, "--checkpoint", m) for m in ["none", "block", "dots", "sqrt"]}
    peak = results["none"]["peak_bytes"]
    results["budget"] = run(binary, data, *SMALL, "--checkpoint", f"budget={peak * 7 // 10}")
    losses = {m: r["final_loss"] for m, r in results.items()}
    assert len(set(losses.values())) == 1, f"losses differ between checkpoint modes: {losses}"
    saved = {m: r["saved_bytes"] for m, r in results.items()}
    assert saved["block"] < saved["dots"] < saved["none"], f"saved bytes not ordered: {saved}"
    assert results["budget"]["peak_bytes"] <= peak * 7 // 10, results["budget"]
    print("checkpoint modes: same loss", losses["none"], "saved", saved)


def estimate(binary, data):
    for mode in ["none", "block"]:
        e = run(binary, data, "--estimate", "--batch", "64", "--width", "8", "--json", "--checkpoint", mode)
        r = run(binary, data, *SMALL, "--checkpoint", mode)
        assert (e["saved_bytes"], e["peak_bytes"]) == (r["saved_bytes"], r["peak_bytes"]), (mode, e, r)
        print(mode, "estimate equals the run:", e["saved_bytes"], e["peak_bytes"])


if __name__ == "__main__":
    case, binary, data = sys.argv[1:4]
    {"checkpoint_modes": checkpoint_modes, "estimate": estimate}[case](binary, data)
