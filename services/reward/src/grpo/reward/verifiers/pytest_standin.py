"""A small stand-in for `pytest`, for assert tests that import it (KodCode's): the sandbox has no pytest.

SOURCE is the module's text; the harness (frameworks.py) runs it into a fresh module registered as `pytest` after the
candidate has run and before the tests, only when the tests import pytest. It has what such test files use:
`raises` (a context manager, or a call), `approx` (numbers, lists, tuples, dicts; pytest's tolerances), `fail`,
`skip`, `xfail`, `param`, `fixture`, `main` (nothing: the harness runs the tests after them) and `mark.<name>`
(`parametrize`, `skip`, `skipif`, `xfail`, `usefixtures` mean what they do in pytest, any other name is a marker that
does nothing). The harness reads the marks (`_marks`), the fixtures (`_fixture_of`) and the outcomes (`_Skipped`,
`_XFailed`, `_Failed`) from the module it made, not from `sys.modules`.

Neither `approx` nor `raises` runs the candidate's code to judge: `approx` reads a value's data through the builtin
types' own methods (a `float` subclass's `__rsub__` or `__abs__` is never called, a `list` subclass's `__len__` is not
asked) and a value of any other class is not approximately anything; `raises` checks the type raised with `issubclass`
against the tests' expected types and `match` against `str(value)` as pytest does. An object of the candidate's class
with comparisons of its own compared with an `approx` fails by the assert guard (assert_guard.py) before `approx` is
asked.
"""

from __future__ import annotations

