"""The package's shape: imports run one way (no circles, lazy imports included), no module
imports another module's private names, the attention faces hold public names only, and the
tables the attention engine states on both sides of the binding agree (the run-time parameter
record on the CPU; the CTA shapes against a compiled module on the GPU)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer.attention import plan as attention_plan
from flashinfer.attention import runtime as rt

PKG = Path(flashinfer.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()
# Modules the wheel build writes (hatch_build.py), absent from a source tree.
GENERATED = {"flashinfer._artifact_pin", "flashinfer._build_meta"}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, list[ast.alias], ast.AST]]:
    """(imported module, names, node) of every import statement, at any depth."""
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.append((_resolve(module, node), node.names, node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name, [], node))
    return out


def _edges(module: str) -> set[str]:
    """The package's modules that ``module`` imports (a name that is a submodule counts as an
    import of that submodule; a package's ``__init__`` importing its own submodules does not
    make a circle with them)."""
    out = set()
    for target, names, _ in _imports(module):
        if target == "__future__" or not target.startswith("flashinfer"):
            continue
        subs = [f"{target}.{a.name}" for a in names if f"{target}.{a.name}" in MODULES]
        out.update(subs)
        if target in MODULES and (len(subs) < len(names) or not names):
            out.add(target)
    out.discard(module)
    return out


def test_no_import_circles():
    graph = {m: _edges(m) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            # A submodule importing its own package's __init__ is how Python imports it anyway.
            if m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                circles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_names():
    found = []
    for module in MODULES:
        aliases = {}  # names bound to the package's modules in this file
        for target, names, node in _imports(module):
            if not target.startswith("flashinfer"):
                continue
            for alias in names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES or sub in GENERATED:
                    aliases[alias.asname or alias.name] = sub
                elif _private(alias.name):
                    found.append(f"{module}: from {target} import {alias.name}")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _private(node.attr)
                    and aliases[node.value.id] != module):
                found.append(f"{module}: {node.value.id}.{node.attr}")
    assert not found, "private names used across modules:\n" + "\n".join(found)


@pytest.mark.parametrize("face", ["prefill", "decode", "cascade"])
def test_attention_faces_hold_only_public_names(face):
    """``flashinfer.prefill`` / ``decode`` / ``cascade`` re-export the engine's public names
    (their import paths are the contract) and define nothing themselves."""
    tree = ast.parse(MODULES[f"flashinfer.{face}"].read_text())
    for node in tree.body:
        assert isinstance(node, (ast.ImportFrom, ast.Assign, ast.Expr)), ast.dump(node)[:80]
    module = __import__(f"flashinfer.{face}", fromlist=["__all__"])
    for name in module.__all__:
        value = getattr(module, name)
        value = getattr(value, "func", value)  # a functools.partial of an engine function
        assert value.__module__.startswith("flashinfer.attention."), name
    ops = {n for n, m in flashinfer.__dict__.get("_LAZY_NAMES", {}).items() if m == face}
    assert ops <= set(module.__all__)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_run_params_record_layout_matches_the_binding():
    """csrc/attention_utils.h's RunParam enum names the slots of runtime.RUN_PARAMS in order
    (kQoIndptr <-> "qo_indptr"), with the same version."""
    from flashinfer.jit import toolchain

    # the sources the modules compile from: the checkout's, or those an installed wheel bundles
    text = (toolchain.csrc_dir() / "attention_utils.h").read_text()
    body = re.search(r"enum RunParam : int \{(.*?)\};", text, re.S).group(1)
    names = [n.strip() for n in body.split(",") if n.strip()]
    assert names[-1] == "kNumRunParams"
    assert [_snake(n[1:]) for n in names[:-1]] == list(rt.RUN_PARAMS)
    version = re.search(r"kRunParamsVersion = (\d+);", text).group(1)
    assert int(version) == rt.RUN_PARAMS_VERSION


def test_run_params_record_holds_addresses_and_float_bits():
    t = torch.zeros(4, dtype=torch.int32)
    rec = rt.run_params(cta=3, plan=t, sm_scale=0.125, custom_mask=None, enable_pdl=True)
    assert rec.dtype == torch.int64 and rec.numel() == len(rt.RUN_PARAMS)
    slot = rt.RUN_PARAMS.index
    assert rec[0] == rt.RUN_PARAMS_VERSION and rec[1] == len(rt.RUN_PARAMS)
    assert rec[slot("cta")] == 3 and rec[slot("plan")] == t.data_ptr()
    assert rec[slot("custom_mask")] == 0 and rec[slot("enable_pdl")] == 1
    assert rec[slot("sm_scale")].view(torch.float64).item() == 0.125
    with pytest.raises(KeyError):
        rt.run_params(no_such_field=1)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,pos", [(64, "NONE"), (128, "NONE"), (128, "ROPE_LLAMA"),
                                          (256, "NONE")])
def test_cta_shapes_match_the_compiled_launch_policy(head_dim, pos):
    """plan.py's tile of each CTA shape, and which shapes a variant has (jit/attention.py's
    has_sm90, the eight-stream shape's head_dim <= 128), are what launch.cuh compiled."""
    from flashinfer.jit.attention import AttentionVariant

    variant = AttentionVariant("bfloat16", "bfloat16", head_dim, "causal", pos, False)
    module = rt.get_attention_module(variant)
    assert module.run_params_version() == rt.RUN_PARAMS_VERSION
    for cta in range(6):
        has = {3: variant.has_sm90, 5: head_dim <= 128}.get(cta, True)
        want = attention_plan.tile_rows(cta, head_dim) if has else 0
        assert module.cta_tile_q(cta) == want, (cta, head_dim, pos)
