"""The trust boundary: what a config read from a file or a record may be, and the one place a config becomes objects.

A config is code in disguise: ``hydra.utils.instantiate`` calls whatever a ``_target_`` names, Hydra composes
whatever a ``defaults`` list names (a path may leave ``configs/``), OmegaConf evaluates interpolations and
resolvers, and importing the module a ``_target_`` names runs that module. So two rules, each enforced in one
place of this module:

* **Read**: everything read from disk or from a record to be rebuilt -- the run config a checkpoint carries, a
  model folder's config, the overrides a ``results.json`` lists -- goes through :func:`plain_config` (or
  :func:`record_overrides`), which accepts plain data only: no key Hydra or OmegaConf gives meaning to
  (:data:`COMPOSITION_KEYS`, interpolations and resolvers, an instantiate key on a node that builds nothing),
  and every ``_target_`` one of the package's components or one the user named.
* **Build**: :func:`build` is the only caller of ``hydra.utils.instantiate`` in the package and its scripts,
  and :func:`locate` the only importer of a configured name; both check first the node they are given, every
  node of it, as instantiate will see it (resolved), against the package's components plus what the user
  named (:func:`user_trust`). ``tests/test_trust_boundary.py`` lists every call site of the package and
  fails when a new one goes around them.

What the user names is trusted, what a file says is not: the user's trust is ``trusted_targets=[...]`` and a
``<key>._target_=<name>`` of the command line, and the components of a config folder the command line added
(``--config-dir``, ``hydra.searchpath``); never a value read from a checkpoint, a run folder or a record.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from canonical_network.utils.checks import ConfigError

#: Keys Hydra gives meaning to when it composes a config: a ``defaults`` list composes the files it names (any
#: file on disk, by a relative path), ``hydra`` configures Hydra itself (its launcher, callbacks, search path).
COMPOSITION_KEYS = ("defaults", "hydra")
#: The keys ``hydra.utils.instantiate`` reads besides ``_target_``.
INSTANTIATE_KEYS = ("_partial_", "_args_", "_recursive_", "_convert_")
#: Plain values a config read from disk may hold (with lists and string-keyed dicts of them).
PLAIN_TYPES = (str, int, float, bool, type(None))


class UntrustedConfig(ConfigError):
    """A config read from disk or a record that is not plain data, or would build what nobody trusted."""


def _walk(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every node of a plain tree, the tree itself first (key ``""``)."""
    yield key, node
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _walk(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _walk(value, f"{key}[{index}]")


def _targets_in(folders: Iterable[Path]) -> frozenset[str]:
    """Every ``_target_`` that a ``*.yaml`` of ``folders`` names (interpolated ones left out)."""
    import yaml

    found: set[str] = set()
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                with open(path) as handle:
                    tree = yaml.safe_load(handle)
            except (OSError, yaml.YAMLError):
                continue  # Hydra reports a file it cannot read when it composes it
            for _, node in _walk(tree):
                if isinstance(node, dict) and isinstance(node.get("_target_"), str) and "${" not in node["_target_"]:
                    found.add(node["_target_"])
    return frozenset(found)


@functools.lru_cache(maxsize=1)
def known_targets() -> frozenset[str]:
    """The package's components: every ``_target_`` its own configs (``configs/**/*.yaml``) name -- its
    canonicalizers, predictors, tasks and data modules, the torch optimisers and schedulers, Lightning's trainer,
    callbacks and loggers."""
    from canonical_network.utils.config import CONFIG_DIR

    return _targets_in([CONFIG_DIR])


@functools.lru_cache(maxsize=16)
def _folder_targets(folder: str) -> frozenset[str]:
    return _targets_in([Path(folder)])


def _hydra_trust() -> set[str]:
    """What this process's Hydra command line named, when it runs under ``@hydra.main``: each
    ``<key>._target_=<name>`` override, and the components of every config folder it composed from beyond the
    package's and Hydra's own (``--config-dir``, ``hydra.searchpath``: the user's folders)."""
    from hydra.core.hydra_config import HydraConfig

    from canonical_network.utils.config import CONFIG_DIR

    if not HydraConfig.initialized():
        return set()
    hydra_cfg = HydraConfig.get()
    named = set(targets_named_by(list(hydra_cfg.overrides.task)))
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "hydra" or source.schema not in ("file", "pkg"):
            continue  # Hydra's own configs; a structured node is registered by code (the checkpoint's run)
        folder = Path(source.path) if source.schema == "file" else _package_folder(source.path)
        if folder is not None and folder.is_dir() and folder.resolve() != CONFIG_DIR.resolve():
            named |= _folder_targets(str(folder.resolve()))
    return named


def _package_folder(module: str) -> Path | None:
    from canonical_network.utils.config import _package_folder as folder_of

    return folder_of(module.replace("/", "."))


def targets_named_by(overrides: Iterable[str]) -> list[str]:
    """The targets a command line names itself: ``trusted_targets=[a.B,c.D]`` and ``<key>._target_=<name>``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    named: list[str] = []
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # Hydra reports a malformed override itself
        return named
    for override in parsed:
        if override.is_delete():
            continue
        key = override.key_or_group
        if key == "trusted_targets" or key.endswith("._target_") or key == "_target_":
            try:
                value = override.value()
            except Exception:
                continue
            values = value if isinstance(value, list) else [value]
            named += [str(v) for v in values if isinstance(v, str)]
    return named


#: The targets the user trusts in the call under way (:func:`granted`): a context variable, so that the trust one
#: command names (its ``trusted_targets``) is never another's, and threads started inside inherit it.
_GRANTED: ContextVar[frozenset[str]] = ContextVar("canonical_network_trusted_targets", default=frozenset())


@contextmanager
def granted(targets: Iterable[str] | None):
    """Trust ``targets`` (the user's own components, by ``module.name``) for the calls inside the ``with``: the
    entry points grant the ``trusted_targets`` of their command's config, ``model_from_checkpoint`` those its
    caller names. Never grant what a file says."""
    token = _GRANTED.set(_GRANTED.get() | frozenset(str(t) for t in (targets or ())))
    try:
        yield
    finally:
        _GRANTED.reset(token)


def user_trust(extra: Iterable[str] = ()) -> frozenset[str]:
    """The targets the user trusts beyond the package's: ``extra``, what the calls under way were granted
    (:func:`granted`) and what this process's Hydra command line named (:func:`_hydra_trust`)."""
    return frozenset(extra) | _GRANTED.get() | _hydra_trust()


def _refusal(source: Any, key: str, what: str, why: str) -> UntrustedConfig:
    where = f"{key}=" if key else ""
    return UntrustedConfig(f"{source}: refused {where}{what}: {why}")


def _as_plain(config: Any, resolve: bool) -> Any:
    if isinstance(config, (DictConfig, ListConfig)):
        return OmegaConf.to_container(config, resolve=resolve)
    return config


def plain_config(data: Any, source: Any, trusted: Iterable[str] = ()) -> dict[str, Any]:
    """``data`` (a config read from ``source``: a file, a checkpoint, a record) when it is plain data that may be
    built; else :class:`UntrustedConfig` naming ``source``, the key and what is wrong with it.

    Refused: a value that is not a string, number, bool, None, list or string-keyed dict; a key Hydra composes
    (:data:`COMPOSITION_KEYS`) at any depth; any string OmegaConf would interpolate (``${...}``: a reference, a
    resolver); an instantiate key (:data:`INSTANTIATE_KEYS`) on a node without a ``_target_``; any other key of
    the ``_name_`` form; a ``_target_`` that is neither
    one of the package's components nor one the user trusts (``trusted``, :func:`user_trust`: what the user's own
    command line or code names): nothing read from a file is trusted because a file says so.
    """
    allowed = known_targets() | user_trust(trusted)
    data = _as_plain(data, resolve=False)
    if not isinstance(data, dict):
        raise _refusal(source, "", f"a {type(data).__name__}", "a config is a mapping of keys to values")
    for key, node in _walk(data):
        if isinstance(node, dict):
            for name in node:
                dotted = f"{key}.{name}" if key else str(name)
                if not isinstance(name, str):
                    raise _refusal(source, dotted, f"the key {name!r}", "config keys are strings")
                if name in COMPOSITION_KEYS:
                    raise _refusal(source, dotted, "this key",
                                   f"Hydra gives {name!r} meaning (a defaults list composes the files it names, "
                                   "hydra configures Hydra); a run config holds neither")
                if name.startswith("_") and name.endswith("_") and name != "_target_":
                    if name not in INSTANTIATE_KEYS:
                        raise _refusal(source, dotted, f"{node[name]!r}", f"{name} is a key of the form Hydra and "
                                       "OmegaConf keep for themselves, which no component takes")
                    if "_target_" not in node:
                        raise _refusal(source, dotted, f"{node[name]!r}",
                                       f"{name} is an instantiate key, on a node that builds nothing")
            target = node.get("_target_")
            if "_target_" in node and (not isinstance(target, str) or target not in allowed):
                raise _refusal(source, f"{key}._target_" if key else "_target_", f"{target!r}",
                               "a config read from disk may only build the components of canonical_network's own "
                               "configs, so that loading a file never runs code from it. If it is a component of "
                               "your own code (not something that came with a file you were sent), allow it by "
                               f"name: trusted_targets=[{target}]")
        elif isinstance(node, str):
            if "${" in node:
                shown = node if len(node) <= 80 else node[:77] + "..."
                raise _refusal(source, key, repr(shown),
                               "an interpolation (a reference or a resolver) computes its value when the config "
                               "is used; canonical_network stores run configs resolved, so a file that holds one "
                               "was not written by it (a config read from disk may not compute anything)")
        elif not isinstance(node, (*PLAIN_TYPES, list, tuple, dict)):
            raise _refusal(source, key, f"a {type(node).__name__}", "a config read from disk holds plain values only")
    return data


def _check_node(node: dict, key: str, source: Any, allowed: frozenset[str]) -> None:
    target = node.get("_target_")
    if "_target_" not in node:
        name = next(k for k in INSTANTIATE_KEYS if k in node)
        raise _refusal(source, f"{key}.{name}" if key else name, f"{node[name]!r}",
                       "an instantiate key on a node that builds nothing")
    if not isinstance(target, str) or target not in allowed:
        raise _refusal(source, f"{key}._target_" if key else "_target_", f"{target!r}",
                       "only canonical_network's own components are built (those its configs name), and those the "
                       "user names: trusted_targets=[<module>.<name>] or <key>._target_=<module>.<name> on the "
                       "command line, or a config folder of their own (hydra.searchpath). If it is a component "
                       f"of your own code, allow it by name: trusted_targets=[{target}]")


def _user_code_importable(targets: Iterable[str]) -> None:
    """When a target the user named is not the package's, make the folder ``python -m`` started in importable
    again (the package leaves it off the path: ``canonical_network/__init__.py``), at the end of ``sys.path``,
    where it shadows no installed module: the user's own code (``my_model.Net``) lives there."""
    import sys

    from canonical_network import USER_CODE_DIR_VARIABLE

    folder = os.environ.get(USER_CODE_DIR_VARIABLE)
    if folder and set(targets) - known_targets() and folder not in sys.path:
        sys.path.append(folder)


def check_buildable(config: Any, source: Any, trusted: Iterable[str] = ()) -> None:
    """Refuse ``config`` (read from ``source``) unless every node of it, resolved as ``hydra.utils.instantiate``
    resolves it, that builds something (a ``_target_``, or an instantiate key) builds one of the package's
    components or one the user trusts (``trusted``, :func:`user_trust`).

    Raises :class:`UntrustedConfig` naming ``source``, the first such key and its value.
    """
    allowed = known_targets() | user_trust(trusted)
    # what instantiate would see: a plain tree is resolved too (an interpolation such as ``${oc.create:...}``
    # can hold a ``_target_`` that only appears once resolved)
    if isinstance(config, (DictConfig, ListConfig)):
        plain = OmegaConf.to_container(config, resolve=True)
    else:
        plain = OmegaConf.to_container(OmegaConf.create(config), resolve=True) if isinstance(config, (dict, list)) \
            else config
    named = []
    for key, node in _walk(plain):
        if isinstance(node, dict) and ("_target_" in node or any(k in node for k in INSTANTIATE_KEYS)):
            _check_node(node, key, source, allowed)
            named.append(node["_target_"])
    _user_code_importable(named)


def build(config: Any, source: Any = "the config", trusted: Iterable[str] = (), **arguments: Any) -> Any:
    """``hydra.utils.instantiate(config, **arguments)`` once :func:`check_buildable` has passed ``config``
    against the package's components, ``trusted`` and the user's trust (:func:`user_trust`): the one place a
    config becomes objects. ``arguments`` are objects the calling code made (never read from a file)."""
    import hydra

    check_buildable(config, source, trusted)
    return hydra.utils.instantiate(config, **arguments)


def locate(target: Any, source: Any = "the config", trusted: Iterable[str] = ()) -> Any:
    """The object a configured ``_target_`` names (``hydra.utils.get_object``), once it is one of the package's
    components, of ``trusted`` or of the user's trust: importing the module it names runs that module."""
    from hydra.utils import get_object

    allowed = known_targets() | user_trust(trusted)
    if not isinstance(target, str) or target not in allowed:
        raise _refusal(source, "_target_", f"{target!r}", "not one of canonical_network's components nor one the "
                       f"user named (trusted_targets=[{target}])")
    _user_code_importable([target])
    return get_object(target)


# --- overrides read from a record ------------------------------------------------------------------------

#: Override keys a record's command line may not carry: Hydra's own settings (where it composes from, where it
#: writes, its launcher and callbacks) and the trust a user gives (never a record's to give).
_RECORD_REFUSED_KEYS = ("hydra", "trusted_targets")


def record_overrides(overrides: Any, source: Any) -> list[str]:
    """The overrides a record lists (``results.json``'s ``overrides``), when they may be replayed on a command
    line: plain ``key=value`` (``+key=value``, ``++key=value``, ``~key``) overrides of the package's config tree;
    else :class:`UntrustedConfig` naming ``source`` and the override.

    Refused: anything but a list of strings; a command-line flag (``--config-dir``, ``-m``...); Hydra's own keys
    and ``trusted_targets`` (:data:`_RECORD_REFUSED_KEYS`); a config-group choice that is not a file of that
    group in the package's configs (a path that leaves ``configs/``); a ``_target_`` or an instantiate key; an
    interpolation or a sweep in a value; a key that is not a dotted name.
    """
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from canonical_network.utils.config import CONFIG_DIR

    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise _refusal(source, "overrides", repr(overrides)[:80], "a record's overrides are a list of strings")
    accepted = []
    for override in overrides:
        def refuse(why: str, override: str = override) -> UntrustedConfig:
            return _refusal(source, "overrides", repr(override), why)

        if override.startswith("-"):
            raise refuse("a command-line flag is not an override; a record's overrides are key=value")
        if "${" in override:
            raise refuse("an interpolation computes its value when the config is used")
        try:
            (parsed,) = OverridesParser.create().parse_overrides([override])
        except Exception as error:
            raise refuse(f"not an override Hydra reads ({error})") from None
        key = parsed.key_or_group
        if parsed.package is not None or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
            raise refuse("the key is not a dotted name of the config")
        parts = key.split(".")
        if parts[0] in _RECORD_REFUSED_KEYS:
            raise refuse(f"{parts[0]}.* is the user's to set, never a record's")
        if any(part == "_target_" or part in INSTANTIATE_KEYS or part in COMPOSITION_KEYS for part in parts):
            raise refuse("a record may not choose what is built")
        if parsed.is_sweep_override():
            raise refuse("a record is one run: it holds no sweep")
        group = CONFIG_DIR / Path(*parts)
        if not parsed.is_delete() and group.is_dir():  # a config-group choice: one of the group's own files
            value = parsed.value()
            options = sorted(str(p.relative_to(group).with_suffix("")) for p in group.rglob("*.yaml"))
            if value is not None and (not isinstance(value, str) or value not in options):
                raise refuse(f"{key} chooses one of its group's files ({', '.join(options[:12])}"
                             f"{', ...' if len(options) > 12 else ''})")
        accepted.append(override)
    return accepted


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path``, with every symbolic link followed, lies in ``folder`` (also resolved)."""
    try:
        return Path(path).resolve().is_relative_to(Path(folder).resolve())
    except (OSError, RuntimeError):
        return False
