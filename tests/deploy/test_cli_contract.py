"""What the containers run is the real CLI: every `probsearch ...` command in docker/,
docker-compose.yml, k8s/ and README.md resolves in the click tree of the `probsearch`
console script with options it accepts and every required one given, and every PROBSEARCH_*
name in those files is a field of the service Settings."""

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
import yaml

from tests.deploy import REPO, image_argv, image_env

DOCKERFILES = {"docker/Dockerfile": "cpu", "docker/Dockerfile.gpu": "cuda"}
COMPOSE = REPO / "docker-compose.yml"
DOCS = REPO / "README.md"
K8S_FILES = sorted((REPO / "k8s").rglob("*.yaml"))
DEPLOY_FILES = [REPO / f for f in DOCKERFILES] + [COMPOSE, *K8S_FILES, DOCS]
WORKLOAD_KINDS = ("Deployment", "Job", "CronJob")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}


@dataclass(frozen=True)
class Invocation:
    """One `probsearch ...` command line found in a deployment file."""

    where: str
    argv: list[str]  # argv[0] == "probsearch"
    env: frozenset[str]  # variables set around it (for options that read an envvar)


@pytest.fixture(scope="module")
def cli() -> Any:
    """The root command of the `probsearch` console script (a click-style command tree)."""
    from probsearch.cli import app

    return typer.main.get_command(app)


def click_core(command: Any) -> ModuleType:
    """The click core module the tree is built on: click's own, or the copy typer vendors."""
    for cls in type(command).__mro__:
        module = sys.modules[cls.__module__]
        if cls.__name__ == "Command" and hasattr(module, "ParameterSource"):
            return module
    raise TypeError(f"{type(command)} is no click command")


def settings_variables() -> set[str]:
    from models.settings import Settings

    return {f"PROBSEARCH_{name.upper()}" for name in Settings.model_fields}