SOURCE = r'''
import re, sys, math, types, itertools
from fractions import Fraction
from decimal import Decimal

__all__ = ["raises", "approx", "fail", "skip", "xfail", "param", "fixture", "mark", "main"]


class _Outcome(BaseException):  # as pytest's: not caught by `except Exception` in the tests
    def __init__(self, msg=""):
        super().__init__(msg)
        self.msg = msg


class _Skipped(_Outcome):
    pass


class _XFailed(_Outcome):
    pass


class _Failed(_Outcome):
    pass


def fail(reason="", pytrace=True, msg=None):
    raise _Failed(msg if msg is not None else reason)


def _called(error):
    """`error`, with the code that called skip() or xfail(): the harness takes the outcome only from the tests' code
    that names the function (not from `map(pytest.skip, ...)` the candidate returned for the tests to iterate)."""
    error._caller = sys._getframe(2).f_code
    return error


def skip(reason="", allow_module_level=False, msg=None):
    raise _called(_Skipped(msg if msg is not None else reason))


def xfail(reason=""):
    raise _called(_XFailed(reason))


fail.Exception, skip.Exception, xfail.Exception = _Failed, _Skipped, _XFailed


def main(*args, **kwargs):
    """Nothing: the harness runs the tests after the test code (a second run here would run each twice)."""
    return 0


class ExceptionInfo:
    def __init__(self):
        self.type = self.value = self.tb = None

    @property
    def typename(self):
        return self.type.__name__

    def errisinstance(self, exc):
        return isinstance(self.value, exc)

    def match(self, regexp):
        text = str(self.value)
        assert re.search(regexp, text), f"Regex pattern did not match.\n Regex: {regexp!r}\n Input: {text!r}"
        return True

    def __repr__(self):
        return f"<ExceptionInfo {self.value!r}>"


def _exception_types(expected):
    types_ = expected if isinstance(expected, tuple) else (expected,)
    if not types_ or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types_):
        raise TypeError(f"expected exception must be a BaseException type, not {expected!r}")
    return types_


class RaisesContext:
    def __init__(self, expected, match):
        self.expected, self.match_expr, self.info = _exception_types(expected), match, ExceptionInfo()

    def __enter__(self):
        return self.info

    def __exit__(self, kind, value, tb):
        if kind is None:
            names = " or ".join(t.__name__ for t in self.expected)
            raise _Failed(f"DID NOT RAISE {names}")
        if not issubclass(kind, self.expected):
            return False  # not what the tests expect: it goes on, and fails the test
        self.info.type, self.info.value, self.info.tb = kind, value, tb
        if self.match_expr is not None:
            self.info.match(self.match_expr)
        return True


def raises(expected_exception, *args, match=None, **kwargs):
    context = RaisesContext(expected_exception, match)
    if not args:
        return context
    with context:
        args[0](*args[1:], **kwargs)
    return context.info


_NUMBERS = (bool, int, float, complex, Fraction, Decimal)
_PLAIN = (str, bytes, type(None))


def _plain(value, depth=0):
    """`value` as builtin data read through the builtin types' own methods, no method of its own class called (a
    subclass's `__eq__`, `__sub__`, `__abs__`, `__len__` or `__iter__` is never asked); None for anything else."""
    kind = type(value)
    if kind in _NUMBERS or kind in _PLAIN:
        return value
    if depth > 20:
        return None
    # type(), not isinstance(): a class can claim another `__class__`, not another type
    if issubclass(kind, int):
        return int.__index__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, complex):
        return complex(complex.real.__get__(value), complex.imag.__get__(value))
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, (list, tuple)):
        items = list.copy(value) if issubclass(kind, list) else list(tuple.__iter__(value))
        out = [_plain(item, depth + 1) for item in items]
        return None if any(o is None and i is not None for o, i in zip(out, items)) else out
    if issubclass(kind, dict):
        pairs = list(dict.items(value))
        out = [(_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in pairs]
        if any((k is None and a is not None) or (v is None and b is not None) for (k, v), (a, b) in zip(out, pairs)):
            return None
        try:
            return {_hashable(k): v for k, v in out}
        except TypeError:
            return None
    return None


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


class ApproxBase:
    __hash__ = None

    def __init__(self, expected, rel=None, abs=None, nan_ok=False):
        if rel is not None and (rel < 0 or rel != rel):
            raise ValueError(f"relative tolerance can't be negative or NaN: {rel}")
        if abs is not None and (abs < 0 or abs != abs):
            raise ValueError(f"absolute tolerance can't be negative or NaN: {abs}")
        self.expected, self.rel, self.abs, self.nan_ok = expected, rel, abs, nan_ok
        self._want = _plain(expected)
        if self._want is None and expected is not None:
            raise TypeError(f"pytest.approx() does not support {type(expected).__name__}: {expected!r}")

    def __repr__(self):
        return f"approx({self.expected!r})"

    def __eq__(self, actual):
        try:
            got = _plain(actual)
        except (TypeError, ValueError, RecursionError):
            return False
        if got is None and actual is not None:
            return False  # not builtin data: not approximately anything
        return self._close(self._want, got)

    def __ne__(self, actual):
        return not self == actual

    def __bool__(self):
        raise AssertionError("approx() is not supported in a boolean context")

    def _close(self, want, got):
        if isinstance(want, list):
            return isinstance(got, list) and len(got) == len(want) and all(map(self._close, want, got))
        if isinstance(want, dict):
            return (isinstance(got, dict) and set(got) == set(want)
                    and all(self._close(want[k], got[k]) for k in want))
        if type(want) is bool:  # as pytest: approx(True) is no number
            return type(got) is bool and want == got
        if type(want) in _NUMBERS and type(got) in _NUMBERS:
            return self._scalar(want, got)
        return type(want) is type(got) and want == got  # builtin data: str, bytes, None

    def _scalar(self, want, got):
        try:
            if got == want:
                return True
            if math.isnan(abs(want)):
                return bool(self.nan_ok and math.isnan(abs(got)))
            if math.isinf(abs(want)):
                return False
            tolerance = 1e-12 if self.abs is None else self.abs
            if not (self.rel is None and self.abs is not None):
                tolerance = max(tolerance, (1e-6 if self.rel is None else self.rel) * abs(want))
            return abs(want - got) <= tolerance
        except (TypeError, ValueError, ArithmeticError):
            return False


def approx(expected, rel=None, abs=None, nan_ok=False):
    return ApproxBase(expected, rel, abs, nan_ok)


class Mark:
    def __init__(self, name, args, kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs

    def __repr__(self):
        return f"Mark({self.name!r}, {self.args!r}, {self.kwargs!r})"


class MarkDecorator:
    def __init__(self, name, args=(), kwargs=None):
        self.mark = Mark(name, args, kwargs or {})

    @property
    def name(self):
        return self.mark.name

    def __call__(self, *args, **kwargs):
        # pytest's rule: one class or named function and nothing else is what the mark decorates
        target = args[0] if len(args) == 1 and not kwargs else None
        if isinstance(target, type) or (callable(target) and getattr(target, "__name__", "<lambda>") != "<lambda>"):
            marks = list(vars(target).get("pytestmark", []))
            target.pytestmark = [*marks, self.mark]
            return target
        return MarkDecorator(self.mark.name, self.mark.args + args, {**self.mark.kwargs, **kwargs})


class _MarkGenerator:
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return MarkDecorator(name)


mark = _MarkGenerator()


class ParameterSet:
    def __init__(self, values, id=None, marks=()):
        self.values, self.id = values, id
        self.marks = [m.mark if isinstance(m, MarkDecorator) else m for m in
                      (marks if isinstance(marks, (list, tuple)) else (marks,))]


def param(*values, id=None, marks=()):
    return ParameterSet(values, id, marks)


def _marks(obj):
    """The marks on a test function or class, in the order they were applied (the innermost decorator first)."""
    found = vars(obj).get("pytestmark", []) if hasattr(obj, "__dict__") else []
    found = found if isinstance(found, list) else [found]
    return [m.mark if isinstance(m, MarkDecorator) else m for m in found if isinstance(m, (Mark, MarkDecorator))]


class _Fixture:
    def __init__(self, function, name, autouse, params):
        self.function, self.name, self.autouse, self.params = function, name, autouse, params


def fixture(function=None, *, scope="function", params=None, autouse=False, ids=None, name=None):
    """A fixture: the function itself, marked; every test gets a fresh value (the scope is not kept)."""
    def decorate(function):
        function._grpo_fixture = _Fixture(function, name or function.__name__, autouse, params)
        return function
    return decorate(function) if callable(function) else decorate


def _fixture_of(value):
    found = getattr(value, "_grpo_fixture", None) if isinstance(value, types.FunctionType) else None
    return found if isinstance(found, _Fixture) and found.function is value else None


def _id(value, name, index):
    if isinstance(value, (int, float, str, bool, type(None))) and not isinstance(value, type):
        text = str(value)
        return text if text.isascii() and text.isprintable() and len(text) <= 40 else f"{name}{index}"
    return f"{name}{index}"


def _cases(mark_):
    """[(id, {argname: value}, marks)] of one parametrize mark."""
    args, kwargs = mark_.args, mark_.kwargs
    names = args[0] if args else kwargs["argnames"]
    values = args[1] if len(args) > 1 else kwargs["argvalues"]
    ids = args[3] if len(args) > 3 else kwargs.get("ids")
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names, out = list(names), []
    for index, value in enumerate(values):
        marks, given = [], None
        if isinstance(value, ParameterSet):
            marks, given, value = value.marks, value.id, value.values
            value = value[0] if len(names) == 1 else value
        row = [value] if len(names) == 1 else list(value)
        if len(row) != len(names):
            raise ValueError(f"parametrize: {names} but {len(row)} values in {value!r}")
        if given is None and ids is not None:
            given = ids(value) if callable(ids) else (ids[index] if index < len(ids) else None)
        label = given if given is not None else "-".join(_id(v, n, index) for n, v in zip(names, row))
        out.append((str(label), dict(zip(names, row)), marks))
    return out


def _parametrized(marks):
    """[(id, {argname: value}, marks)] of a test's parametrize marks together, their cross product (stacked
    decorators); [("", {}, [])] when there are none."""
    cases = [("", {}, [])]
    for mark_ in marks:
        if mark_.name == "parametrize":
            cases = [("-".join(filter(None, (a, b))), {**p, **q}, [*m, *n])
                     for a, p, m in cases for b, q, n in _cases(mark_)]
    return cases


class CaptureResult(tuple):
    def __new__(cls, out, err):
        return super().__new__(cls, (out, err))

    out = property(lambda self: self[0])
    err = property(lambda self: self[1])


class CaptureFixture:
    def __init__(self, out, err):
        self._out, self._err = out, err

    def readouterr(self):
        """What the test printed since the last call (the capture's own buffers, whatever sys.stdout is now)."""
        taken = CaptureResult(self._out.getvalue(), self._err.getvalue())
        for buffer in (self._out, self._err):
            buffer.seek(0)
            buffer.truncate()
        return taken


def _capsys():
    import io
    out, err, saved = io.StringIO(), io.StringIO(), (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        yield CaptureFixture(out, err)
    finally:
        sys.stdout, sys.stderr = saved


_builtin = {"capsys": _Fixture(_capsys, "capsys", False, None)}  # pytest's own fixtures that are here
'''
