"""Every tensor of the generation, update, critic and alignment paths is made on its model's device: a static
scan of those modules (CI has no GPU, so a tensor left on the CPU would only fail on one).

A call of a torch factory (``torch.tensor``, ``zeros``, ``ones``, ``full``, ``arange``, ``empty``, ``rand*``,
``linspace``, ``eye``, ``as_tensor``) must pass ``device=``; ``torch.from_numpy(...)`` must be moved with
``.to(...)`` in the same expression; ``autocast(...)`` must name the device (its second argument); nothing may
call ``.cuda()`` or name ``"cuda"``; and a literal ``device="cpu"`` is allowed only on a line that says why
(``# host``: a tensor built on the host on purpose, then moved)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "slea"
# the modules whose tensors must live on the model's device
MODULES = ["policy/generation.py", "policy/value.py", "trainer/critic.py", "trainer/update.py",
           "alignment/objectives.py", "algorithms/alignment.py", "algorithms/gae.py"]
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint",
             "randperm", "linspace", "eye"}


def _is_torch_call(node: ast.AST, names: set[str]) -> str | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
        return node.func.attr
    return None


def violations(source: str) -> list[str]:
    """``line: what`` for every tensor of ``source`` not made on an explicit device (module docstring)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parent: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[child] = node
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        line = lines[node.lineno - 1]
        kwargs = {k.arg: k.value for k in node.keywords}
        name = _is_torch_call(node, FACTORIES)
        if name and "device" not in kwargs:
            out.append(f"{node.lineno}: torch.{name}(...) without device=")
        dev = kwargs.get("device")
        if isinstance(dev, ast.Constant) and dev.value == "cpu" and "# host" not in line:
            out.append(f"{node.lineno}: device=\"cpu\" without a '# host' reason")
        if _is_torch_call(node, {"from_numpy"}):
            up, moved = parent.get(node), False
            while isinstance(up, (ast.Attribute, ast.Call)):  # the method chain the result goes through
                if isinstance(up, ast.Attribute) and up.attr == "to":
                    moved = True
                up = parent.get(up)
            if not moved:
                out.append(f"{node.lineno}: torch.from_numpy(...) not moved with .to(device)")
        func = node.func
        if isinstance(func, ast.Name) and func.id == "autocast" and len(node.args) < 2 and "device" not in kwargs:
            out.append(f"{node.lineno}: autocast(...) without its device")
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and not node.args:
            out.append(f"{node.lineno}: .cuda() (use the model's device)")
        if _is_torch_call(node, {"autocast"}) and node.args and isinstance(node.args[0], ast.Constant):
            out.append(f"{node.lineno}: torch.autocast({node.args[0].value!r}) hard-codes a device type")
    return sorted(out, key=lambda f: int(f.split(":")[0]))


@pytest.mark.parametrize("module", MODULES)
def test_every_tensor_of_the_module_is_made_on_an_explicit_device(module):
    assert violations((SRC / module).read_text()) == []


def test_the_scan_catches_each_kind_of_miss():
    bad = ("import torch\n"
           "a = torch.zeros(3)\n"
           "b = torch.tensor([1], device='cpu')\n"
           "c = torch.from_numpy(x).float()\n"
           "with autocast(dtype):\n"
           "    pass\n"
           "d = t.cuda()\n"
           "e = torch.autocast('cpu', dtype=torch.bfloat16)\n")
    found = violations(bad)
    assert [f.split(":")[0] for f in found] == ["2", "3", "4", "5", "7", "8"], found
    good = ("import torch\n"
            "a = torch.zeros(3, device=dev)\n"
            "b = torch.tensor([1], device='cpu')  # host: staged, then moved\n"
            "c = torch.from_numpy(x).float().to(dev)\n"
            "with autocast(dtype, dev):\n"
            "    pass\n")
    assert violations(good) == []
