"""Exercise every trace template and regenerate tests/trace/fi_trace_out/ (committed).

    python tests/trace/example.py            # rewrite fi_trace_out/
    python tests/trace/example.py --check    # exit 1 if fi_trace_out/ is stale

Each template's example call is described on CPU tensors: ``.fi_trace`` runs no kernel. Ops whose
module is not there yet (flashinfer.sampling, flashinfer.topk before they merge) are described
straight from their template with the example's arguments bound to the template's inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "fi_trace_out"
MODULES = {"sampling": "flashinfer.sampling", "topk": "flashinfer.topk"}


def op_of(qualname: str):
    """The public op (function or method) named ``qualname``, or None where it is missing."""
    import flashinfer

    head, _, attr = qualname.partition(".")
    try:
        obj = getattr(flashinfer, head)
    except AttributeError:
        return None
    return getattr(obj, attr) if attr else obj


def describe_all() -> dict:
    from flashinfer.fi_trace import describe
    from flashinfer.trace_templates import TEMPLATES

    out = {}
    for qualname, template in sorted(TEMPLATES.items()):
        if template.example is None:
            continue
        args, kwargs = template.example("cpu")
        op = op_of(qualname)
        if op is not None and hasattr(op, "fi_trace"):
            desc = op.fi_trace(*args, **kwargs)
        else:
            module = MODULES["topk" if template.op_type == "topk" else "sampling"]
            named = dict(zip(template.inputs, args), **kwargs)
            desc = describe(template, qualname, module, named)
        out[desc["name"]] = desc
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    texts = {f"{name}.json": json.dumps(d, indent=2) + "\n" for name, d in describe_all().items()}
    if args.check:
        have = {p.name: p.read_text() for p in OUT.glob("*.json")}
        if have != texts:
            print("tests/trace/fi_trace_out is stale: run python tests/trace/example.py")
            return 1
        return 0
    OUT.mkdir(exist_ok=True)
    for p in OUT.glob("*.json"):
        p.unlink()
    for name, text in texts.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(texts)} files to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
