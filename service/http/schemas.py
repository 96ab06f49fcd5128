"""Request models of the HTTP API, how a JSON body is read into one, and the responses of its
other endpoints (a search's answer is declared in service.outcome).

A JSON body is read by pydantic straight from the bytes into the request model (its own JSON
parser, one pass), where FastAPI's declared-body path runs json.loads, parses the Content-Type
through email.message, then validates the Python objects inside its dependency solver. On the
demo, this took 75-100 us off a text search at one client and parses a 512-dimensional
/search/embedding body in a third of the time (84 against 249 us). Errors are those FastAPI
gave: 415 for a body declared as another type, 400 for bytes that are not UTF-8, and the app's
422 for invalid JSON or fields."""

from typing import Annotated, Any, Literal, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from indexer.metadata_filter import FILTER_JSON_SCHEMA
from service.errors import UnsupportedMediaTypeError

Gallery = Literal["image", "text"]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _integral_float_to_int(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer; strict validation would not. true stays refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral_float_to_int)]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integral_float_to_int)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_integral_float_to_int)]
# Bounds on caller-supplied Gaussians: inside them every distance, score and uncertainty stays
# finite in float32 for any embedding dimension up to max_embedding_dim (tested per metric).
MU_LIMIT = 1e4
LOGVAR_LIMIT = 30.0
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3


def _bounded(name: str, limit: float) -> Any:
    """A finite float in [-limit, limit] whose error says why the bound exists."""

    def check(value: float) -> float:
        if abs(value) > limit:
            raise ValueError(
                f"every {name} value must lie in [-{limit:g}, {limit:g}]: beyond that, "
                "distances to the gallery overflow float32"
            )
        return value

    return Annotated[
        float,
        Field(allow_inf_nan=False, json_schema_extra={"minimum": -limit, "maximum": limit}),
        AfterValidator(check),
    ]


MuValue = _bounded("mu", MU_LIMIT)
LogvarValue = _bounded("logvar", LOGVAR_LIMIT)
FEATURE_LIMIT = 1e4  # a backbone vector's values; ImageNet and sentence features are far inside
FeatureValue = _bounded("features", FEATURE_LIMIT)


class SearchOptions(BaseModel):
    """Options shared by every search endpoint; limits beyond these bounds come from settings."""

    # strict: true is not 1 and "3" is not 3 in JSON (form fields are parsed from strings).
    model_config = ConfigDict(extra="forbid", strict=True)

    k: JsonInt = Field(10, ge=1, description="Number of results (at most the max_k setting).")
    # Any string here: which metrics a request may name depends on the loaded versions, and
    # Searcher.params refuses the others with that list (the served schema's enum gives it).
    metric: str | None = Field(
        None,
        description="Distance to rank with: one of GET /v1/config's `metrics` (those the "
        "loaded versions serve; any other is a 422 that lists them); default: the gallery's "
        "metric (/v1/config `default_metrics`).",
    )
    shortlist: PositiveInt | None = Field(
        None, description="Candidates re-ranked exactly; default max(10*k, 100); must be >= k."
    )
    mc_samples: NonNegativeInt | None = Field(
        None, description="MC-dropout draws for the uncertainty; 0 skips MI."
    )
    temperature: FiniteFloat | None = Field(
        None,
        ge=MIN_TEMPERATURE,
        le=MAX_TEMPERATURE,
        description="Retrieval posterior temperature T; default: calibrated value.",
    )
    reject_threshold: FiniteFloat | None = Field(
        None,
        description="Reject when the reject score (query.reject_score.name, chosen by "
        "calibration) exceeds this; default: the calibrated rule (its threshold, and for image "
        "queries the familiarity gate for images unlike the training images).",
    )
    return_embedding: bool = Field(False, description="Return the query's mu and logvar.")
    filter: Annotated[
        dict[str, Any] | None,
        WithJsonSchema({"anyOf": [FILTER_JSON_SCHEMA, {"type": "null"}]}),
    ] = Field(
        None,
        description="Only items whose metadata match, searched inside the index: "
        '{"field": value} (equality; on a list field such as labels, any element), '
        '{"field": {"in": [values]}}, {"field": {"gte"/"gt"/"lte"/"lt": number}}; several '
        "fields must all hold. Fields: id, or any field of the items' metadata (split, "
        "labels, or a source's own). The answer's `matched` counts the items that match.",
    )

    def options(self) -> dict[str, Any]:
        """The search options alone (not the query), by name: Searcher.params' arguments."""
        return {name: getattr(self, name) for name in SearchOptions.model_fields}


