"""The type stubs (python/qkv/_qkv.pyi) describe what the native module has: every
public name, every method of its classes, and every keyword of its functions."""

import ast
import inspect
from pathlib import Path

import qkv
from qkv import _qkv

STUB = Path(__file__).resolve().parents[1] / "python" / "qkv" / "_qkv.pyi"
# aliases the stub defines for its own annotations
ALIASES = {"F32", "Bools", "Ints", "Causal", "Layout", "KernelName"}


def stub_tree():
    return ast.parse(STUB.read_text())


def test_the_stub_names_exactly_the_modules_public_names():
    names = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets)
    public = {n for n in dir(_qkv) if not n.startswith("_")} | {"__version__"}
    assert names - ALIASES == public
    assert set(qkv.__all__) == public


def test_functions_and_methods_take_the_keywords_the_stub_gives():
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            check(node, getattr(_qkv, node.name))
        if isinstance(node, ast.ClassDef):
            cls = getattr(_qkv, node.name)
            for item in node.body:
                is_property = isinstance(item, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                )
                if isinstance(item, ast.FunctionDef) and is_property:
                    assert hasattr(cls, item.name), f"{node.name}.{item.name}"
                elif isinstance(item, ast.FunctionDef):
                    target = cls if item.name == "__init__" else getattr(cls, item.name)
                    check(item, target, skip_self=True)


def check(node, obj, skip_self=False):
    args = node.args
    stub = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    stub += [args.kwarg.arg] if args.kwarg else []
    real = list(inspect.signature(obj).parameters)
    if skip_self:
        stub = stub[1:]
        real = [r for r in real if r != "self"]
    assert stub == real, f"{node.name}: stub {stub} vs module {real}"
