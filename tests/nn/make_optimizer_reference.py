#!/usr/bin/python3
"""Prints the reference values of tests/nn/optimizer_test.cpp: the parameter after 3 steps of torch.optim
optimizers, in double, from a fixed start and fixed gradients (the same as the test's `start()` and
`gradients()`), as C++ initializer lists with 17 significant digits.

Run with Debian's PyTorch 1.13:  /usr/bin/python3 tests/nn/make_optimizer_reference.py
and paste the output into the test.
"""
import torch

START = [[0.5, -1.25, 2.0], [0.0, 3.0, -0.75]]
GRADIENTS = [
    [[0.1, -2.0, 0.5], [1e-3, 0.0, -0.3]],
    [[-0.4, 1.5, 0.25], [2e-3, -1.0, 0.7]],
    [[0.3, 0.5, -1.0], [-5e-3, 2.0, 0.0]],
]

CASES = [
    ("adam", torch.optim.Adam, dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6)),
    ("adamw_default", torch.optim.AdamW, {}),
    ("adamw", torch.optim.AdamW, dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.5)),
    ("adamw_no_decay", torch.optim.AdamW, dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0)),
    ("sgd", torch.optim.SGD, dict(lr=0.1)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.05)),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.05, nesterov=True)),
]


def main():
    print(f"// torch {torch.__version__}: tests/nn/make_optimizer_reference.py")
    for name, optimizer_class, options in CASES:
        theta = torch.tensor(START, dtype=torch.float64, requires_grad=True)
        optimizer = optimizer_class([theta], **options)
        for g in GRADIENTS:
            optimizer.zero_grad()
            theta.grad = torch.tensor(g, dtype=torch.float64)
            optimizer.step()
        values = ", ".join(f"{x:.17g}" for x in theta.detach().flatten().tolist())
        print(f"const std::vector<double> torch_{name} = {{{values}}};")


if __name__ == "__main__":
    main()
