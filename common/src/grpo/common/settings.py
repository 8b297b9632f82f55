"""One way to load a service's settings: defaults < config file < env < CLI flags.

Each service declares one pydantic settings class (a docstring under each field) and
calls `load_settings` before it imports anything heavy, so `--help` is instant and a
bad value is reported with the field's name before any model is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from grpo.common.tiny_model import ModelNotFound

S = TypeVar("S", bound=BaseSettings)

# The standard level names, in any case (`--log-level debug` works): the ones both logging and uvicorn (the
# reward's HTTP server, given it lowercased) take; logging's aliases WARN and FATAL are not uvicorn's.
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)


class InvalidSettings(ValueError):
    """Settings input that fails before pydantic sees it (a config file, an env value that is not JSON)."""


def service_config(env_prefix: str, prog: str) -> SettingsConfigDict:
    """The settings-class config every service uses (kebab-case flags, env prefix)."""
    return SettingsConfigDict(
        env_prefix=env_prefix,
        cli_prog_name=prog,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        extra="forbid",
        validate_default=True,
        # The docstring under each field is its --help text and its documentation.
        use_attribute_docstrings=True,
    )


class ServiceSettings(BaseSettings):
    """The base of each service's settings class: an empty value of an optional field means unset.

    Deployments template secrets and paths as `${VAR:-}` (compose) or empty strings (Helm): a token
    of '' must turn auth off on the server *and* the client, never demand an empty bearer token.
    """

    @model_validator(mode="before")
    @classmethod
    def _empty_optional_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        optional = {name for name, f in cls.model_fields.items() if not f.is_required() and _admits_none(f.annotation)}
        return {k: (None if k in optional and isinstance(v, str) and not v.strip() else v) for k, v in data.items()}

    # check_fields=False: these check the field wherever a service declares it (each service has its own).
    @field_validator("log_level", mode="before", check_fields=False)
    @classmethod
    def _known_log_level(cls, value: Any) -> Any:
        # Any case on the command line or in env; the services declare it as LogLevel, its names upper-case.
        if isinstance(value, str) and value.upper() in LOG_LEVELS:
            return value.upper()
        raise ValueError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)}")

    @field_validator("host", check_fields=False)
    @classmethod
    def _host_resolves(cls, value: str) -> str:
        # Said here, before a model loads: gRPC reports an unknown host only as a failed bind.
        try:
            socket.getaddrinfo(value.strip("[]"), None)
        except (OSError, UnicodeError) as exc:
            raise ValueError(f"{value!r} is not an address of this machine or a name that resolves ({exc})") from None
        return value

    @model_validator(mode="after")
    def _tls_files_load(self) -> ServiceSettings:
        cert, key = getattr(self, "tls_cert_file", None), getattr(self, "tls_key_file", None)
        if bool(cert) != bool(key):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if cert and key:
            check_tls_pair(cert, key)
        for name in type(self).model_fields:  # the CAs a client trusts: rollout's reward/relay, trainer's rollout
            if name.endswith("tls_ca_file") and (path := getattr(self, name)):
                check_ca_file(name, path)
        return self


def redis_url_problem(url: str) -> str | None:
    """Why `url` is not a Redis URL the services' client can use, in the words every part of the system uses for it;
    None when it is one. Only what follows the credentials is quoted: a mistyped URL must not put a password into
    the logs."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return f"redis_url must start with redis://, rediss:// or unix:// (got …{url.rpartition('@')[2]!r})"
    from redis.connection import parse_url  # what the services' client parses it with; imported late: --help

    try:
        parse_url(url)
    except ValueError as exc:
        return f"redis_url is not a Redis URL ({exc})"
    return None


def check_ca_file(field: str, path: str) -> None:
    """ValueError naming the setting unless `path` is a readable file of PEM CA certificates (else the first
    connection would fail, long after start-up, as a TLS handshake error)."""
    if not Path(path).is_file():
        raise ValueError(f"{field} {path}: no such file")
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{field} {path} is not a PEM file of CA certificates ({exc})") from None