class TextSearchRequest(SearchOptions):
    """POST /search/text: a caption that searches the image gallery."""

    text: str = Field(min_length=1, description="The query caption.")


class ImageSearchRequest(SearchOptions):
    """POST /search/image (JSON form): a base64-encoded image that searches the caption gallery."""

    image_base64: str = Field(min_length=1, description="Image file bytes, standard base64.")


class EmbeddingSearchRequest(SearchOptions):
    """POST /search/embedding: either a Gaussian computed by the caller's own encoder (mu and
    logvar), or the vector of the model's own backbone (features), which the service's heads
    turn into a Gaussian with MC draws like any caption or image query."""

    # Each field may be left out, never null: the schema's oneOf says which go together.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": ["mu", "logvar"]}, {"required": ["features"]}]},
    )

    mu: list[MuValue] = Field(  # type: ignore[valid-type,assignment]
        None,
        min_length=1,
        description=f"Mean, length D of the index; |values| <= {MU_LIMIT:g}. With logvar.",
    )
    logvar: list[LogvarValue] = Field(  # type: ignore[valid-type,assignment]
        None, min_length=1, description=f"ln sigma^2, length D; |values| <= {LOGVAR_LIMIT:g}."
    )
    features: list[FeatureValue] = Field(  # type: ignore[valid-type,assignment]
        None,
        min_length=1,
        description="Instead of mu and logvar: the backbone vector of a caption (to search the "
        "image gallery) or of an image (to search the caption gallery), for a model on "
        "pretrained backbones; its width is the backbone's (the served OpenAPI schema says it).",
    )
    gallery: Gallery = Field(description="Which gallery to search.")

    @model_validator(mode="after")
    def _one_query(self) -> "EmbeddingSearchRequest":
        gaussian = self.mu is not None or self.logvar is not None
        if gaussian == (self.features is not None):
            raise ValueError("send either mu and logvar, or features")
        if gaussian and (self.mu is None or self.logvar is None):
            raise ValueError("mu and logvar go together")
        return self


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    detail: str = Field(description="What went wrong and how to fix the request.")
    error: str = Field(description="Machine-readable error code.")


class IndexInfo(BaseModel):
    """A loaded index version."""

    modality: Gallery
    version: str
    count: int
    dim: int
    metrics: list[str]
    uncalibrated_metrics: list[str] = Field(
        description="Metrics served without a rejection threshold (never reject)."
    )
    calibration_warning: str | None = Field(
        description="Why rejection is off for some metrics; null when all are calibrated."
    )
    manifest: dict[str, Any]


class IndexesResponse(BaseModel):
    """GET /v1/indexes."""

    indexes: list[IndexInfo]
    model: str


class ReloadResponse(BaseModel):
    """POST /admin/reload."""

    active: dict[str, str | None]


