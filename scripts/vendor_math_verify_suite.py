"""Turn Math-Verify's own test suite into a data table our verifier API is tested against.

Math-Verify (huggingface/Math-Verify, MIT licence) tests its parser and grader with parametrized
(gold, prediction, expected) cases, most through a `compare_strings` helper whose keyword arguments
are the settings the case needs. This script reads the suite's source (it never runs it), resolves
those settings per case and writes tests/data/math_verify_suite.json:

    python scripts/vendor_math_verify_suite.py PATH/TO/Math-Verify/tests --commit SHA

Cases of tests that call `verify(parse(gold), parse(pred))` directly get the library's defaults.
Tests of other things (string extraction, normalisation configs, timeouts, errors) are skipped.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
from pathlib import Path
from typing import Any

DEFAULTS = {"extraction": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}
SETTING_OF_KEYWORD = {
    "match_types": "extraction",
    "precision": "precision",
    "strict": "strict",
    "allow_set_relation_comp": "allow_set_relation_comp",
}
log = logging.getLogger("vendor_math_verify_suite")
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "math_verify_suite.json"


def literal(node: ast.expr) -> Any:
    """ast.literal_eval, plus the f-strings over `math` the suite uses (e.g. f"{math.sqrt(17):.15f}")."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        # Only the suite's own source is evaluated, with nothing but `math` in scope.
        return eval(compile(ast.Expression(node), "<case>", "eval"), {"math": math})


def parametrize_cases(fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """The parametrize table of a test function as dicts of argname → value."""
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize":
            names = [n.strip() for n in literal(deco.args[0]).split(",")]
            rows = deco.args[1]
            assert isinstance(rows, ast.List)
            return [dict(zip(names, literal(row), strict=True)) for row in rows.elts]
    return []


def calls(fn: ast.FunctionDef, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]


def value(node: ast.expr, params: dict[str, Any]) -> Any:
    return params[node.id] if isinstance(node, ast.Name) and node.id in params else literal(node)


def cases_of(path: Path) -> list[dict[str, Any]]:
    tree = ast.parse(path.read_text())
    out = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        helper = calls(fn, "compare_strings")
        direct = [c for c in calls(fn, "verify") if any(isinstance(a, ast.Call) for a in c.args)]
        if not helper and not direct:
            continue  # tests of other parts (string extraction, configs, timeouts)
        table = parametrize_cases(fn) or [{}]
        for params in table:
            for call in helper:
                gold, pred = (value(a, params) for a in call.args[:2])
                settings = dict(DEFAULTS)
                for kw in call.keywords:
                    settings[SETTING_OF_KEYWORD[kw.arg or ""]] = value(kw.value, params)
                expected = params.get("expected", None)
                if expected is None:  # a non-parametrized `assert compare_strings(...) == 1`
                    expected = 1
                out.append(case(path, fn, gold, pred, expected, settings))
            if direct and params:
                gold, pred = params["gold"], params["pred"]
                expected = params.get("result", params.get("expected"))
                out.append(case(path, fn, gold, pred, expected, dict(DEFAULTS)))
    return out


def case(path: Path, fn: ast.FunctionDef, gold: str, pred: str, expected: Any, settings: dict) -> dict[str, Any]:
    return {
        "source": f"tests/{path.name}::{fn.name}",
        "gold": gold,
        "pred": pred,
        "expected": bool(int(expected)),
        **settings,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", type=Path, help="Math-Verify's tests/ folder")
    ap.add_argument("--commit", default="", help="the Math-Verify commit the folder comes from")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cases = [c for p in sorted(args.tests.glob("test_*.py")) for c in cases_of(p)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "source": "https://github.com/huggingface/Math-Verify (tests/), MIT licence, © 2024 The HuggingFace Team",
                "commit": args.commit,
                "generator": "scripts/vendor_math_verify_suite.py",
                "cases": cases,
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )
    log.info("%d cases → %s", len(cases), OUT)


if __name__ == "__main__":
    main()
