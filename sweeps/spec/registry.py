"""The names a spec field selects an implementation by, each owned by one :class:`Registry`.

A registry maps a name to where its implementation lives, ``"module.path:ClassName"``, and imports it only when
asked (:meth:`Registry.resolve`), as Hydra's ``_target_`` and torchtitan's ``register_train_spec`` do: the spec
validates a name against the registry without importing the search or Ray (it stays plain data, and the
torch-free service parses with it). A spec field takes the names through ``Annotated[str, OneOf(REGISTRY)]``:
an unknown name is refused listing the known ones, and the JSON schema lists them as an ``enum``.

* :data:`STRATEGY_REGISTRY`: ``search.strategy`` -> a ``sweeps.search.strategies.SearchStrategy`` subclass.
* :data:`LAUNCHER_REGISTRY`: ``resources.launcher`` -> a ``sweeps.launch.launcher.Launcher`` subclass.

Adding an implementation is its module and one :meth:`Registry.register` line (here, for the product's own).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from sweeps.errors import InvalidInput

__all__ = ["LAUNCHER_REGISTRY", "STRATEGY_REGISTRY", "OneOf", "Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Names of one spec field -> their implementations, imported on first use.

    A read-only mapping: iterating gives the names in registration order, ``registry[name]`` imports and returns
    the implementation (:meth:`resolve`).

    Args:
        field: the spec field the names are values of (``"search.strategy"``), for error messages.
    """

    def __init__(self, field: str) -> None:
        self.field = field
        self._targets: dict[str, str] = {}
        self._resolved: dict[str, T] = {}

    def register(self, name: str, target: str) -> None:
        """Make ``name`` a value of the field, implemented by ``target``, ``"module.path:Attribute"``.

        Raises:
            InvalidInput: ``name`` is already registered, or ``target`` is not ``"module:attribute"``.
        """
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise InvalidInput(f"{self.field}: {target!r} is not 'module.path:Attribute'")
        if name in self._targets:
            raise InvalidInput(f"{self.field}: {name!r} is already registered ({self._targets[name]})")
        self._targets[name] = target

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a no-op where it is not registered)."""
        self._targets.pop(name, None)
        self._resolved.pop(name, None)

    def target(self, name: str) -> str:
        """Where ``name``'s implementation lives, ``"module.path:Attribute"``.

        Raises:
            InvalidInput: ``name`` is not registered; the message lists the registered names.
        """
        if name not in self._targets:
            raise InvalidInput(f"{self.field}: {name!r} is not one of {sorted(self._targets)}")
        return self._targets[name]

    def resolve(self, name: str) -> T:
        """``name``'s implementation, imported on the first call.

        Raises:
            InvalidInput: ``name`` is not registered (the message lists the registered names).
            ImportError, AttributeError: its module or attribute does not exist (a broken registration).
        """
        target = self.target(name)
        if name not in self._resolved:
            module, _, attr = target.partition(":")
            self._resolved[name] = getattr(importlib.import_module(module), attr)
        return self._resolved[name]

    def __getitem__(self, name: str) -> T:
        if name not in self._targets:
            raise KeyError(name)
        return self.resolve(name)

    def __contains__(self, name: object) -> bool:
        return name in self._targets  # without importing it

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._targets))

    def __len__(self) -> int:
        return len(self._targets)


def _expected(names: tuple[str, ...]) -> str:
    """The names as pydantic's ``literal_error`` writes them: ``'a', 'b' or 'c'``."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True, eq=False)  # hashed by identity: the registry is a mutable mapping
class OneOf:
    """Pydantic metadata for ``Annotated[str, OneOf(registry)]``: a field whose value is one of ``registry``'s
    names at validation time (a name registered later is accepted from then on).

    Validation refuses anything else with pydantic's ``literal_error`` (as a ``Literal`` of the names would);
    the JSON schema is ``{"enum": [names], "type": "string"}``, the names as registered when it is built.
    """

    registry: Registry[Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        registry = self.registry

        def check(value: Any) -> str:
            if isinstance(value, str) and value in registry:
                return value
            expected = _expected(tuple(registry))
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})

        return core_schema.no_info_plain_validator_function(check)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"enum": list(self.registry), "type": "string"}


#: ``search.strategy``: the search strategies (``sweeps.search.strategies.SearchStrategy`` subclasses)
STRATEGY_REGISTRY: Registry[Any] = Registry("search.strategy")
STRATEGY_REGISTRY.register("independent", "sweeps.search.strategies.independent:IndependentStrategy")
STRATEGY_REGISTRY.register("transfer", "sweeps.search.strategies.transfer:TransferStrategy")

#: ``resources.launcher``: how a sweep's trials start (``sweeps.launch.launcher.Launcher`` subclasses)
LAUNCHER_REGISTRY: Registry[Any] = Registry("resources.launcher")
LAUNCHER_REGISTRY.register("trial_runners", "sweeps.launch.launcher:TrialRunnersLauncher")
LAUNCHER_REGISTRY.register("train_run_per_trial", "sweeps.launch.launcher:TrainRunPerTrialLauncher")