class ItemWriteRequest(BaseModel):
    """POST /v1/items: add an item to a gallery, or replace the item of the same id. Send
    exactly one of text (a caption, for the caption gallery), image_base64 (a picture, for
    the image gallery), mu and logvar, or features (a backbone vector); the last two name
    their gallery."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["text"]},
                {"required": ["image_base64"]},
                {"required": ["mu", "logvar", "gallery"]},
                {"required": ["features", "gallery"]},
            ]
        },
    )

    id: str = Field(min_length=1, max_length=512, description="The item's id in its gallery.")
    gallery: Literal["image", "text"] = Field(  # type: ignore[assignment]
        None, description="The gallery to add to; implied by text (text) and image_base64 (image)."
    )
    text: str = Field(None, min_length=1, description="A caption.")  # type: ignore[assignment]
    image_base64: str = Field(  # type: ignore[assignment]
        None, min_length=1, description="A picture's file bytes, standard base64."
    )
    mu: list[MuValue] = Field(None, min_length=1)  # type: ignore[valid-type,assignment]
    logvar: list[LogvarValue] = Field(None, min_length=1)  # type: ignore[valid-type,assignment]
    features: list[FeatureValue] = Field(None, min_length=1)  # type: ignore[valid-type,assignment]
    uri: str = Field(  # type: ignore[assignment]
        None,
        max_length=4096,
        description="Where the picture's file is, relative to the gallery's image root (what "
        "GET /v1/items/{id}/image serves); the service does not keep uploaded files.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="The item's fields (what filters and results show)."
    )


class ItemWriteResponse(BaseModel):
    """POST /v1/items and DELETE /v1/items/{id}: the write is durable and searched."""

    id: str
    gallery: str
    index_version: str = Field(description="The version whose log took the write.")
    live_items: int = Field(description="Items the gallery holds now.")


class CompactResponse(BaseModel):
    """POST /admin/compact."""

    gallery: str
    old_version: str
    new_version: str | None = Field(description="None: no write to fold in.")
    items: int
    folded_writes: int
    copied_writes: int = Field(description="Writes logged during the build, copied over.")


def _error_response(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: _error_response("The service is starting, or overloaded; retry later."),
}
SEARCH_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error_response("The body is not valid UTF-8, or cannot be parsed at all."),
    408: _error_response("The body did not arrive within request_body_timeout_s."),
    413: _error_response("Body or image over the byte or pixel limit."),
    415: _error_response("Content type not accepted, or the file is not an image."),
    422: _error_response(
        "Invalid parameters, e.g. shortlist < k or an embedding of the wrong dimension; the "
        "message names the field and the fix."
    ),
    503: _error_response("No index loaded for the gallery, or overloaded; retry later."),
}
AUTH_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _error_response("Missing or invalid API key."),
}
ADMIN_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_ERROR_RESPONSES,
    429: _error_response("Too many failed authentications from this client; see Retry-After."),
}


class ActiveStores(BaseModel):
    """What each store of the active version says for one gallery."""

    file: str | None = Field(description="The ACTIVE file's version (generation), or null.")
    redis: str | None = Field(
        description="Redis's version (generation); null when unset, unreachable or unused."
    )
    disagreement: str | None = Field(
        description="Why the two differ (readers follow the higher generation), or null."
    )


class ReadinessResponse(BaseModel):
    """GET /readyz."""

    ready: bool
    versions: dict[str, str | None] = Field(description="Version served per gallery.")
    detail: str
    active: dict[str, ActiveStores] = Field(
        default_factory=dict, description="The active-version stores per gallery."
    )


# Reading a JSON body into a request model

ModelT = TypeVar("ModelT", bound=BaseModel)

_COMPONENTS = "#/components/schemas/{model}"
_BODY_MODELS: dict[str, type[BaseModel]] = {}


async def read_json_request(request: Request, model: type[ModelT]) -> ModelT:
    """The request's body as `model`; a missing Content-Type counts as JSON."""
    content_type = request.headers.get("content-type")
    if content_type is not None and not _is_json(content_type):
        raise UnsupportedMediaTypeError(
            f"Content-Type {content_type.split(';')[0]!r} is not accepted here; "
            "send the request body as application/json"
        )
    body = await request.body()
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HTTPException(400, "the request body is not valid UTF-8") from error
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise RequestValidationError(_in_body(error)) from None


def json_body_schema(model: type[BaseModel]) -> dict:
    """OpenAPI `requestBody` of a route that reads its body with read_json_request: a reference
    to the model's schema, which add_body_schemas puts among the components (FastAPI adds only
    the bodies it parses itself)."""
    _BODY_MODELS[model.__name__] = model
    reference = {"$ref": _COMPONENTS.format(model=model.__name__)}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}
    }


def add_body_schemas(openapi: dict) -> None:
    """Put the schemas of the bodies named by json_body_schema into an OpenAPI document."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, model in _BODY_MODELS.items():
        schema = model.model_json_schema(ref_template=_COMPONENTS)
        components.update(schema.pop("$defs", {}))
        components[name] = schema


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def _in_body(error: ValidationError) -> list[dict]:
    """pydantic's errors located under "body", as FastAPI reports a declared body's."""
    errors = []
    for item in error.errors(include_url=False, include_input=False):
        if item["type"] == "json_invalid":
            item = {**item, "msg": f"JSON decode error: {item['msg']}"}
        errors.append({**item, "loc": ("body", *item["loc"])})
    return errors
