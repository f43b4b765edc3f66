"""Writes tests/io/reference.safetensors and tests/io/reference.txt, the PyTorch-written file that
tests/io/safetensors_test.cpp loads (the test needs neither PyTorch nor this script at run time).

usage: /usr/bin/python3 tests/io/make_safetensors_reference.py   (needs PyTorch: Debian's python3-torch,
       which installs for the system Python)

Debian 12 packages PyTorch but not Hugging Face's safetensors library, so the file is written here from the
format's specification (the README of github.com/huggingface/safetensors) with json and struct, the way that
library's save_file writes it: the 8-byte little-endian header length, the header as compact JSON with
"__metadata__" first and the tensors sorted by dtype size (largest first) then by name, padded with spaces
to a multiple of 8 bytes, then each tensor's bytes, little-endian and row-major, in the same order.

The tensors come from PyTorch: an nn.Linear(4, 3) as PyTorch initialises it (weight [3,4] = [out,in] and
a 1-D bias [3], float32), a float64 matrix, a float64 scalar (shape []), and float32 values that are easy to
get wrong (infinities, -0, a subnormal, the largest float). reference.txt holds every value exactly (Python's
float.hex) and the layer's output for a fixed input as PyTorch computes it.

It also writes tests/io/reference_cnn.safetensors and reference_cnn.txt: the state_dict of an nn.Conv2d(2, 3,
(3, 2), padding=1) and of an nn.BatchNorm2d(3) after two training-mode forwards (so that the running statistics
and num_batches_tracked, an I64 scalar, are not their initial values), and the convolution's output for a fixed
input.
"""
import json
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {torch.float32: ("F32", "f", 4), torch.float64: ("F64", "d", 8), torch.int64: ("I64", "q", 8)}


def write_safetensors(path, tensors, metadata):
    """The file of `tensors` in the reference writer's layout (see the module's comment); returns the names in
    file order."""
    names = sorted(tensors, key=lambda n: (-DTYPES[tensors[n].dtype][2], n))
    header = {"__metadata__": metadata}
    data = b""
    for name in names:
        t = tensors[name].contiguous()
        dtype, code, size = DTYPES[t.dtype]
        values = t.flatten().tolist()
        raw = struct.pack("<%d%s" % (len(values), code), *values)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return names


def write_text(path, named, comment):
    """NAME DTYPE [SHAPE] VALUES... lines, floating-point values as float.hex."""
    with open(path, "w") as f:
        f.write(comment)
        for name, t in named:
            shape = ",".join(str(d) for d in t.shape)
            values = " ".join(float(v).hex() for v in t.flatten().tolist())
            f.write("%s %s [%s] %s\n" % (name, DTYPES[t.dtype][0], shape, values))



torch.manual_seed(44)
layer = torch.nn.Linear(4, 3)
tensors = {
    "linear.weight": layer.weight.detach(),
    "linear.bias": layer.bias.detach(),
    "double.matrix": torch.randn(2, 3, dtype=torch.float64),
    "double.scalar": torch.tensor(-2.75, dtype=torch.float64),
    "float.special": torch.tensor([float("inf"), float("-inf"), -0.0, 1e-45, 3.4028234663852886e38],
                                  dtype=torch.float32).reshape(1, 5),
}
metadata = {"format": "pt", "written_by": "tests/io/make_safetensors_reference.py"}

names = write_safetensors(os.path.join(HERE, "reference.safetensors"), tensors, metadata)

x = torch.tensor([[0.5, -1.0, 2.0, 0.25], [-3.0, 0.75, 1.5, -0.125]], dtype=torch.float32)
with torch.no_grad():
    y = layer(x)
with open(os.path.join(HERE, "reference.txt"), "w") as f:
    f.write("# Written by make_safetensors_reference.py: NAME DTYPE SHAPE VALUES..., values as float.hex (row-major).\n")
    f.write("# 'input' and 'output' are not in the file: output = torch.nn.Linear's forward of input.\n")
    for name in names + ["input", "output"]:
        t = tensors[name] if name in tensors else (x if name == "input" else y)
        shape = ",".join(str(d) for d in t.shape)
        f.write("%s %s [%s] %s\n" % (name, DTYPES[t.dtype][0], shape, " ".join(v.hex() for v in t.flatten().tolist())))
print("wrote reference.safetensors (%d tensors) and reference.txt" % len(names))

torch.manual_seed(45)
conv = torch.nn.Conv2d(2, 3, (3, 2), padding=1)
bn = torch.nn.BatchNorm2d(3)
bn.train()
with torch.no_grad():
    for _ in range(2):
        bn(conv(torch.randn(4, 2, 5, 5)))
cnn = {"conv." + k: v.detach() for k, v in conv.state_dict().items()}
cnn.update({"bn." + k: v.detach() for k, v in bn.state_dict().items()})
cnn_names = write_safetensors(os.path.join(HERE, "reference_cnn.safetensors"), cnn,
                              {"format": "pt", "written_by": "tests/io/make_safetensors_reference.py"})
x = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4) / 8 - 2
with torch.no_grad():
    y = conv(x)
write_text(os.path.join(HERE, "reference_cnn.txt"), [(n, cnn[n]) for n in cnn_names] + [("input", x), ("output", y)],
           "# Written by make_safetensors_reference.py: NAME DTYPE SHAPE VALUES..., values as float.hex (row-major).\n"
           "# 'input' and 'output' are not in the file: output = torch.nn.Conv2d's forward of input.\n")
print("wrote reference_cnn.safetensors (%d tensors) and reference_cnn.txt" % len(cnn_names))