def check_tls_pair(cert_file: str, key_file: str) -> None:
    """ValueError naming the file unless `cert_file` and `key_file` are a readable PEM certificate and its key."""
    for field, path in (("tls_cert_file", cert_file), ("tls_key_file", key_file)):
        if not Path(path).is_file():
            raise ValueError(f"{field} {path}: no such file")
    try:
        # A password callback that gives none: an encrypted key is refused here, not prompted for on a tty.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"tls_cert_file {cert_file} and tls_key_file {key_file} are not a PEM certificate and its unencrypted "
            f"private key ({exc})"
        ) from None


def _admits_none(annotation: Any) -> bool:
    return annotation is None or type(None) in getattr(annotation, "__args__", ())


def _split_config_flag(argv: list[str]) -> tuple[Path | None, list[str]]:
    """Take `--config PATH` (or `--config=PATH`) out of argv; the rest goes to the CLI parser."""
    rest: list[str] = []
    path: Path | None = None
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            value = next(it, None)
            if value is None:
                raise SystemExit("--config needs a path")
            path = Path(value)
        elif arg.startswith("--config="):
            path = Path(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return path, rest


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML); an empty file is an empty mapping. InvalidSettings when it is not."""
    if not path.is_file():
        raise InvalidSettings(f"config file {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise InvalidSettings(f"config file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise InvalidSettings(f"config file {path}: not valid YAML or JSON: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise InvalidSettings(f"config file {path}: must hold a mapping of setting names to values")
    # Config files use the field names; accept kebab-case keys too.
    return {str(k).replace("-", "_"): v for k, v in data.items()}


# What a flag takes, in the words --help should use instead of pydantic-settings' Python types (`{Path,None}`).
PLAIN_METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT", "Path": "PATH", "bool": "{true,false}"}


def _top_level_parts(metavar: str) -> list[str]:
    """`Path,list[{str,dict}]` → [`Path`, `list[{str,dict}]`]: split at the commas outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(metavar):
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            parts.append(metavar[start:i])
            start = i + 1
    return [*parts, metavar[start:]]


def plain_metavar(metavar: str) -> str:
    """`{Path,None}` → PATH, `{{k1,k2},None}` → {k1,k2}, `list[str]` → LIST, `dict[str,float]` → MAPPING."""
    if metavar.startswith("{") and metavar.endswith(",None}"):  # optional: leaving the flag out is the None
        metavar = metavar[1 : -len(",None}")]
    parts = _top_level_parts(metavar)
    if len(parts) > 1 and not metavar.startswith("{"):  # a union, e.g. `Path,list[...]` → PATH|LIST
        return "|".join(plain_metavar(part) for part in parts)
    if metavar.startswith(("list[", "tuple[", "set[")):
        return "LIST"
    if metavar.startswith("dict["):
        return "MAPPING"
    if metavar.startswith("{bool,"):  # a switch with a third word, e.g. `{bool,auto}` → {true,false,auto}
        return "{true,false," + metavar[len("{bool,") :]
    return PLAIN_METAVARS.get(metavar, metavar)