def _words(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _effective(entrypoint: list[str], command: list[str], image: str) -> list[str]:
    """What a container runs: the image's ENTRYPOINT/CMD where the file gives none."""
    image_entry, image_cmd = image_argv(REPO / image)
    if entrypoint:
        return entrypoint + command
    return image_entry + (command or image_cmd)


def dockerfile_invocations() -> list[Invocation]:
    return [
        Invocation(name, _effective([], [], name), frozenset(image_env(REPO / name)))
        for name in DOCKERFILES
    ]


def compose_invocations() -> list[Invocation]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    by_tag = {s["image"]: s["build"]["dockerfile"] for s in services.values() if "build" in s}
    found = []
    for name, service in services.items():
        dockerfile = by_tag.get(service.get("image", ""))
        if dockerfile is None:
            continue  # not a probsearch image (redis)
        argv = _effective(
            _words(service.get("entrypoint")), _words(service.get("command")), dockerfile
        )
        env = set(image_env(REPO / dockerfile)) | set(service.get("environment") or {})
        found.append(Invocation(f"docker-compose.yml: {name}", argv, frozenset(env)))
    return found


def k8s_invocations() -> list[Invocation]:
    base = (REPO / "k8s" / "base" / "kustomization.yaml").read_text()
    config = set(re.findall(r"\b(PROBSEARCH_[A-Z0-9_]+)=", base))
    found = []
    for path in K8S_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in WORKLOAD_KINDS:
                continue
            spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
            for container in spec["template"]["spec"]["containers"]:
                if container["image"].split(":")[0] != "probsearch":
                    continue
                argv = _effective(
                    container.get("command", []), container.get("args", []), "docker/Dockerfile"
                )
                env = config | set(image_env(REPO / "docker/Dockerfile"))
                where = f"{path.relative_to(REPO)}: {doc['kind']}/{doc['metadata']['name']}"
                found.append(Invocation(where, argv, frozenset(env)))
    return found


def docs_invocations() -> list[Invocation]:
    """`probsearch` commands in the shell blocks of README.md: at the start of a command,
    after `--` (kubectl exec) or a compose service name (`--entrypoint probsearch SERVICE`)."""
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", DOCS.read_text(), re.S)
    env = frozenset(image_env(REPO / "docker/Dockerfile"))
    found = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            previous = tokens[i - 1] if i else None
            if token != "probsearch" or previous in ("-n", "--namespace"):
                continue
            rest = tokens[i + 2 :] if previous == "--entrypoint" else tokens[i + 1 :]
            end = next((j for j, t in enumerate(rest) if t in SHELL_OPERATORS), len(rest))
            found.append(Invocation(f"README.md: {line.strip()}", ["probsearch", *rest[:end]], env))
    return found


def check(cli: Any, invocation: Invocation) -> str | None:
    """Why the real CLI would reject this command line, or None when it accepts it."""
    core = click_core(cli)
    command, path, args = cli, ["probsearch"], invocation.argv[1:]
    while hasattr(command, "list_commands"):  # a group: the next word picks a subcommand
        name = " ".join(path)
        if not args:
            return f"`{name}` needs a subcommand"
        ctx = core.Context(command, info_name=path[-1])
        if args[0].startswith("-"):  # e.g. `probsearch index --help`
            known = {opt for param in command.get_params(ctx) for opt in param.opts}
            return None if args[0] in known else f"`{name}` has no option {args[0]}"
        sub = command.get_command(ctx, args[0])
        if sub is None:
            known = ", ".join(command.list_commands(ctx))
            return f"`{name}` has no subcommand {args[0]!r} (has: {known})"
        command, path, args = sub, [*path, args[0]], args[1:]
    return _check_leaf(core, command, " ".join(path), args, invocation.env)


def _check_leaf(
    core: ModuleType, command: Any, name: str, args: list[str], env: frozenset[str]
) -> str | None:
    """Match the words against the command's declared options and arguments, as click's parser
    does, without converting values (they may be $(VAR) references or paths of the container)."""
    params = command.get_params(core.Context(command, info_name=name))
    options = {opt: p for p in params if p.param_type_name == "option" for opt in p.opts}
    options |= {opt: p for p in params if p.param_type_name == "option" for opt in p.secondary_opts}
    given: set[str] = set()
    positional = 0
    words = iter(args)
    for word in words:
        if word == "--":
            positional += len(list(words))
        elif word.startswith("-") and len(word) > 1:
            flag, has_value, _ = word.partition("=")
            if flag not in options:
                return f"`{name}` has no option {flag} (has: {', '.join(sorted(options))})"
            param = options[flag]
            given.add(param.name)
            if not (has_value or param.is_flag or param.count):
                for _ in range(param.nargs):
                    if next(words, None) is None:
                        return f"`{name}`: option {flag} needs a value"
        else:
            positional += 1
    arguments = [p for p in params if p.param_type_name == "argument"]
    if all(p.nargs >= 0 for p in arguments) and positional > sum(p.nargs for p in arguments):
        return f"`{name}` takes {sum(p.nargs for p in arguments)} arguments, got {positional}"
    given |= {p.name for p in arguments[:positional]}
    for param in params:
        envvars = [param.envvar] if isinstance(param.envvar, str) else param.envvar or []
        if param.required and param.name not in given and not set(envvars) & env:
            return f"`{name}` is missing its required {param.opts or param.name}"
    return None


def all_invocations() -> list[Invocation]:
    return dockerfile_invocations() + compose_invocations() + k8s_invocations() + docs_invocations()


def test_invocations_are_found() -> None:
    """Guards the extraction itself: the deployment runs at least these subcommands."""
    subcommands = {inv.argv[1] for inv in all_invocations() if len(inv.argv) > 1}
    assert {"serve", "demo", "reindex", "index"} <= subcommands, subcommands
    assert all(inv.argv[0] == "probsearch" for inv in dockerfile_invocations())


def test_every_command_is_accepted_by_the_real_cli(cli: Any) -> None:
    problems = [f"{inv.where}: {why}" for inv in all_invocations() if (why := check(cli, inv))]
    assert problems == [], "\n".join(problems)


def test_checker_rejects_wrong_commands(cli: Any) -> None:
    """The check above can fail: unknown subcommands and options are reported."""
    env = frozenset()
    assert check(cli, Invocation("t", ["probsearch", "no-such-command"], env))
    assert check(cli, Invocation("t", ["probsearch", "serve", "--no-such-flag"], env))
    assert check(cli, Invocation("t", ["probsearch", "serve", "--port"], env))
    assert check(cli, Invocation("t", ["probsearch", "serve", "surplus-argument"], env))
    assert check(cli, Invocation("t", ["probsearch", "serve", "--port", "8000"], env)) is None


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_probsearch_variable_is_a_settings_field(path: Path) -> None:
    used = set(re.findall(r"\bPROBSEARCH_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    unknown = sorted(used - settings_variables())
    assert unknown == [], f"{path.relative_to(REPO)} sets variables Settings ignores: {unknown}"
