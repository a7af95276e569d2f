"""The _core.pyi stub lists exactly the compiled module's public API, with the same parameter names."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import nexus_native
import pytest
from nexus_native import _core

STUB = Path(nexus_native.__file__).with_name("_core.pyi")


def stub_tree() -> ast.Module:
    assert STUB.exists(), "the _core.pyi stub is not installed with the package"
    return ast.parse(STUB.read_text())


def public(names):
    return {
        n for n in names if not n.startswith("_") or n in {"__init__", "__len__", "__contains__", "__eq__"}
    }


def stub_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def runtime_params(obj) -> list[str]:
    """Parameter names from pybind11's signature line (first line of the docstring)."""
    doc = (obj.__doc__ or "").strip().splitlines()[0]
    m = re.match(r"^\w+\((.*)\)\s*->", doc)
    assert m, f"no signature in docstring of {obj!r}: {doc!r}"
    names = []
    depth, cur = 0, ""
    for ch in m.group(1) + ",":
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            part = cur.strip()
            cur = ""
            if part and part != "*":
                names.append(part.split(":")[0].strip())
            elif part == "*":
                names.append("*")
            continue
        cur += ch
    return [n for n in names if n not in ("self", "arg0")]


def stub_params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.kwonlyargs:
        names += ["*"] + [x.arg for x in a.kwonlyargs]
    return [n for n in names if n != "self"]


def test_module_level_names_match():
    tree = stub_tree()
    stub_names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            stub_names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub_names.add(node.target.id)
    runtime = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    assert stub_names == runtime


def test_functions_have_the_same_parameter_names():
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == runtime_params(getattr(_core, node.name)), node.name


CLASSES = [n.name for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef)]


@pytest.mark.parametrize("name", CLASSES)
def test_class_members_and_signatures_match(name):
    cls_node = next(n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name == name)
    cls = getattr(_core, name)
    if issubclass(cls, BaseException):
        assert [ast.unparse(b) for b in cls_node.bases] == [cls.__mro__[1].__name__]
        return
    members = stub_members(cls_node)
    if isinstance(cls, type) and hasattr(cls, "__members__"):  # pybind enums
        values = {k: v.value for k, v in cls.__members__.items()}
        stub_values = {k: ast.literal_eval(v.value) for k, v in members.items() if isinstance(v, ast.Assign)}
        assert stub_values == values
        return
    runtime = public(
        n
        for n in dir(cls)
        if not (n.startswith("__") and n not in {"__init__", "__len__", "__contains__", "__eq__"})
    )
    runtime -= {"__eq__"} if "__eq__" not in members else set()
    assert set(members) == runtime, name
    for mname, node in members.items():
        attr = inspect.getattr_static(cls, mname)
        if isinstance(node, ast.FunctionDef) and not any(
            isinstance(d, ast.Attribute) and d.attr == "setter" for d in node.decorator_list
        ):
            is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
            assert is_prop == isinstance(attr, property), f"{name}.{mname}: property-ness differs"
            if not is_prop:
                fn = attr.__func__ if isinstance(attr, staticmethod) else getattr(cls, mname)
                is_static = any(
                    isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list
                )
                assert is_static == isinstance(attr, staticmethod), (
                    f"{name}.{mname}: staticmethod-ness differs"
                )
                assert stub_params(node) == runtime_params(fn), f"{name}.{mname}"


def test_every_binding_has_a_docstring_beyond_its_signature():
    def doc_ok(obj) -> bool:
        lines = [ln for ln in (obj.__doc__ or "").splitlines() if ln.strip()]
        return len(lines) >= 2

    for n in dir(_core):
        obj = getattr(_core, n)
        if callable(obj) and not isinstance(obj, type) and not n.startswith("_"):
            assert doc_ok(obj), n
    for cname in ("Int8Index", "ModelSpec", "AtbBlock", "BuddyAllocator", "RadixArena"):
        cls = getattr(_core, cname)
        assert cls.__doc__, cname
        for n, attr in vars(cls).items():
            if n.startswith("_") and n not in {"__init__", "__len__", "__contains__", "__eq__"}:
                continue
            if isinstance(attr, property):
                assert attr.__doc__, f"{cname}.{n}"
            elif callable(attr) or isinstance(attr, staticmethod):
                assert doc_ok(getattr(cls, n)), f"{cname}.{n}"