def _add_argument(aliases: dict[str, str]) -> Any:
    """argparse's add_argument with plain metavars, and each flag's alias (another name for it) beside it."""

    def add(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
        if isinstance(kwargs.get("metavar"), str):
            kwargs["metavar"] = plain_metavar(kwargs["metavar"])
        return parser.add_argument(*names, *(aliases[name] for name in names if name in aliases), **kwargs)

    return add


# Settings that may hold a secret, and so may be read from a file: `GRPO_<SERVICE>_<FIELD>_FILE=/path` (the usual
# container convention), for secrets mounted as files (compose's generated ones, Kubernetes Secret volumes) that
# then appear in no process environment or `docker inspect`.
SECRET_FIELDS = ("token", "weights_token", "reward_token", "redis_url")


def secrets_from_files(cls: type[BaseSettings]) -> dict[str, str]:
    """The secret settings whose `<ENV>_FILE` variable is set, read from those files. InvalidSettings for a file
    that is missing or empty (an empty token would turn auth off without a word) or an `<ENV>` set beside it."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    values: dict[str, str] = {}
    for field in SECRET_FIELDS:
        env = (prefix + field).upper()
        path = os.environ.get(f"{env}_FILE", "").strip()
        if field not in cls.model_fields or not path:
            continue
        if os.environ.get(env, "").strip():
            raise InvalidSettings(f"{field}: set {env} or {env}_FILE, not both")
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise InvalidSettings(f"{field}: {env}_FILE {path}: no such file") from None
        except (OSError, UnicodeError) as exc:
            raise InvalidSettings(f"{field}: {env}_FILE {path}: cannot be read ({exc})") from None
        if not value:
            raise InvalidSettings(f"{field}: {env}_FILE {path} is empty")
        values[field] = value
    return values


def load_settings(
    cls: type[S],
    argv: list[str] | None = None,
    env_file_var: str | None = None,
    flag_aliases: dict[str, str] | None = None,
) -> S:
    """Build `cls` from its defaults, a config file, the environment and CLI flags.

    The config file comes from `--config PATH` or from the environment variable
    `env_file_var` (e.g. GRPO_REWARD_CONFIG). `flag_aliases` gives a flag a second name
    (`{"--run": "--run-id"}`), on the command line only.
    """
    argv = sys.argv[1:] if argv is None else argv
    path, rest = _split_config_flag(argv)
    if path is None and env_file_var and os.environ.get(env_file_var):
        path = Path(os.environ[env_file_var])
    file_values = read_config_file(path) if path else {}
    secret_files = secrets_from_files(cls)

    class _Loaded(cls):  # type: ignore[valid-type, misc]
        @classmethod
        def settings_customise_sources(
            cls_,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            cli: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
                settings_cls, cli_parse_args=rest, root_parser=_root_parser(cls, env_file_var),
                add_argument_method=_add_argument(flag_aliases or {}),
            )  # fmt: skip
            # Earlier sources win: CLI > env (and the secrets its `_FILE` variables name) > file (init) > defaults.
            # A secret's own env variable is empty or unset when its file is read (else that is an error).
            secrets = InitSettingsSource(settings_cls, init_kwargs=secret_files)
            return (cli, secrets, env_settings, init_settings)

    _Loaded.__name__ = cls.__name__
    _Loaded.__doc__ = cls.__doc__
    try:
        loaded = _Loaded(**file_values)
    except SettingsError as exc:
        raise InvalidSettings(_source_problem(exc, str(cls.model_config.get("env_prefix", "")))) from None
    return cls.model_validate(loaded.model_dump())


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """'line 2, column 1: expected ',' or ']'' from PyYAML's multi-line report."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _source_problem(exc: SettingsError, env_prefix: str) -> str:
    """One line for a flag or env value pydantic-settings could not parse (it says neither what nor how to fix)."""
    cause = f" ({exc.__cause__})" if exc.__cause__ else ""
    env = re.search(r'field "(\w+)" from source "EnvSettingsSource"', str(exc))
    if env:  # a list or mapping in the environment is read as JSON only
        field = env.group(1)
        env_var = (env_prefix + field).upper()
        return f'{field}: {env_var} must be JSON: a list as ["</s>"], a mapping as {{"math": 1}}{cause}'
    flag = re.match(r"Parsing error encountered for (\w+): (.*)", str(exc), re.DOTALL)
    if flag:
        field, why = flag.groups()
        return f'{field}: --{field.replace("_", "-")}: {why}; give a list as a,b or ["a", "b"], a mapping as k=1,j=2'
    return f"{exc}{cause}"


def _root_parser(cls: type[BaseSettings], env_file_var: str | None) -> argparse.ArgumentParser:
    """The parser pydantic-settings fills with one flag per field, plus `--config`, which is read before it."""
    parser = argparse.ArgumentParser(
        prog=cls.model_config.get("cli_prog_name"),
        description=cls.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    also = f" (or ${env_file_var})" if env_file_var else ""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"a YAML or JSON file of settings{also}; precedence: defaults < file < environment < flags",
    )
    return parser


@contextlib.contextmanager
def exit_on_invalid_settings(prog: str) -> Iterator[None]:
    """Around a service's settings parsing in `main`: a bad value is one line naming the field and exit code 2.

    A `--model` that `check_model` cannot find is reported the same way.

    The parse functions themselves raise `ValidationError`, so tests can assert on it.
    """
    try:
        yield
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors())
        sys.stderr.write(f"{prog}: invalid settings: {errors}\n")
        raise SystemExit(2) from None
    except ModelNotFound as exc:
        sys.stderr.write(f"{prog}: invalid settings: model: {exc}\n")
        raise SystemExit(2) from None
    except InvalidSettings as exc:
        sys.stderr.write(f"{prog}: invalid settings: {exc}\n")
        raise SystemExit(2) from None
