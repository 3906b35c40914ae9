"""The OpenAPI document: the sweep spec's JSON schema as the request body, links from a submission
to the other operations, served at ``/openapi.json`` behind the token."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from service.deps import require_token
from sweeps.spec import SweepSpec

__all__ = ["install_openapi"]

#: The operations the id a submission returns addresses: ``(link name, operationId)``.
_LINKED_OPERATIONS = (
    ("GetSweep", "get_sweep_v1_sweeps__sweep_id__get"),
    ("StopSweep", "stop_sweep_v1_sweeps__sweep_id__delete"),
    ("SweepLogs", "sweep_logs_v1_sweeps__sweep_id__logs_get"),
    ("SweepReport", "sweep_report_v1_sweeps__sweep_id__report_get"),
)


def _schema(app: FastAPI) -> dict[str, Any]:
    # one schema per model for requests and responses: a response model's serialization-mode schema would be
    # empty for the cbs.json records, whose serializer (dump the keys given) returns a plain mapping
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        separate_input_output_schemas=False,
    )
    spec_schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, sub in spec_schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components["SweepSpec"] = spec_schema
    # OpenAPI links: the id a submission returns addresses the other operations.
    created = schema["paths"]["/v1/sweeps"]["post"]["responses"]["201"]
    created["links"] = {
        name: {"operationId": op_id, "parameters": {"sweep_id": "$response.body#/id"}}
        for name, op_id in _LINKED_OPERATIONS
    }
    return schema


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` by the document above (built once) and serve it at ``/openapi.json``
    behind the token. Call after every route is added."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    def openapi_json() -> JSONResponse:
        """The OpenAPI schema (behind the token, like every route but /healthz)."""
        return JSONResponse(app.openapi())

    def custom_openapi() -> dict[str, Any]:
        if not app.openapi_schema:
            app.openapi_schema = _schema(app)
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
